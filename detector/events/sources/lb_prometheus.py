"""Load-balancer request counters (Prometheus exposition lines or adapter samples) -> LB_RESPONSE.

Counters read, one signal per sample, all status classes (the correlator needs the healthy
count beside the errors and turns successive samples of one ``series`` into counts):

- ingress-nginx ``nginx_ingress_controller_requests{namespace, service, status, ...}``;
- Istio ``istio_requests_total{destination_service_name, destination_service_namespace,
  response_code, reporter, ...}``; only ``reporter="source"`` samples (or none) are read: each
  request is counted by both proxies, and only the caller's side sees the 503 of a dead pod;
- Envoy ``envoy_cluster_upstream_rq_xx{envoy_response_code_class="5", envoy_cluster_name}``
  (status 503 stands for the class, with ``status_class="5xx"``; 2 -> 200, 4 -> 400 ...) and
  ``envoy_cluster_upstream_rq{envoy_response_code="503", ...}``; Istio's own Envoy stats name
  the labels ``cluster_name`` / ``response_code_class`` / ``response_code``.

Upstreams follow ``lb_common``: ``<namespace>-<service>-0`` for the first two (they carry no
port), the cluster's mapping for Envoy. Sources:
https://prometheus.io/docs/instrumenting/exposition_formats/ ,
https://kubernetes.github.io/ingress-nginx/user-guide/monitoring/ ,
https://istio.io/latest/docs/reference/config/metrics/ ,
https://www.envoyproxy.io/docs/envoy/latest/configuration/upstream/cluster_manager/cluster_stats .
"""

from __future__ import annotations

import math
from typing import Any

from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.lb_common import (
    MAX_TEXT_CHARS,
    service_upstream,
    upstream_of_cluster,
)
from detector.events.sources.timeparse import first_label

NGINX = "nginx_ingress_controller_requests"
ISTIO = "istio_requests_total"
ENVOY_CLASS = "envoy_cluster_upstream_rq_xx"
ENVOY_CODE = "envoy_cluster_upstream_rq"
LB_COUNTERS = frozenset({NGINX, ISTIO, ENVOY_CLASS, ENVOY_CODE})

_CLASS_STATUS = {"1": 100, "2": 200, "3": 300, "4": 400, "5": 503}
_POD_KEYS = ("pod", "pod_name", "kubernetes_pod_name")
_NAMESPACE_KEYS = ("namespace", "kubernetes_namespace")


def signal_from_sample(
    name: str,
    labels: dict[str, str],
    value: float,
    time: float,
    source: SourcePos,
    text: str,
) -> Signal | None:
    """Map one LB counter sample to LB_RESPONSE; None for NaN, other reporters, unknown codes.

    attrs: status, upstream, counter_total (the cumulative value), series (``name{k=v,...}``,
    labels sorted), metric; status_class for ``_rq_xx``; response_flags (Istio); sidecar for an
    Envoy inbound cluster, whose pod and namespace then come from the target labels.
    """
    if not math.isfinite(value) or value < 0:
        return None
    mapped = _status_and_upstream(name, labels)
    if mapped is None:
        return None
    status, upstream, extra = mapped
    attrs: dict[str, Any] = {"status": status, "upstream": upstream, **extra}
    attrs["counter_total"] = value
    attrs["series"] = series_id(name, labels)
    attrs["metric"] = name
    pod = namespace = None
    if attrs.get("sidecar"):
        pod, namespace = first_label(labels, _POD_KEYS), first_label(labels, _NAMESPACE_KEYS)
        if pod is None:
            attrs.pop("sidecar")
    return Signal(
        kind=SignalKind.LB_RESPONSE,
        time=time,
        source=source,
        namespace=namespace,
        pod=pod,
        attrs=attrs,
        text=text[:MAX_TEXT_CHARS],
    )


def series_id(name: str, labels: dict[str, str]) -> str:
    """Return a stable identity of a labelled series: ``name{a=1,b=2}`` with sorted labels."""
    pairs = ",".join(f"{k}={labels[k]}" for k in sorted(labels) if k != "__name__")
    return f"{name}{{{pairs}}}"


def _status_and_upstream(
    name: str, labels: dict[str, str]
) -> tuple[int, str | None, dict[str, Any]] | None:
    """Return (status, upstream, extra attrs) of a sample, or None when it is not counted."""
    if name == NGINX:
        status = _code(labels.get("status"))
        upstream = _service(labels.get("namespace"), labels.get("service"))
        return (status, upstream, {}) if status is not None else None
    if name == ISTIO:
        return _istio(labels)
    return _envoy(name, labels)


def _istio(labels: dict[str, str]) -> tuple[int, str | None, dict[str, Any]] | None:
    if labels.get("reporter", "source") != "source":
        return None
    status = _code(labels.get("response_code"))
    if status is None:
        return None
    upstream = _service(
        labels.get("destination_service_namespace"), labels.get("destination_service_name")
    )
    flags = labels.get("response_flags")
    return status, upstream, ({"response_flags": flags} if flags and flags != "-" else {})


def _envoy(name: str, labels: dict[str, str]) -> tuple[int, str | None, dict[str, Any]] | None:
    upstream, sidecar = upstream_of_cluster(
        labels.get("envoy_cluster_name") or labels.get("cluster_name")
    )
    extra: dict[str, Any] = {"sidecar": True} if sidecar else {}
    if name == ENVOY_CODE:
        status = _code(labels.get("envoy_response_code") or labels.get("response_code"))
        return (status, upstream, extra) if status is not None else None
    klass = labels.get("envoy_response_code_class") or labels.get("response_code_class") or ""
    status = _CLASS_STATUS.get(klass[:1]) if klass[1:] in ("", "xx") else None
    if status is None:
        return None
    extra["status_class"] = f"{klass[:1]}xx"
    return status, upstream, extra


def _service(namespace: str | None, service: str | None) -> str | None:
    if not namespace or not service or "unknown" in (namespace, service):
        return None
    return service_upstream(namespace, service, None)


def _code(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) == 3 else None
