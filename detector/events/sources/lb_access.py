"""Load-balancer lines other than ingress-nginx's access log -> LB_RESPONSE signals.

Formats, told apart by their first characters so that a line of another kind costs a few
string tests (these functions run on every container log line):

- ``[``: Envoy / Istio default text access log (``"`` when pasted without its time);
- ``{``: Envoy / Istio JSON access log (only after a ``response_code`` substring test);
- a digit: nginx error_log (``2023/03/08 ...``), an Envoy custom format led by
  ``%RESPONSE_CODE% %RESPONSE_CODE_DETAILS% %RESPONSE_FLAGS%``, HAProxy HTTP log (from the
  client address, from the timers as pasted, or after an RFC 3339 syslog header);
- ``http``/``https``/``h2``/``grpcs``/``ws``/``wss``: AWS ALB access-log entry;
- a syslog header (``Feb  6 ...``, ``<134>``, ``haproxy[pid]:``): HAProxy HTTP log;

JSON records (GCP load-balancer log entries, Envoy JSON, bare ingress-nginx JSON access lines)
come decoded through ``signals_from_lb_json``; the Prometheus request counters are metric
samples, read by ``dcgm`` and ``prom_kafka_adapter`` and mapped by ``lb_prometheus``. Format
modules: ``lb_envoy``, ``lb_alb``, ``lb_gcp``, ``lb_haproxy``, ``lb_nginx_error``,
``ingress_nginx_json``; upstream naming rules: ``lb_common``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from detector.events.model import LogLine, Signal, SignalKind, SourcePos
from detector.events.sources import (
    ingress_nginx_json,
    lb_alb,
    lb_envoy,
    lb_gcp,
    lb_haproxy,
    lb_nginx_error,
)
from detector.events.sources.lb_common import MAX_TEXT_CHARS, LbParse, raw_signal

_SYSLOG_MONTHS = frozenset(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
)


def parse_lb_text(text: str) -> LbParse | None:
    """Recognize a proxy log line of any supported text format; None if it is none of them.

    Raises ``ParseError("bad_value")`` for an Envoy JSON line whose response code is not a
    number; other broken lines are not recognized (None). Formats (one per line):
    https://www.envoyproxy.io/docs/envoy/latest/configuration/observability/access_log/usage
    https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-access-logs.html
    https://docs.haproxy.org/2.8/configuration.html#8.2.3
    http://nginx.org/en/docs/ngx_core_module.html#error_log
    """
    handler = _BY_FIRST_CHAR.get(text[:1])
    return handler(text) if handler is not None else None


def _bracket_led(text: str) -> LbParse | None:
    return lb_envoy.parse_text(text) if text[11:12] == "T" else None


def _digit_led(text: str) -> LbParse | None:
    if text[4:5] == "/":
        return lb_nginx_error.parse_line(text)
    if text[3:4] == " ":
        return lb_envoy.parse_fragment(text)
    if text[4:5] == "-":  # an RFC 3339 syslog header, or (mostly) an application's own time
        return lb_haproxy.parse_syslog(text)
    return lb_haproxy.parse_line(text)


def _letter_led(text: str) -> LbParse | None:
    if text.startswith(lb_alb.TYPES):
        return lb_alb.parse_entry(text)
    if text[:3] in _SYSLOG_MONTHS or text.startswith("haproxy["):
        return lb_haproxy.parse_syslog(text)
    return None


_BY_FIRST_CHAR: dict[str, Callable[[str], LbParse | None]] = {
    "[": _bracket_led,
    '"': lb_envoy.parse_text,
    "{": lb_envoy.parse_json_line,
    "<": lb_haproxy.parse_syslog,
    **dict.fromkeys("0123456789", _digit_led),
    **dict.fromkeys("hgwJFMASOND", _letter_led),
}


def signal_from_lb_line(line: LogLine, source: SourcePos) -> Signal | None:
    """Return the LB_RESPONSE signal of a proxy log line inside a container log, or None.

    Time and identity come from the log envelope: for an Istio sidecar's inbound line
    (``sidecar=True``) the pod names the workload. Envoy/Istio, HAProxy, ALB and nginx
    error_log formats: see ``parse_lb_text``. Raises ``ParseError`` only for an Envoy JSON line
    with a bad response code. Format:
    https://www.envoyproxy.io/docs/envoy/latest/configuration/observability/access_log/usage
    """
    parsed = parse_lb_text(line.text)
    if parsed is None:
        return None
    return line.to_signal(SignalKind.LB_RESPONSE, source, parsed.attrs)


def signal_from_raw_lb_line(
    text: str, source: SourcePos, default_time: float | None = None
) -> Signal | None:
    """Return the LB_RESPONSE signal of a bare load-balancer log line, or None.

    Time: the line's own time field, else ``default_time``; raises
    ``ParseError("missing_timestamp")`` with neither, ``"bad_timestamp"`` for an unreadable
    time field. Formats: see ``parse_lb_text``.
    """
    parsed = parse_lb_text(text)
    if parsed is None:
        return None
    return raw_signal(parsed, source, text, default_time, "load-balancer")


def signals_from_lb_json(
    obj: dict[str, Any], source: SourcePos, default_time: float | None = None
) -> list[Signal] | None:
    """Return the signals of a JSON load-balancer record, or None if it is not one.

    Reads GCP load-balancer log entries (``httpRequest`` + ``resource``), Envoy/Istio JSON
    access logs (``response_code`` + ``response_flags``/``upstream_cluster``) and ingress-nginx
    JSON access lines (a status and keys named after nginx variables: ``ingress_nginx_json``);
    Prometheus LB counters are read with the other metric samples (``dcgm``,
    ``prom_kafka_adapter``). Raises ``ParseError`` (``missing_timestamp``, ``bad_timestamp``,
    ``bad_value``, ``missing_field``) for a record of these formats with a bad or missing
    field. Formats:
    https://cloud.google.com/load-balancing/docs/https/https-logging-monitoring ,
    https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/configmap/#log-format-upstream
    """
    if "httpRequest" in obj or "http_request" in obj:  # a GCP entry, or nginx's own httpRequest
        parsed = lb_gcp.parse_entry(obj) or ingress_nginx_json.parse_object(obj)
    elif "response_code" in obj or "responseCode" in obj:
        parsed = lb_envoy.parse_json(obj)
    else:
        parsed = ingress_nginx_json.parse_object(obj)
    if parsed is None:
        return None
    text = _json_text(obj)
    return [raw_signal(parsed, source, text, default_time, "JSON load-balancer")]


def _json_text(obj: dict[str, Any]) -> str:
    """Return the record as compact JSON, cut to the signal's text size."""
    return json.dumps(obj, separators=(",", ":"), default=str)[:MAX_TEXT_CHARS]
