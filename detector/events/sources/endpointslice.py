"""Kubernetes discovery.k8s.io/v1 EndpointSlice objects (``kubectl get endpointslice -o json``,
watch events) -> POD_ADDRESS signals, one per endpoint whose ``targetRef`` is a Pod.

An endpoint names its pod (``targetRef``: kind, name, namespace) and its ``addresses``; the
first address is the pod's IP (the API doc: consumers "must" use the first one). The signal
carries it as ``pod_ip``, the attribute the resolver learns pod IPs from, so a load-balancer
line whose upstream address is that IP is attributed to the pod even when no pod object was
seen (a Running pod that is not Ready yields no pod signal, yet it is listed here with
``conditions.ready: false``). FQDN slices name no IPs and yield nothing.
Source: https://kubernetes.io/docs/reference/kubernetes-api/service-resources/endpoint-slice-v1/
and https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/
"""

from __future__ import annotations

from typing import Any

from detector.errors import ParseError
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.timeparse import parse_time, str_or_none

# Set by the EndpointSlice controller: when the change that this slice reflects happened.
# https://kubernetes.io/docs/reference/labels-annotations-taints/#endpoints-kubernetes-io-last-change-trigger-time
_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
_SERVICE_LABEL = "kubernetes.io/service-name"


def signals_from_endpointslice(
    obj: dict[str, Any], source: SourcePos, default_time: float | None = None
) -> list[Signal]:
    """Return one POD_ADDRESS signal per Pod endpoint with an address.

    Time: the slice's ``last-change-trigger-time`` annotation, else ``default_time`` (the
    shipper's), else ``metadata.creationTimestamp``. Attrs: pod_ip (the first address), ready
    (``conditions.ready``; None when unset), service. Raises ``ParseError("missing_field")``
    when the slice has pod endpoints but no time at all, ``"bad_timestamp"`` for an
    unparseable one.
    """
    if obj.get("addressType") == "FQDN":
        return []
    meta = _obj(obj.get("metadata"))
    slice_ns = str_or_none(meta.get("namespace"))
    service = str_or_none(_obj(meta.get("labels")).get(_SERVICE_LABEL))
    found: list[tuple[str, str | None, str, Any]] = []
    for ep in _list(obj.get("endpoints")):
        ref = _obj(_obj(ep).get("targetRef"))
        name = str_or_none(ref.get("name"))
        addresses = [a for a in _list(_obj(ep).get("addresses")) if isinstance(a, str) and a]
        if ref.get("kind") != "Pod" or not name or not addresses:
            continue
        ready = _obj(_obj(ep).get("conditions")).get("ready")
        namespace = str_or_none(ref.get("namespace")) or slice_ns
        found.append((name, namespace, addresses[0], ready if isinstance(ready, bool) else None))
    if not found:
        return []
    time = _slice_time(meta, default_time)
    return [
        Signal(
            kind=SignalKind.POD_ADDRESS,
            time=time,
            source=source,
            namespace=namespace,
            pod=name,
            attrs={"pod_ip": ip, "ready": ready, "service": service},
            text=f"endpoint {ip} -> pod {namespace}/{name}",
        )
        for name, namespace, ip, ready in found
    ]


def _slice_time(meta: dict[str, Any], default_time: float | None) -> float:
    trigger = _obj(meta.get("annotations")).get(_TRIGGER_TIME)
    if trigger is not None:
        return parse_time(trigger)
    if default_time is not None:
        return default_time
    created = meta.get("creationTimestamp")
    if created is None:
        raise ParseError("missing_field", "EndpointSlice has no time")
    return parse_time(created)


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
