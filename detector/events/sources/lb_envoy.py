"""Envoy and Istio access logs (default text formats and JSON) -> LB_RESPONSE attrs.

Envoy's default format::

    [%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%"
    %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION%
    %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%"
    "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"

Istio's default inserts ``%RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS%
"%UPSTREAM_TRANSPORT_FAILURE_REASON%"`` (1.9+; 1.5-1.8 had a quoted mixer status instead) before
the byte counts and appends ``%UPSTREAM_CLUSTER% %UPSTREAM_LOCAL_ADDRESS%
%DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%``.
The parser anchors on the request and status at the head, then finds the three byte/duration
numbers, so every variant reads the same. JSON logs use the snake_case keys of Istio and Envoy
Gateway (``response_code``, ``response_flags``, ``upstream_cluster``, ``start_time``) or
camelCase ones; values may be strings. Response code 0 means no HTTP response (TCP, or the
client left). Sources:
https://www.envoyproxy.io/docs/envoy/latest/configuration/observability/access_log/usage ,
https://istio.io/latest/docs/tasks/observability/logs/access-log/ .
"""

from __future__ import annotations

import json
import re
from typing import Any

from detector.errors import ParseError
from detector.events.sources.lb_common import (
    LbParse,
    client_host,
    first_forwarded,
    lb_attrs,
    upstream_of_cluster,
)
from detector.events.sources.timeparse import parse_iso8601, parse_time

_FLAGS = r"(?:[A-Z][A-Za-z]{1,40}(?:,[A-Z][A-Za-z]{1,40})*|-)"
_HEAD = re.compile(
    r'(?:\[(\d{4}-[^\]]{6,40})\] )?"(?:[A-Z]+|-) \S+ \S+" (0|\d{3}) (' + _FLAGS + r")(?: (.*))?"
)
# A custom format that starts %RESPONSE_CODE% %RESPONSE_CODE_DETAILS% %RESPONSE_FLAGS%.
_CODE_DETAILS_FLAGS = re.compile(
    r"(\d{3}) ([a-z]+_[a-z_]*(?:\{[^}]*\})?) ([A-Z]{2,5}(?:,[A-Z]{2,5})*|-)(?: |$)"
)
_TOKEN = re.compile(r'"[^"]*"|\S+')
_CLUSTER_TOKEN = re.compile(r"(?:outbound|inbound)\|\d*\|.*|\w*Passthrough\w*|BlackHoleCluster")

_CODE_KEYS = ("response_code", "responseCode")
_FLAGS_KEYS = ("response_flags", "responseFlags")
_CLUSTER_KEYS = ("upstream_cluster", "upstreamCluster")
_HOST_KEYS = ("upstream_host", "upstreamHost")
_DETAILS_KEYS = ("response_code_details", "responseCodeDetails")
_DURATION_KEYS = ("duration",)
_FORWARDED_KEYS = ("x_forwarded_for", "x-forwarded-for", "xForwardedFor")
_REMOTE_KEYS = ("downstream_remote_address", "downstreamRemoteAddress")
TIME_KEYS = ("start_time", "startTime", "timestamp", "@timestamp")


def parse_text(text: str) -> LbParse | None:
    """Parse an Envoy/Istio text access line; None if it is not one.

    attrs: status, response_flags, response_code_details, upstream (see
    ``lb_common.upstream_of_cluster``), upstream_status (the status when the details say
    ``via_upstream``), upstream_addr (``%UPSTREAM_HOST%``), request_time_s (``%DURATION%``),
    sidecar (an inbound cluster: the serving pod's own proxy), rate_limited (flag ``RL`` or
    ``*rate_limited`` details), client (the first ``X-Forwarded-For`` address, else the host of
    Istio's ``%DOWNSTREAM_REMOTE_ADDRESS%``; None on a sidecar's line, whose peer is a proxy).
    Format:
    https://www.envoyproxy.io/docs/envoy/latest/configuration/observability/access_log/usage
    """
    m = _HEAD.match(text)
    if m is None:
        return None
    details, host, duration_s, cluster, client = _tail_fields(m.group(4) or "")
    attrs = _attrs(int(m.group(2)), m.group(3), details, cluster, host, duration_s, client)
    return LbParse(attrs, m.group(1), parse_iso8601)


def parse_fragment(text: str) -> LbParse | None:
    """Parse a custom format led by ``%RESPONSE_CODE% %RESPONSE_CODE_DETAILS% %RESPONSE_FLAGS%``."""
    m = _CODE_DETAILS_FLAGS.match(text)
    if m is None:
        return None
    return LbParse(_attrs(int(m.group(1)), m.group(3), m.group(2), None, None, None))


def parse_json_line(text: str) -> LbParse | None:
    """Parse an Envoy JSON access-log line; None if it is not one (cheap substring test first)."""
    if "esponse_code" not in text and "esponseCode" not in text:
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return parse_json(obj) if isinstance(obj, dict) else None


def parse_json(obj: dict[str, Any]) -> LbParse | None:
    """Parse a decoded Envoy JSON access log; None unless it has a response code and flags or
    an upstream cluster.

    Raises ``ParseError("bad_value")`` for a response code that is not a number. The time field
    (``start_time`` ...) is read by ``read_time``. Format:
    https://www.envoyproxy.io/docs/envoy/latest/configuration/observability/access_log/usage#format-dictionaries
    """
    code = _first(obj, _CODE_KEYS)
    flags = _first(obj, _FLAGS_KEYS)
    cluster = _first(obj, _CLUSTER_KEYS)
    if code is None or (flags is None and cluster is None):
        return None
    status = _int_field(code, "response_code")
    duration = _number(_first(obj, _DURATION_KEYS))
    client = first_forwarded(_str(_first(obj, _FORWARDED_KEYS)))
    attrs = _attrs(
        status,
        _str(flags) or "-",
        _str(_first(obj, _DETAILS_KEYS)),
        _str(cluster),
        _str(_first(obj, _HOST_KEYS)),
        duration / 1000 if duration is not None else None,
        client or client_host(_str(_first(obj, _REMOTE_KEYS))),
    )
    stamp = _first(obj, TIME_KEYS)
    return LbParse(attrs, str(stamp) if stamp is not None else None, parse_time)


def _attrs(
    status: int,
    flags: str,
    details: str | None,
    cluster: str | None,
    host: str | None,
    duration_s: float | None,
    client: str | None = None,
) -> dict[str, Any]:
    upstream, sidecar = upstream_of_cluster(cluster)
    attrs = lb_attrs(
        status,
        upstream=upstream,
        upstream_status=status if details == "via_upstream" else None,
        upstream_addr=host if host and host != "-" else None,
        request_time_s=duration_s,
        client=None if sidecar else client,
    )
    attrs["response_flags"] = None if flags == "-" else flags
    if details and details != "-":
        attrs["response_code_details"] = details
    if "RL" in flags.split(",") or (details is not None and details.endswith("rate_limited")):
        attrs["rate_limited"] = True  # local/global rate limit: throttling, not a failure
    if sidecar:
        attrs["sidecar"] = True
    return attrs


def _tail_fields(
    rest: str,
) -> tuple[str | None, str | None, float | None, str | None, str | None]:
    """Return (details, upstream host, duration in s, cluster, client) from the text after the
    flags; the client is the first X-Forwarded-For address, else the downstream remote host."""
    tokens = _TOKEN.findall(rest)
    at = _byte_counts_at(tokens)
    details = _details(tokens[:at]) if at > 0 else None
    duration_s = int(tokens[at + 2]) / 1000 if at >= 0 else None
    quoted = tokens[at + 4 : at + 9] if at >= 0 else []
    if len(quoted) == 5 and all(t[:1] == '"' for t in quoted):
        cluster = tokens[at + 9] if len(tokens) > at + 9 else None
        client = first_forwarded(quoted[0].strip('"'))
        if client is None and len(tokens) > at + 12:  # Istio: %DOWNSTREAM_REMOTE_ADDRESS%
            client = client_host(tokens[at + 12])
        return details, quoted[4].strip('"'), duration_s, cluster, client
    cluster = next((t for t in tokens if _CLUSTER_TOKEN.fullmatch(t)), None)
    return details, None, duration_s, cluster, None


def _byte_counts_at(tokens: list[str]) -> int:
    """Index of %BYTES_RECEIVED% %BYTES_SENT% %DURATION% (three integers in a row), or -1."""
    for i in range(min(len(tokens) - 2, 8)):
        if tokens[i].isdigit() and tokens[i + 1].isdigit() and tokens[i + 2].isdigit():
            return i
    return -1


def _details(head: list[str]) -> str | None:
    """Return %RESPONSE_CODE_DETAILS% from the tokens before the byte counts, if present."""
    first = head[0]
    if first[:1] == '"' or first == "-" or len(head) < 2:
        return None
    if "{" in first and "}" not in first:  # Envoy 1.13 wrote "{local reset}" with a space
        for token in head[1:]:
            first += " " + token
            if "}" in token:
                break
    return first


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = obj.get(key)
        if value is not None:
            return value
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value and value != "-" else None


def _int_field(value: Any, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1000:
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 3:
        return int(value)
    raise ParseError("bad_value", f"{name} is not an HTTP status: {str(value)[:40]!r}")


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if value >= 0 else None
    if isinstance(value, str) and value.isdigit():
        return float(value)
    return None
