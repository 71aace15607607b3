"""Pieces shared by the load-balancer parsers: the attrs shape, parse results, upstream names.

Upstream naming rules (all end in the ingress-nginx convention ``<namespace>-<service>-<port>``
that ``detector.correlate.identity`` splits, or stay as the load balancer's own name, which the
YAML mapping can name):

- Istio/Envoy ``outbound|<port>|<subset>|<service>.<namespace>.svc.<domain>`` ->
  ``<namespace>-<service>-<port>``; ``inbound|...`` is the serving pod's own sidecar
  (``sidecar=True``, no upstream); Passthrough/BlackHole clusters name no backend;
- GKE NEG backend services ``k8s1-<hash>-<namespace>-<service>-<port>-<hash>`` and GKE Gateway
  ``gkegw1-<hash>-<namespace>-<service>-<port>-<hash>`` -> ``<namespace>-<service>-<port>``;
- HAProxy Kubernetes ingress backends ``<namespace>_<service>_<port>`` ->
  ``<namespace>-<service>-<port>``;
- a counter that names a service but no port uses port ``0`` (unknown): the resolver reads the
  namespace and service and ignores the port.

Sources: https://istio.io/latest/docs/ops/diagnostic-tools/proxy-cmd/ (cluster names),
https://cloud.google.com/kubernetes-engine/docs/concepts/ingress (NEG backend services).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from detector.errors import ParseError
from detector.events.model import Signal, SignalKind, SourcePos

MAX_TEXT_CHARS = 2048
UNKNOWN_PORT = "0"  # the port slot of an upstream name built from a counter without a port

_CLUSTER = re.compile(r"(outbound|inbound)(?:\||_\.)(\d*)(?:\||_\.)([^|]*?)(?:\||_\.)(.*)")
_K8S_HOST = re.compile(r"([^.]+)\.([^.]+)\.svc(?:\.|$)")
_NO_BACKEND_CLUSTERS = frozenset({"PassthroughCluster", "BlackHoleCluster", "-", ""})
_GKE_BACKEND = re.compile(r"(?:k8s1-[0-9a-f]{8}|gkegw1-[0-9a-z]{4})-(.+-[0-9a-z]+)-[0-9a-z]{8,12}")
_HAPROXY_K8S_BACKEND = re.compile(r"([a-z0-9-]+)_([a-z0-9-]+)_([a-z0-9-]+)")


class LbParse(NamedTuple):
    """A recognized line: its LB_RESPONSE attrs and, for bare lines, how to read its time."""

    attrs: dict[str, Any]
    stamp: str | None = None  # the line's own time field, None when it has none
    read_time: Callable[[str], float] | None = None  # turns ``stamp`` into Unix seconds


def lb_attrs(
    status: int,
    *,
    upstream: str | None = None,
    upstream_status: int | None = None,
    upstream_addr: str | None = None,
    request_time_s: float | None = None,
    client: str | None = None,
) -> dict[str, Any]:
    """Return the LB_RESPONSE attrs every access line carries (``count`` is 1).

    ``client`` is the address the request came from, without its port (None: not logged);
    the correlator counts distinct clients per window (a per-client limit's reach).
    """
    return {
        "status": status,
        "upstream_status": upstream_status,
        "upstream": upstream,
        "upstream_addr": upstream_addr,
        "count": 1,
        "request_time_s": request_time_s,
        "client": client,
    }


def client_host(address: str | None) -> str | None:
    """Return the host of a client address logged with its port; None for ``-`` or nothing.

    ``203.0.113.9:51234`` -> ``203.0.113.9``; ``[2001:db8::1]:443`` -> ``2001:db8::1``;
    HAProxy's ``2001:db8::1:51234`` (no brackets: the port is the last field) ->
    ``2001:db8::1``. Only for formats that always log the port (HAProxy ``%ci:%cp``, ALB
    ``client:port``, Envoy ``%DOWNSTREAM_REMOTE_ADDRESS%``): a bare IPv6 address would lose
    its last group.
    """
    if not address or address == "-":
        return None
    if address[0] == "[":
        end = address.find("]")
        return address[1:end] if end > 1 else None
    host, colon, port = address.rpartition(":")
    return host if colon and host and port.isdigit() else address


def first_forwarded(header: str | None) -> str | None:
    """Return the first (client) address of an X-Forwarded-For value; None for ``-``/empty."""
    if not header or header == "-":
        return None
    first = header.split(",", 1)[0].strip()
    return first or None


def raw_signal(
    parsed: LbParse, source: SourcePos, text: str, default_time: float | None, what: str
) -> Signal:
    """Return the signal of a bare line, timed by its own field, else by ``default_time``.

    Raises ``ParseError("missing_timestamp")`` when there is neither, ``"bad_timestamp"`` when
    the line's time field cannot be read.
    """
    if parsed.stamp is not None and parsed.read_time is not None:
        time = parsed.read_time(parsed.stamp)
    elif default_time is not None:
        time = default_time
    else:
        raise ParseError("missing_timestamp", f"{what} line without a time and no default time")
    return Signal(
        kind=SignalKind.LB_RESPONSE,
        time=time,
        source=source,
        attrs=parsed.attrs,
        text=text[:MAX_TEXT_CHARS],
    )


def service_upstream(namespace: str, service: str, port: str | None) -> str:
    """Return ``<namespace>-<service>-<port>`` (port ``0`` when unknown)."""
    return f"{namespace}-{service}-{port or UNKNOWN_PORT}"


def upstream_of_cluster(cluster: str | None) -> tuple[str | None, bool]:
    """Map an Envoy cluster name to ``(upstream, sidecar)``.

    ``outbound|8000||vllm.llm.svc.cluster.local`` -> ``("llm-vllm-8000", False)``;
    ``inbound|8000||`` and ``InboundPassthroughCluster*`` -> ``(None, True)``; Passthrough and
    BlackHole -> ``(None, False)``; any other name (Envoy Gateway ``httproute/...``, a
    ServiceEntry host) is returned as is.
    """
    if cluster is None or cluster in _NO_BACKEND_CLUSTERS:
        return None, False
    if cluster.startswith("InboundPassthroughCluster"):
        return None, True
    m = _CLUSTER.fullmatch(cluster)
    if m is None:
        return cluster, False
    if m.group(1) == "inbound":
        return None, True
    host = _K8S_HOST.match(m.group(4))
    if host is None or not m.group(2):
        return cluster, False
    return service_upstream(host.group(2), host.group(1), m.group(2)), False


def upstream_of_gcp_backend(name: str | None) -> str | None:
    """Map a GCP backend service name to an upstream (GKE NEG names to the convention)."""
    if not name:
        return None
    m = _GKE_BACKEND.fullmatch(name)
    return m.group(1) if m else name


def upstream_of_haproxy_backend(backend: str) -> str:
    """Map an HAProxy backend name (``ns_svc_port`` of Kubernetes ingresses) to an upstream."""
    m = _HAPROXY_K8S_BACKEND.fullmatch(backend)
    return service_upstream(m.group(1), m.group(2), m.group(3)) if m else backend


def number_or_none(token: str) -> float | None:
    """Read a non-negative number field ("0.003", "+50001"); None for "-", "-1" or junk."""
    try:
        value = float(token)
    except ValueError:
        return None
    return value if value >= 0 else None
