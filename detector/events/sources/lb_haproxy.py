"""HAProxy HTTP log lines (``option httplog``), with or without a syslog prefix -> LB_RESPONSE.

The HTTP log format::

    [syslog header] haproxy[pid]: client:port [accept_date] frontend backend/server
    TR/Tw/Tc/Tr/Ta status bytes_read captured_request_cookie captured_response_cookie
    termination_state actconn/feconn/beconn/srv_conn/retries srv_queue/backend_queue
    {captured_request_headers} {captured_response_headers} "request"

Timers are ms, ``-1`` when the step never happened, ``+`` prefixed when logged before the end
(``option logasap``); some builds pad them with spaces. ``<NOSRV>`` means no server was chosen.
The first letters of the termination state say who ended the session (``sC``: connect timeout,
``SC``: server refused, ``SH``: server aborted before headers ...). TCP logs (``option tcplog``)
carry no HTTP status and give no signal. Source: https://docs.haproxy.org/2.8/configuration.html
sections 8.2.3 (HTTP log format) and 8.5 (session state at disconnection).
"""

from __future__ import annotations

import re

from detector.events.sources.lb_common import (
    LbParse,
    client_host,
    lb_attrs,
    number_or_none,
    upstream_of_haproxy_backend,
)
from detector.events.sources.timeparse import parse_nginx_time

_TIMER = r"[-+]?\d+"
# [client ][accept_date] <frontend backend/server, or a custom run of names> timers status ...
_HTTP = re.compile(
    r"(?:(?:(\S+) )?\[(\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d(?:\.\d+)?)\] (\S.{0,300}?) +)?"
    r"(" + _TIMER + r"/ *" + _TIMER + r"/ *" + _TIMER + r"/ *" + _TIMER + r"/ *(" + _TIMER + r"))"
    r" (\d{3}) \+?\d+ \S+ \S+ ([A-Za-z-]{2,4})(?: |$)"
)
_SYSLOG_TAG = "haproxy["


def parse_line(text: str) -> LbParse | None:
    """Parse an HTTP log line that starts at the client address (or, as pasted, at the timers).

    attrs: status, upstream (the backend; ``ns_svc_port`` ingress backends mapped to
    ``<namespace>-<service>-<port>``), server (None for ``<NOSRV>``), termination_state,
    request_time_s (the total time ``Ta``/``Tt``), client (``%ci`` without the port; None
    when pasted from the timers on). Format:
    https://docs.haproxy.org/2.8/configuration.html#8.2.3
    """
    space = text.find(" ", 0, 64)
    if space < 0 or (
        text[:1] != "[" and text[space + 1 : space + 2] != "[" and "/" not in text[:space]
    ):
        return None  # neither "client:port [date] ..." nor "TR/Tw/Tc/Tr/Ta status ..."
    m = _HTTP.match(text)
    if m is None:
        return None
    backend, server = _backend_server(m.group(3))
    total_ms = number_or_none(m.group(5).lstrip("+"))
    attrs = lb_attrs(
        int(m.group(6)),
        upstream=upstream_of_haproxy_backend(backend) if backend else None,
        request_time_s=total_ms / 1000 if total_ms is not None else None,
        client=client_host(m.group(1)),
    )
    attrs["server"] = server
    attrs["termination_state"] = m.group(7)
    return LbParse(attrs, m.group(2), _accept_time)


def _backend_server(names: str | None) -> tuple[str | None, str | None]:
    """Split ``frontend backend/server`` (or a custom run of names ending in the backend)."""
    tokens = names.split() if names else []
    if len(tokens) < 2:
        return None, None
    backend, _, server = tokens[-1].partition("/")
    return backend or None, server if server and server != "<NOSRV>" else None


def parse_syslog(text: str) -> LbParse | None:
    """Parse a line with a syslog prefix (``... haproxy[pid]: ``); None if it has none."""
    at = text.find(_SYSLOG_TAG)
    if at < 0:
        return None
    body = text.find("]: ", at)
    return parse_line(text[body + 3 :]) if body > 0 else None


def _accept_time(stamp: str) -> float:
    """Read ``06/Feb/2009:12:14:14.655`` (HAProxy's local time, taken as UTC)."""
    seconds = parse_nginx_time(stamp[:20] + " +0000")
    return seconds + float("0" + stamp[20:]) if len(stamp) > 21 else seconds
