"""nginx error_log lines about upstream failures and rate limiting -> LB_RESPONSE attrs.

The error_log format (plain nginx and the ingress-nginx controller's stderr)::

    2023/03/08 16:02:40 [error] 31#31: *569 upstream timed out (110: Operation timed out) while
    connecting to upstream, client: 203.0.113.25, server: example.com, request: "GET / HTTP/1.1",
    upstream: "http://10.42.0.15:80/", host: "example.com"

Only failures that happen before the response starts give the client an error status, so only
these phases count: connecting to, sending the request to, SSL handshaking with, or reading the
response header from the upstream. nginx then answers 504 for a timeout and 502 for everything
else, ``no live upstreams`` included (``ngx_http_upstream_next``: ``NGX_HTTP_UPSTREAM_FT_NOLIVE``
falls to the default 502). ``limiting requests`` / ``limiting connections`` lines are rejections
by ``limit_req`` / ``limit_conn``: status 429 with ``rate_limited=True``, kept apart from 5xx
(the client got ``limit_req_status``, 503 unless configured, which the access line records).
Stream-module lines (no ``request:``) carry no HTTP status and give none. Sources:
http://nginx.org/en/docs/ngx_core_module.html#error_log ,
http://nginx.org/en/docs/http/ngx_http_limit_req_module.html ,
https://github.com/nginx/nginx/blob/master/src/http/ngx_http_upstream.c .
"""

from __future__ import annotations

import re
from calendar import timegm

from detector.errors import ParseError
from detector.events.sources.lb_common import LbParse, lb_attrs

_HEAD = re.compile(r"(\d{4})/(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d) \[[a-z]+\] \d+#\d+: (?:\*\d+ )?")
_UPSTREAM = re.compile(r', upstream: "(?:[a-z]+://)?([^/"]*)')
_ZONE = re.compile(r'by zone "([^"]*)"')
_PORT = re.compile(r".+:\d+")
# message prefix -> (status, error code)
_FAILURES: tuple[tuple[str, int, str], ...] = (
    ("upstream timed out", 504, "upstream_timed_out"),
    ("upstream prematurely closed connection", 502, "upstream_prematurely_closed"),
    ("connect() ", 502, "connect_failed"),
    ("no live upstreams", 502, "no_live_upstreams"),
    ("recv() failed", 502, "upstream_reset"),
    ("readv() failed", 502, "upstream_reset"),
    ("writev() failed", 502, "upstream_reset"),
    ("send() failed", 502, "upstream_reset"),
    ("upstream sent", 502, "upstream_invalid_response"),
    ("SSL_do_handshake() failed", 502, "upstream_ssl_failed"),
)
_BEFORE_RESPONSE = (
    " while connecting to upstream,",
    " while sending request to upstream,",
    " while SSL handshaking to upstream,",
    " while reading response header from upstream,",
)
_RATE_LIMITS = (
    ("limiting requests, excess:", "limit_req"),
    ("limiting connections by zone", "limit_conn"),
)
_CLIENT = re.compile(r", client: ([^,\s]+),")
# Balancer placeholders that name no backend: ingress-nginx's Lua balancer.
_NO_NAME_UPSTREAMS = frozenset({"upstream_balancer", ""})


def parse_line(text: str) -> LbParse | None:
    """Parse an nginx error_log line; None unless it is an upstream failure or a rate limit.

    attrs: status (502/504; 429 for limit_req/limit_conn), error_log=True, error (a short
    code), upstream (an upstream group name when the line names one, else None), upstream_addr
    (``ip:port`` of the peer tried), client (the ``client:`` field), rate_limited and zone for
    rejections. Format:
    http://nginx.org/en/docs/ngx_core_module.html#error_log
    """
    if "upstream" not in text and "limiting " not in text:
        return None
    m = _HEAD.match(text)
    if m is None:
        return None
    message = text[m.end() :]
    classified = _classify(message)
    if classified is None:
        return None
    status, error = classified
    upstream, addr = _upstream_fields(message)
    client = _CLIENT.search(message)
    attrs = lb_attrs(
        status, upstream=upstream, upstream_addr=addr, client=client.group(1) if client else None
    )
    attrs["error_log"] = True
    attrs["error"] = error
    if status == 429:
        attrs["rate_limited"] = True
        zone = _ZONE.search(message)
        if zone:
            attrs["zone"] = zone.group(1)
    return LbParse(attrs, text[: m.end()], _error_log_time)


def _classify(message: str) -> tuple[int, str] | None:
    """Return (status, error code) of a message that cost a client its response, else None."""
    if ', request: "' not in message:
        return None
    for prefix, code in _RATE_LIMITS:
        if message.startswith(prefix):
            return 429, code
    for prefix, status, code in _FAILURES:
        if message.startswith(prefix):
            return (status, code) if any(p in message for p in _BEFORE_RESPONSE) else None
    return None


def _upstream_fields(message: str) -> tuple[str | None, str | None]:
    """Return (upstream group name, peer address) from the ``upstream: "..."`` field."""
    m = _UPSTREAM.search(message)
    if m is None:
        return None, None
    host = m.group(1)
    if _PORT.fullmatch(host) or host.startswith("unix:"):
        return None, host
    return (None if host in _NO_NAME_UPSTREAMS else host), None


def _error_log_time(head: str) -> float:
    """Read the ``2023/03/08 16:02:40`` time (nginx's local time, taken as UTC)."""
    m = _HEAD.match(head)
    if m is None:  # cannot happen: the head matched in parse_line
        raise ParseError("bad_timestamp", f"not an error_log time: {head[:40]!r}")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        raise ParseError("bad_timestamp", f"not an error_log time: {head[:40]!r}")
    return float(timegm((year, month, day, hour, minute, second)))
