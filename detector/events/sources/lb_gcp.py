"""Google Cloud HTTP(S) load balancer request-log entries (Cloud Logging JSON) -> LB_RESPONSE.

An entry as exported (``gcloud logging read --format=json``, a log sink to Pub/Sub or Kafka)::

    {"httpRequest": {"status": 502, "latency": "0.012s", "serverIp": "10.8.0.12", ...},
     "jsonPayload": {"@type": "type.googleapis.com/google.cloud.loadbalancing.type.
                     LoadBalancerLogEntry", "statusDetails": "failed_to_connect_to_backend"},
     "resource": {"type": "http_load_balancer",
                  "labels": {"backend_service_name": "k8s1-18cca515-llm-vllm-8000-9719b3d2"}},
     "timestamp": "2021-09-10T22:28:32.701888Z"}

Client libraries write the same entry in snake_case (``http_request``, ``json_payload``,
``server_ip``). Sources:
https://cloud.google.com/load-balancing/docs/https/https-logging-monitoring ,
https://cloud.google.com/logging/docs/reference/v2/rest/v2/LogEntry .
"""

from __future__ import annotations

from typing import Any

from detector.errors import ParseError
from detector.events.sources.lb_common import LbParse, lb_attrs, upstream_of_gcp_backend
from detector.events.sources.timeparse import parse_time

_LB_ENTRY_TYPE = "type.googleapis.com/google.cloud.loadbalancing.type.LoadBalancerLogEntry"
_LB_RESOURCES = frozenset({"http_load_balancer", "internal_http_lb_rule", "l7_lb_rule"})
_FROM_BACKEND = "response_sent_by_backend"
_TIME_KEYS = ("timestamp", "receiveTimestamp", "receive_timestamp")


def parse_entry(obj: dict[str, Any]) -> LbParse | None:
    """Parse a decoded load-balancer log entry; None if it is not one.

    attrs: status (``httpRequest.status``; 0 when the LB sent no response), status_details
    (``jsonPayload.statusDetails``), upstream (``resource.labels.backend_service_name``, GKE NEG
    names mapped to ``<namespace>-<service>-<port>``), upstream_addr (``serverIp``),
    upstream_status (the status when ``response_sent_by_backend``), request_time_s (latency),
    client (``remoteIp``).
    Raises ``ParseError("missing_timestamp")`` without a time, ``"bad_value"`` for a status that
    is not a number. Format: https://cloud.google.com/load-balancing/docs/https/https-logging-monitoring
    """
    http = _dict(obj, "httpRequest", "http_request")
    payload = _dict(obj, "jsonPayload", "json_payload")
    resource = _dict(obj, "resource")
    if http is None or not _is_lb_entry(payload, resource):
        return None
    status = _status(http.get("status"))
    details = payload.get("statusDetails") if payload is not None else None
    labels = _dict(resource, "labels") if resource is not None else None
    backend = labels.get("backend_service_name") if labels is not None else None
    server_ip = http.get("serverIp") or http.get("server_ip")
    remote_ip = http.get("remoteIp") or http.get("remote_ip")
    attrs = lb_attrs(
        status,
        upstream=upstream_of_gcp_backend(backend if isinstance(backend, str) else None),
        upstream_status=status if details == _FROM_BACKEND else None,
        upstream_addr=server_ip if isinstance(server_ip, str) and server_ip else None,
        request_time_s=_latency_s(http.get("latency")),
        client=remote_ip if isinstance(remote_ip, str) and remote_ip else None,
    )
    if isinstance(details, str) and details:
        attrs["status_details"] = details
    return LbParse(attrs, _stamp(obj), parse_time)


def _is_lb_entry(payload: dict[str, Any] | None, resource: dict[str, Any] | None) -> bool:
    if payload is not None and payload.get("@type") == _LB_ENTRY_TYPE:
        return True
    kind = resource.get("type") if resource is not None else None
    return isinstance(kind, str) and kind in _LB_RESOURCES


def _dict(obj: dict[str, Any], *keys: str) -> dict[str, Any] | None:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, dict):
            return value
    return None


def _status(value: Any) -> int:
    if value is None:
        return 0  # e.g. client_disconnected_before_any_response
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1000:
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 3:
        return int(value)
    raise ParseError("bad_value", f"httpRequest.status is not an HTTP status: {str(value)[:40]!r}")


def _latency_s(value: Any) -> float | None:
    """Read a protobuf Duration string ("0.001566s")."""
    if not isinstance(value, str) or not value.endswith("s"):
        return None
    try:
        seconds = float(value[:-1])
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _stamp(obj: dict[str, Any]) -> str:
    for key in _TIME_KEYS:
        value = obj.get(key)
        if value is not None:
            return str(value)
    raise ParseError("missing_timestamp", "load-balancer log entry without timestamp")
