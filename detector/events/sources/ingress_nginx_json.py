"""ingress-nginx access lines in a JSON ``log-format-upstream`` -> LB_RESPONSE attrs.

With ``log-format-escape-json: "true"`` users set ``log-format-upstream`` to a JSON object of
their own: the same nginx variables as the default text format, under key names they choose.
The keys are read by name, each nginx variable under its common spellings (snake_case,
camelCase, the variable's own name):

- status: ``status`` (``$status``), also under a Cloud Logging ``httpRequest`` /
  ``http_request`` map;
- upstream name: ``proxy_upstream_name`` / ``proxyUpstreamName`` / ``upstream_name``;
- upstream address, status: ``upstream_addr`` / ``upstreamAddr`` / ``upstream`` (an address),
  ``upstream_status`` / ``upstreamStatus`` / ``upstream-status``; after retries these are
  lists ("a, b", " : " between upstream groups) as in the text format;
- request time, length: ``request_time`` / ``requestTime`` / ``duration``, ``request_length`` /
  ``requestSize``;
- client: ``remote_addr`` / ``remoteIp`` ..., else the first ``x_forwarded_for`` address
  (``remote_addr`` is often ``$proxy_protocol_addr``, empty without the PROXY protocol);
- time (bare lines only; a shipped line is timed by its envelope): ``time`` / ``time_iso8601`` /
  ``@timestamp`` (ISO 8601), ``time_local`` (nginx), ``msec`` (epoch seconds).

The attrs are those of the text format (``ingress_nginx.access_line_attrs``), so one access
line reads the same in either format. Values may be numbers or strings; nginx writes an empty
value (``""``) for a variable that is not set when it escapes JSON. A line is taken for an
ingress-nginx access line when it is an object with a status key and a key named after an
nginx variable (``_NGINX_KEYS``); one that is, but carries no HTTP status, is rejected
(``ParseError("bad_value")``), never dropped in silence. A format that writes a variable
unquoted (``"upstream_status": $upstream_status``) is no JSON when the value is empty or a
list: such a flat line is read field by field, and rejected (``"malformed_json"``, naming the
fix) when even that fails. Sources (``log-format-upstream``, ``log-format-escape-json``):
https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/configmap/ ,
https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/log-format/ ,
http://nginx.org/en/docs/http/ngx_http_log_module.html#log_format (``escape=json``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from detector.errors import ParseError
from detector.events.model import LogLine, Signal, SignalKind, SourcePos
from detector.events.sources.ingress_nginx import upstream_tries
from detector.events.sources.lb_common import LbParse, first_forwarded
from detector.events.sources.timeparse import parse_nginx_time, parse_time

# "code": Fluent Bit's nginx parser (K8S-Logging.Parser), merged into the record
_STATUS_KEYS = ("status", "status_code", "statusCode", "http_status", "code")
_NAME_KEYS = ("proxy_upstream_name", "proxyUpstreamName", "upstream_name", "upstreamName")
_ADDR_KEYS = (
    "upstream_addr", "upstreamAddr", "upstream_address", "upstreamAddress", "upstream_server",
)  # fmt: skip
_UPSTREAM_STATUS_KEYS = ("upstream_status", "upstreamStatus", "upstream-status")
_TIME_TAKEN_KEYS = ("request_time", "requestTime", "http_request_time", "duration")
_LENGTH_KEYS = (
    "request_length", "requestLength", "http_request_length", "request_size", "requestSize",
)  # fmt: skip
_CLIENT_KEYS = (
    "remote_addr", "remoteAddr", "remote_ip", "remoteIp", "client_ip", "clientip", "clientIp",
    "client", "client_addr", "real_ip", "the_real_ip", "proxy_protocol_addr",
)  # fmt: skip
_FORWARDED_KEYS = (
    "x_forwarded_for", "x-forward-for", "x-forwarded-for", "proxy_add_x_forwarded_for",
    "http_x_forwarded_for", "xForwardedFor",
)  # fmt: skip
_HTTP_REQUEST_KEYS = ("httpRequest", "http_request")  # Cloud Logging's LogEntry.httpRequest
TIME_KEYS = (
    "time", "time_iso8601", "@timestamp", "timestamp", "time_local", "msec", "ts", "time_date",
    "time_str", "time_iso", "time_msec",
)  # fmt: skip
# Keys named after nginx variables: one of them beside a status makes an access line.
_NGINX_KEYS = frozenset(
    (
        *_NAME_KEYS, *_ADDR_KEYS, *_UPSTREAM_STATUS_KEYS, "upstream", "request_time",
        "requestTime", "http_request_time", "request_length", "requestLength",
        "http_request_length", "bytes_sent", "body_bytes_sent",
        "time_local", "time_iso8601", "remote_addr", "proxy_protocol_addr",
        "proxy_add_x_forwarded_for", "http_user_agent", "http_referer", "http_referrer",
        "upstream_response_time", "upstreamResponseTime", "upstream_response_length",
        "proxy_alternative_upstream_name", "proxyAlternativeUpstreamName", "req_id",
    )
)  # fmt: skip
# The same, as they appear in a line that is no JSON (unquoted variables).
_NGINX_KEY_TEXT = re.compile(
    r'"(?:proxy_?[uU]pstream_?[nN]ame|upstream(?:_addr|Addr|_status|Status|-status)'
    r'|request_(?:time|length)|body_bytes_sent|time_(?:local|iso8601))"\s*:'
)
# Cheap test before decoding: a status key and something named after an nginx variable.
_MAYBE = re.compile(
    r'"(?:proxy_?[uU]pstream|upstream|request_?(?:[tT]ime|[lL]ength|[sS]ize)|remote_?[aA]ddr'
    r"|remoteIp|(?:body_)?bytes_sent|time_(?:local|iso8601)|http_user_agent|req_id)"
)
# One "key": value pair of a flat object whose unquoted values may be empty or lists.
_PAIR = re.compile(
    r'\s*"((?:[^"\\]|\\.)*)"\s*:\s*("(?:[^"\\]|\\.)*"|[^",{}\[\]]*(?:,(?!\s*")[^",{}\[\]]*)*)'
    r"\s*([,}])"
)
_FIX = (
    'set log-format-escape-json: "true" and quote every $variable in log-format-upstream '
    '(e.g. "upstream_status": "$upstream_status")'
)


def signal_from_access_line(line: LogLine, source: SourcePos) -> Signal | None:
    """Return the LB_RESPONSE signal of a JSON access line in a controller's log, or None.

    Time and identity come from the log envelope. Raises ``ParseError`` (``bad_value``,
    ``malformed_json``) for a line that is ingress-nginx JSON but cannot be read (see the
    module docstring). Format:
    https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/configmap/#log-format-upstream
    """
    text = line.text
    if ("tatus" not in text and '"code"' not in text) or _MAYBE.search(text) is None:
        return None  # per JSON line: substring scans, no decode
    obj = decode_line(text)
    attrs = access_attrs(obj) if obj is not None else None
    return line.to_signal(SignalKind.LB_RESPONSE, source, attrs) if attrs is not None else None


def signal_from_access_object(
    line: LogLine, obj: dict[str, Any], source: SourcePos
) -> Signal | None:
    """Return the LB_RESPONSE signal of an access line already decoded (Fluent Bit's
    Merge_Log put it in the record), timed and named by ``line``; None if it is not one.

    Raises ``ParseError("bad_value")`` like ``access_attrs``.
    """
    attrs = access_attrs(obj)
    return line.to_signal(SignalKind.LB_RESPONSE, source, attrs) if attrs is not None else None


def parse_object(obj: dict[str, Any]) -> LbParse | None:
    """Read a bare JSON access line (no shipper envelope); None if it is not one.

    The time is the line's own ``TIME_KEYS`` field, read by ``read_time``. Raises
    ``ParseError("bad_value")`` like ``access_attrs``.
    """
    attrs = access_attrs(obj)
    if attrs is None:
        return None
    stamp = next((obj[k] for k in TIME_KEYS if obj.get(k) not in (None, "")), None)
    return LbParse(attrs, str(stamp) if stamp is not None else None, read_time)


def read_time(stamp: str) -> float:
    """Read ``$time_iso8601``, ``$time_local`` or ``$msec`` to Unix seconds.

    Raises ``ParseError("bad_timestamp")``.
    """
    return parse_nginx_time(stamp) if stamp[2:3] == "/" else parse_time(stamp)


def decode_line(text: str) -> dict[str, Any] | None:
    """Decode a JSON access line; None if it is no JSON object and names no nginx variable.

    A flat line that is no JSON because a variable was written unquoted (empty, ``-`` or a
    list after retries) is read field by field. Raises ``ParseError("malformed_json")`` for a
    line that names nginx variables but cannot be read even so.
    """
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        if _NGINX_KEY_TEXT.search(text) is None:
            return None
        obj = _salvage(text)
        if obj is None:
            raise ParseError("malformed_json", _unreadable(text)) from None
    return obj if isinstance(obj, dict) else None


def _unreadable(text: str) -> str:
    """Say why a line that names nginx variables is no JSON, and what to change."""
    if not text.rstrip().endswith("}"):
        return (
            f"ingress-nginx JSON access line cut off after {len(text)} characters: raise the "
            "line limit where it was cut (Fluent Bit tail Buffer_Max_Size, the runtime's 16 KiB "
            "split; Fluent Bit's multiline filter rejoins split lines)"
        )
    return f"ingress-nginx JSON access line that is no JSON: {_FIX}"


def access_attrs(obj: dict[str, Any]) -> dict[str, Any] | None:
    """Return the LB_RESPONSE attrs of a decoded JSON access line, or None if it is not one.

    attrs as ``ingress_nginx.access_line_attrs`` gives them: status, upstream_status (the last
    try), upstream, upstream_addr (the last try), count (1), request_time_s, client,
    request_bytes (when logged), upstream_addrs / upstream_statuses after retries. Raises
    ``ParseError("bad_value")`` for an access line whose status is no HTTP status.
    """
    http = _http_request(obj)
    raw_status = _first(obj, _STATUS_KEYS)
    if raw_status is None and http is not None:
        raw_status = http.get("status")
    if raw_status is None or _NGINX_KEYS.isdisjoint(obj):
        return None
    upstream = _text(_first(obj, _NAME_KEYS))
    addr = _variable(obj, _ADDR_KEYS)
    generic = _text(obj.get("upstream"))  # nginx/kubernetes-ingress logs $upstream_addr here
    if generic is not None and _is_address(generic):
        addr = addr or generic
    elif generic is not None:
        upstream = upstream or generic
    length = _first(obj, _LENGTH_KEYS)
    if length is None and http is not None:
        length = _first(http, _LENGTH_KEYS)
    attrs: dict[str, Any] = {
        "status": _http_status(raw_status),
        "upstream_status": None,
        "upstream": upstream,
        "upstream_addr": None,
        "count": 1,
        "request_time_s": _seconds(_first(obj, _TIME_TAKEN_KEYS)),
        "client": _client(obj, http),
    }
    request_bytes = _count(length)
    if request_bytes is not None:
        attrs["request_bytes"] = request_bytes
    upstream_tries(attrs, addr, _variable(obj, _UPSTREAM_STATUS_KEYS))
    return attrs


def _salvage(text: str) -> dict[str, Any] | None:
    """Read a flat object whose unquoted values may be empty or lists; None if it is not one."""
    if text[:1] != "{":
        return None
    obj: dict[str, Any] = {}
    pos, end = 1, len(text.rstrip())
    while pos < end:
        m = _PAIR.match(text, pos)
        if m is None:
            return None
        key, value, sep = m.groups()
        try:
            obj[json.loads(f'"{key}"')] = json.loads(value) if value[:1] == '"' else value.strip()
        except ValueError:  # a bad escape: no line nginx wrote
            return None
        pos = m.end()
        if sep == "}":
            return obj if pos == end else None
    return None


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = obj.get(key)
        if value is not None and value != "":
            return value
    return None


def _variable(obj: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """Return the first of ``keys`` logged, as nginx's text has it ("-" when empty); None when
    none is logged."""
    for key in keys:
        if key in obj:
            value = obj[key]
            if isinstance(value, str):
                return value or "-"
            return _text(value) or "-"
    return None


def _http_request(obj: dict[str, Any]) -> dict[str, Any] | None:
    for key in _HTTP_REQUEST_KEYS:
        value = obj.get(key)
        if isinstance(value, dict):
            return value
    return None


def _text(value: Any) -> str | None:
    """A string field ("-" and "" are nginx's "not set"), a number as its text."""
    if isinstance(value, str):
        return value if value and value != "-" else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _http_status(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 1000:
        return value
    if isinstance(value, str) and len(value) == 3 and value.isdigit():
        return int(value)
    shown = repr(str(value)[:40])
    raise ParseError(
        "bad_value", f"ingress-nginx JSON access line: status {shown} is no HTTP status"
    )


def _seconds(value: Any) -> float | None:
    """Read ``$request_time`` (a number, or its text); None when unset or a list."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if value >= 0 else None
    if isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            return None
        return seconds if seconds >= 0 else None
    return None


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _client(obj: dict[str, Any], http: dict[str, Any] | None) -> str | None:
    """Return ``$remote_addr`` (or its kin), else the first X-Forwarded-For address."""
    client = _text(_first(obj, _CLIENT_KEYS))
    if client is None and http is not None:
        client = _text(_first(http, _CLIENT_KEYS))
    return client or first_forwarded(_text(_first(obj, _FORWARDED_KEYS)))


def _is_address(value: str) -> bool:
    """Tell an ``$upstream_addr`` value (IP:port, [v6]:port, unix:, lists) from a name."""
    return value[:1].isdigit() or value[:1] == "[" or value.startswith("unix:")
