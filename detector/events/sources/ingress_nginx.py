"""ingress-nginx access-log lines (``upstreaminfo`` format, also 0.x and plain combined) -> Signal.

Default format of the controller (``log-format-upstream``)::

    $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
    "$http_referer" "$http_user_agent" $request_length $request_time [$proxy_upstream_name]
    [$proxy_alternative_upstream_name] $upstream_addr $upstream_response_length
    $upstream_response_time $upstream_status $req_id

0.9-0.2x wrote ``$the_real_ip - [$the_real_ip] - $remote_user`` and had no alternative upstream
or req_id; 2016 builds had no ``[$proxy_upstream_name]``. After retries the upstream fields are
lists ("a, b"; " : " between upstream groups). A plain nginx ``combined`` line yields the status
with no upstream. Sources:
https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/log-format/ ,
http://nginx.org/en/docs/http/ngx_http_upstream_module.html#var_upstream_addr .
"""

from __future__ import annotations

import re
from typing import Any

from detector.events.model import LogLine, Signal, SignalKind, SourcePos
from detector.events.sources.timeparse import parse_nginx_time

MAX_TEXT_CHARS = 2048

_QUOTED = r'"[^"\\]*(?:\\.[^"\\]*)*"'
# Anchored head: client, optional 0.x "[$the_real_ip] - ", user, [time], "request", status, bytes.
_HEAD = re.compile(
    r"(\S+) - (?:\[[^\]]*\] - )?\S* \[([^\]]+)\] " + _QUOTED + r" (\d{3}) (?:\d+|-)"
    r"(?: " + _QUOTED + " " + _QUOTED + r"(.*))?",
    re.DOTALL,
)
# After the user agent: request_length request_time [upstream] [alternative] rest.
_TAIL = re.compile(
    r" (\d+) (\d+(?:\.\d+)?|-)(?: \[([^\]]*)\])?(?: \[([^\]]*)\])?(?: (.*))?", re.DOTALL
)


def access_line_attrs(text: str) -> tuple[dict[str, Any], str] | None:
    """Parse an access line into (LB_RESPONSE attrs, ``$time_local``), or None if it is not one.

    attrs: status (int), upstream_status (int | None, the last try), upstream
    (``$proxy_upstream_name`` | None), upstream_addr (the last try | None), count (1),
    request_time_s (float | None), client (``$remote_addr``, the key of ingress-nginx's
    per-client limits | None), request_bytes (``$request_length``: request line, headers and
    body, int; absent in a combined line), and upstream_addrs / upstream_statuses (tuples)
    after retries.
    """
    head = _HEAD.match(text)
    if head is None:
        return None
    client, time_local, status, tail = head.groups()
    attrs: dict[str, Any] = {
        "status": int(status),
        "upstream_status": None,
        "upstream": None,
        "upstream_addr": None,
        "count": 1,
        "request_time_s": None,
        "client": client if client != "-" else None,
    }
    if tail:
        _add_upstream_info(attrs, tail)
    return attrs, time_local


def signal_from_access_line(line: LogLine, source: SourcePos) -> Signal | None:
    """Return the LB_RESPONSE signal of a controller log line, or None if it is no access line.

    Time and identity (the controller pod) come from the log envelope. Format:
    https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/log-format/
    """
    parsed = access_line_attrs(line.text)
    if parsed is None:
        return None
    return line.to_signal(SignalKind.LB_RESPONSE, source, parsed[0])


def signal_from_raw_access_line(text: str, source: SourcePos) -> Signal | None:
    """Return the LB_RESPONSE signal of a bare access line (no envelope), timed by ``$time_local``.

    Raises ``ParseError("bad_timestamp")`` when the bracketed time is not an nginx time.
    """
    parsed = access_line_attrs(text)
    if parsed is None:
        return None
    attrs, time_local = parsed
    return Signal(
        kind=SignalKind.LB_RESPONSE,
        time=parse_nginx_time(time_local),
        source=source,
        attrs=attrs,
        text=text[:MAX_TEXT_CHARS],
    )


def _add_upstream_info(attrs: dict[str, Any], tail: str) -> None:
    """Fill the upstream fields from the part of the line after the user agent."""
    m = _TAIL.match(tail)
    if m is None:  # combined + "$http_x_forwarded_for", or another custom format
        return
    length, request_time, upstream, _, rest = m.groups()
    attrs["request_bytes"] = int(length)
    if request_time != "-":
        attrs["request_time_s"] = float(request_time)
    if upstream and upstream != "-":
        attrs["upstream"] = upstream
    fields = _flat(rest).split() if rest else None  # "a, b : c" lists -> "a,b,c"
    if fields:  # a line cut after its upstream names, spaces only, has no upstream fields
        _tries(attrs, fields[0], fields[3] if len(fields) >= 4 else None)


def upstream_tries(attrs: dict[str, Any], addrs: str | None, statuses: str | None) -> None:
    """Fill upstream_addr and upstream_status (the last try) from ``$upstream_addr`` and
    ``$upstream_status`` as nginx writes them ("a, b : c" after retries; "-" or None: not
    set), and upstream_addrs / upstream_statuses (tuples) after retries. A None status
    field (not logged) leaves the status and the lists out.
    """
    _tries(attrs, _flat(addrs or "-"), _flat(statuses) if statuses is not None else None)


def _flat(field: str) -> str:
    """Join nginx's upstream lists with single commas: "a, b : c" -> "a,b,c"."""
    if ", " not in field and " : " not in field:  # one try, the common case
        return field
    return field.replace(", ", ",").replace(" : ", ",")


def _tries(attrs: dict[str, Any], addrs_field: str, tries: str | None) -> None:
    addrs = _list(addrs_field)
    if addrs:
        attrs["upstream_addr"] = addrs[-1]
    if tries is None:
        return
    statuses = [_status(s) for s in tries.split(",")] if "," in tries else [_status(tries)]
    attrs["upstream_status"] = statuses[-1]
    if len(addrs) > 1 or len(statuses) > 1:
        attrs["upstream_addrs"] = tuple(addrs)
        attrs["upstream_statuses"] = tuple(statuses)


def _list(field: str) -> list[str]:
    """Split one comma-joined upstream field, dropping nginx's "-" placeholders."""
    if "," not in field:  # one try, the common case
        return [field] if field and field != "-" else []
    return [item for item in field.split(",") if item and item != "-"]


def _status(token: str) -> int | None:
    """Read a 3-digit upstream status ("502", '404"' as pasted), or None for "-"."""
    token = token.strip('"')
    return int(token[:3]) if len(token) >= 3 and token[:3].isdigit() else None
