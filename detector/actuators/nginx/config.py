"""What the nginx rate-limit step writes: the request, its validation and the two files. Pure.

Two include files, each written whole by the detector, wired once by the operator:

    http {
        include /etc/nginx/detector/http.conf;          # limit_req_zone (http context only)
        server {
            location / {
                include /etc/nginx/detector/location.conf;   # limit_req + limit_req_status
                proxy_pass http://llm;
            }
        }
    }

Both files must exist before nginx starts (create them empty); with no limit in force they
hold comments only. ``limit_req_zone`` / ``limit_conn_zone`` are valid only in ``http``;
``limit_req``, ``limit_req_status``, ``limit_conn`` and ``limit_conn_status`` in ``http``,
``server`` and ``location``.
Sources: https://nginx.org/en/docs/http/ngx_http_limit_req_module.html ,
https://nginx.org/en/docs/http/ngx_http_limit_conn_module.html

The key decides what a limit bounds: the constant ``GLOBAL_KEY`` (the default) keeps one bucket
for every client, so the limit is the workload's total (aggregate) rate and concurrency, which is
what the runbook computes; ``$binary_remote_addr`` would give each client IP its own bucket, and
N clients N times the rate.

Semantics (same page, and https://blog.nginx.org/blog/rate-limiting-nginx): one leaky bucket
per key value, drained at ``rate`` (``r/s`` or ``r/m``: a rate under one per second is kept as
requests per minute); with ``nodelay``, up to ``burst`` requests above the rate are served at
once and any beyond are answered ``limit_req_status`` (429 here) immediately. The first request
of a key is free, so a tight burst of N requests over D seconds gets at most
1 + burst + floor(rate x D) answers that are not 429. ``limit_conn`` counts the requests in
progress per key value and answers ``limit_conn_status`` beyond it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from detector.actuators.base import ActuatorError, Reason

DEFAULT_ZONE_SIZE = "10m"
"""Shared memory per zone: 1 MB holds about 16,000 states of 64 bytes (nginx docs above)."""

GLOBAL_KEY = "global"
"""A constant key: one bucket for every client, so the limit is the workload's total rate,
which is what the runbook computes. ``$binary_remote_addr`` limits each client IP instead."""

HEADER = (
    "# Managed by the GPU OOM cascade detector (runbook step enable_rate_limit).\n"
    "# Rewritten whole on every apply and revert; edits here are overwritten.\n"
)
_ZONE = re.compile(r"[A-Za-z0-9_]{1,64}")
_ZONE_SIZE = re.compile(r"[1-9][0-9]{0,9}[kKmM]?")
_KEY = re.compile(r"[$A-Za-z0-9_]{1,128}")
_NOT_ZONE_CHARS = re.compile(r"[^A-Za-z0-9_]+")


def _invalid(detail: str) -> ActuatorError:
    return ActuatorError(Reason.INVALID_REQUEST, detail)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One nginx ``limit_req`` rate limit, with an optional ``limit_conn`` on the same key.

    The rate is ``rate_per_s`` (nginx ``rate=Nr/s``) or ``rate_per_min`` (``rate=Nr/m``):
    exactly one, >= 1. ``burst``: requests above the rate served at once (>= 0; 0 leaves
    ``burst`` out, nginx's default), or with ``queue`` the requests over the rate that wait
    (no ``nodelay``: nginx delays them to the rate instead of answering 429, a gateway queue
    that clients do not retry against); ``connections``: requests in progress at once (>= 1;
    None: no ``limit_conn``); ``zone``: the shared memory zone name (letters, digits, ``_``;
    the connection zone is ``<zone>_conn``); ``zone_size``: the size of each zone (``10m``,
    ``512k``); ``key``: a constant (one bucket for all clients) or nginx variables
    (``$binary_remote_addr``: one per client IP); ``status``: the rejection status, 400-599.
    Values are checked so nothing but these tokens reaches the config. Raises
    ActuatorError(``invalid_request``) on a bad value.
    """

    zone: str
    rate_per_s: int | None = None
    burst: int = 0
    zone_size: str = DEFAULT_ZONE_SIZE
    key: str = GLOBAL_KEY
    status: int = 429
    rate_per_min: int | None = None
    connections: int | None = None
    queue: bool = False

    def __post_init__(self) -> None:
        numbers = (
            ("rate_per_s", self.rate_per_s, 1),
            ("rate_per_min", self.rate_per_min, 1),
            ("connections", self.connections, 1),
            ("burst", self.burst, 0),
        )
        for name, value, least in numbers:
            if value is None and name != "burst":
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise _invalid(f"{name} must be an int, got {value!r}")
            if value < least:
                raise _invalid(f"{name} must be at least {least}, got {value}")
        if (self.rate_per_s is None) == (self.rate_per_min is None):
            raise _invalid("set one of rate_per_s and rate_per_min")
        for name, text, pattern in (
            ("zone", self.zone, _ZONE),
            ("zone_size", self.zone_size, _ZONE_SIZE),
            ("key", self.key, _KEY),
        ):
            if not isinstance(text, str) or not pattern.fullmatch(text):
                raise _invalid(f"{name} {text!r} does not match {pattern.pattern}")
        if not 400 <= self.status <= 599:
            raise _invalid(f"status must be in 400-599 (limit_req_status), got {self.status}")

    @property
    def rate(self) -> str:
        """Return the nginx rate, ``2r/s`` or ``48r/m``."""
        return f"{self.rate_per_s}r/s" if self.rate_per_s is not None else f"{self.rate_per_min}r/m"

    @property
    def requests_per_s(self) -> float:
        """Return the rate in requests per second (``48r/m``: 0.8)."""
        return (
            float(self.rate_per_s) if self.rate_per_s is not None else (self.rate_per_min or 0) / 60
        )

    @property
    def conn_zone(self) -> str:
        """Return the ``limit_conn_zone`` name: ``<zone>_conn``."""
        return f"{self.zone}_conn"

    def describe(self) -> str:
        """Return a one-line summary, e.g. ``limit_req 2 r/s burst 0 zone=z (10m) -> 429``."""
        rate = (
            f"{self.rate_per_s} r/s"
            if self.rate_per_s is not None
            else f"{self.rate_per_min} r/min"
        )
        conns = f" limit_conn {self.connections}" if self.connections is not None else ""
        return (
            f"limit_req {rate} burst {self.burst}{' queued' * self.queue}{conns} key {self.key} "
            f"zone={self.zone} ({self.zone_size}) -> {self.status}"
        )


ADMISSION_HEADER = (
    "# Managed by the GPU OOM cascade detector (runbook step quarantine_requests).\n"
    "# Rewritten whole on every apply and revert; edits here are overwritten.\n"
)
MIN_BODY_BYTES = 1024


@dataclass(frozen=True, slots=True)
class AdmissionRule:
    """An admission rule: requests over ``max_body_bytes`` are refused with 413.

    nginx's ``client_max_body_size`` (in whole KiB here, rounded down, at least 1k): a request
    whose Content-Length is larger is answered 413 Request Entity Too Large before it is
    proxied (https://nginx.org/en/docs/http/ngx_http_core_module.html#client_max_body_size).
    Raises ActuatorError(``invalid_request``) for a size that is not an int >= 1024.
    """

    max_body_bytes: int

    def __post_init__(self) -> None:
        size = self.max_body_bytes
        if not isinstance(size, int) or isinstance(size, bool) or size < MIN_BODY_BYTES:
            raise _invalid(f"max_body_bytes must be an int >= {MIN_BODY_BYTES}, got {size!r}")

    @property
    def size(self) -> str:
        """Return nginx's size, ``47k``."""
        return f"{self.max_body_bytes // 1024}k"

    def describe(self) -> str:
        """Return a one-line summary, e.g. ``client_max_body_size 47k -> 413``."""
        return f"client_max_body_size {self.size} -> 413"


def render_admission(rule: AdmissionRule | None) -> str:
    """Return the admission include (the same ``location`` as the rate limit), or comments."""
    text = ADMISSION_HEADER + "# Include in the location {} that proxies to the workload.\n"
    if rule is None:
        return text + "# No admission rule in force.\n"
    return text + f"client_max_body_size {rule.size};\n"


def zone_name(namespace: str, workload: str) -> str:
    """Return ``detector_<namespace>_<workload>`` with other characters as ``_``, 64 at most."""
    raw = f"detector_{namespace}_{workload}"
    return _NOT_ZONE_CHARS.sub("_", raw)[:64]


def render_http(limit: RateLimit | None) -> str:
    """Return the http-context include: the ``limit_req_zone`` line, or comments only."""
    text = HEADER + "# Include once inside http {}.\n"
    if limit is None:
        return text + "# No rate limit in force.\n"
    text += f"limit_req_zone {limit.key} zone={limit.zone}:{limit.zone_size} rate={limit.rate};\n"
    if limit.connections is not None:
        text += f"limit_conn_zone {limit.key} zone={limit.conn_zone}:{limit.zone_size};\n"
    return text


def render_location(limit: RateLimit | None) -> str:
    """Return the server/location include: ``limit_req`` and ``limit_req_status`` (and
    ``limit_conn`` / ``limit_conn_status`` with ``connections``), or comments.

    ``burst=0`` is left out: nginx rejects it as invalid, and 0 is its default.
    """
    text = HEADER + "# Include in the server {} or location {} that proxies to the workload.\n"
    if limit is None:
        return text + "# No rate limit in force.\n"
    burst = f" burst={limit.burst}" if limit.burst else ""
    nodelay = "" if limit.queue and limit.burst else " nodelay"
    text += f"limit_req zone={limit.zone}{burst}{nodelay};\nlimit_req_status {limit.status};\n"
    if limit.connections is not None:
        text += f"limit_conn {limit.conn_zone} {limit.connections};\n"
        text += f"limit_conn_status {limit.status};\n"
    return text
