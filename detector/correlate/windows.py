"""Sliding event-time windows over load-balancer responses (pure, time passed in)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any, NamedTuple

ERROR_STATUSES = frozenset({502, 503, 504})


def upstream_failed(status: object, statuses: object = None) -> bool:
    """Return whether an upstream (the workload's pod) answered 5xx (500-599) to any try.

    ``status``: the last try's upstream status (int | None); ``statuses``: every try's, after
    retries (a tuple, ingress-nginx ``$upstream_status`` "502, 200"): a try the gateway
    retried elsewhere still failed on the pod. vLLM answers its in-flight requests with 500
    when its engine dies, which the gateway passes on as is (not as 502/503/504).
    """
    if isinstance(statuses, tuple) and statuses:
        return any(isinstance(s, int) and 500 <= s <= 599 for s in statuses)
    return isinstance(status, int) and 500 <= status <= 599


class RateWindow:
    """Count requests, 5xx and 429s in 1-second buckets over ``width_s``.

    Counted apart: ``errors``, the gateway's own 502/503/504; ``upstream_errors``, responses
    whose upstream (a pod of the workload) answered 5xx, 500 included, to some try; and
    ``failed``, responses that are either (each counted once): the surge test's measure.
    Rates are per second of window width. A record older than the window is dropped from
    the rate (it still counts as evidence elsewhere).
    """

    def __init__(self, width_s: float) -> None:
        self.width_s = width_s
        # [second, total, errors, throttled, upstream_errors, failed]
        self._buckets: deque[list[int]] = deque()
        self.total = 0
        self.errors = 0
        self.throttled = 0
        self.upstream_errors = 0
        self.failed = 0

    def add(self, time: float, status: int, count: int = 1, upstream_error: bool = False) -> None:
        """Add ``count`` responses with HTTP ``status`` at event ``time`` (Unix seconds).

        ``upstream_error``: their upstream answered 5xx (see ``upstream_failed``).
        """
        second = int(time)
        err = count if status in ERROR_STATUSES else 0
        thr = count if status == 429 else 0
        up = count if upstream_error else 0
        failed = count if err or up else 0
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:  # the common case: the current second
            bucket: list[int] | None = buckets[-1]
        else:
            bucket = self._find_or_insert(second)
        if bucket is None:
            return
        bucket[1] += count
        bucket[2] += err
        bucket[3] += thr
        self.total += count
        self.errors += err
        self.throttled += thr
        if failed:
            bucket[4] += up
            bucket[5] += failed
            self.upstream_errors += up
            self.failed += failed

    def _find_or_insert(self, second: int) -> list[int] | None:
        buckets = self._buckets
        if not buckets or buckets[-1][0] < second:
            buckets.append([second, 0, 0, 0, 0, 0])
            self.advance(second)
            return buckets[-1]
        if second < buckets[-1][0] - self.width_s:
            return None
        for bucket in reversed(buckets):  # late record: walk back a few buckets
            if bucket[0] == second:
                return bucket
            if bucket[0] < second:
                break
        new = [second, 0, 0, 0, 0, 0]
        buckets.append(new)
        self._buckets = deque(sorted(buckets, key=lambda b: b[0]))
        return new

    def advance(self, now: float) -> None:
        """Drop buckets older than ``now - width_s``."""
        horizon = now - self.width_s
        buckets = self._buckets
        while buckets and buckets[0][0] <= horizon:
            _, total, err, thr, up, failed = buckets.popleft()
            self.total -= total
            self.errors -= err
            self.throttled -= thr
            self.upstream_errors -= up
            self.failed -= failed

    @property
    def error_rate_per_s(self) -> float:
        """Return 5xx responses per second over the window."""
        return self.errors / self.width_s

    @property
    def request_rate_per_s(self) -> float:
        """Return all responses per second over the window."""
        return self.total / self.width_s

    @property
    def ok_rate_per_s(self) -> float:
        """Return responses per second that were neither 5xx nor 429 over the window."""
        return (self.total - self.errors - self.throttled) / self.width_s

    def exceeds(self, error_rate_per_s: float, error_ratio: float) -> bool:
        """Return whether the 5xx rate (per second) and share both reach the given thresholds.

        The same comparisons as ``error_rate_per_s >= ...`` and ``error_ratio >= ...``, in
        one call (this runs per load-balancer record).
        """
        errors, total = self.errors, self.total
        return (
            errors / self.width_s >= error_rate_per_s
            and (errors / total if total else 0.0) >= error_ratio
        )

    @property
    def error_ratio(self) -> float:
        """Return the 5xx share of responses in the window (0 when there were none)."""
        return self.errors / self.total if self.total else 0.0

    @property
    def upstream_error_rate_per_s(self) -> float:
        """Return responses per second whose upstream answered 5xx over the window."""
        return self.upstream_errors / self.width_s

    @property
    def upstream_error_ratio(self) -> float:
        """Return the share of responses whose upstream answered 5xx (0 when there were none)."""
        return self.upstream_errors / self.total if self.total else 0.0

    def fails(self, error_rate_per_s: float, error_ratio: float) -> bool:
        """Return whether the failed responses (gateway 502/503/504 or upstream 5xx, each
        once) reach both thresholds: rate per second and share. ``exceeds`` on ``failed``."""
        failed, total = self.failed, self.total
        return (
            failed / self.width_s >= error_rate_per_s
            and (failed / total if total else 0.0) >= error_ratio
        )


SLOTS_PER_WINDOW = 6  # a client window is kept in this many slots
MAX_CLIENTS_PER_SLOT = 10_000  # more distinct addresses in one slot are counted, not named
MAX_PROXIES_PER_SLOT = 256  # proxy instances named per slot


class ClientStats(NamedTuple):
    """The client distribution of a window: how a per-client limit meets the load.

    ``clients``: distinct client addresses (at least, when ``capped``); ``max_requests``: the
    most requests one client sent; ``requests``: the requests that named a client; ``proxies``:
    distinct proxy instances (pods) that logged them (0: none named); ``span_s``: the seconds
    of event time these counts cover.
    """

    clients: int
    max_requests: int
    requests: int
    proxies: int
    span_s: float
    capped: bool


class ClientWindow:
    """Count requests per client address, and the proxies that logged them, over ``width_s``.

    Kept in ``SLOTS_PER_WINDOW`` slots of ``width_s / SLOTS_PER_WINDOW``, so a window read at
    ``now`` covers the slot of ``now`` and the ones before it: between ``width_s - slot`` and
    ``width_s`` seconds. Memory is bounded by the window, not by the clients ever seen: at
    most ``max_clients`` addresses per slot (beyond, requests count without their address and
    the stats say ``capped``). Pure; event time passed in.
    """

    def __init__(self, width_s: float, max_clients: int = MAX_CLIENTS_PER_SLOT) -> None:
        self.width_s = width_s
        self.slot_s = width_s / SLOTS_PER_WINDOW
        self.max_clients = max_clients
        # [slot index, {client: requests}, {proxy: None}, requests over the cap]
        self._slots: deque[list[Any]] = deque()
        self._newest_from = self._newest_to = 0.0  # event times of the newest slot

    def add(self, time: float, client: str | None, proxy: str | None, count: int = 1) -> None:
        """Add ``count`` requests of ``client`` logged by ``proxy`` at event ``time``."""
        if self._newest_from <= time < self._newest_to:  # the common case: the newest slot
            slot = self._slots[-1]
        else:
            found = self._find_or_insert(int(time // self.slot_s))
            if found is None:
                return
            slot = found
        if client is not None:
            clients = slot[1]
            if client in clients:
                clients[client] += count
            elif len(clients) < self.max_clients:
                clients[client] = count
            else:
                slot[3] += count
        if proxy is not None:
            proxies = slot[2]
            if proxy not in proxies and len(proxies) < MAX_PROXIES_PER_SLOT:
                proxies[proxy] = None

    def _find_or_insert(self, index: int) -> list[Any] | None:
        slots = self._slots
        if not slots or slots[-1][0] < index:
            slots.append([index, {}, {}, 0])
            while slots[0][0] <= index - SLOTS_PER_WINDOW:
                slots.popleft()
            self._newest_from, self._newest_to = self._start(index), self._start(index + 1)
            return slots[-1]
        if index <= slots[-1][0] - SLOTS_PER_WINDOW:
            return None  # older than the window
        for slot in reversed(slots):  # late record: walk back a few slots
            if slot[0] == index:
                return slot
            if slot[0] < index:
                break
        new: list[Any] = [index, {}, {}, 0]
        slots.append(new)
        self._slots = deque(sorted(slots, key=lambda s: s[0]))
        return new

    def _start(self, index: int) -> float:
        """Return the first event time ``t`` with ``int(t // slot_s) >= index`` (exactly: the
        product ``index x slot_s`` is rounded, the floor division is not)."""
        slot_s, t = self.slot_s, index * self.slot_s
        while t // slot_s < index:
            t = math.nextafter(t, math.inf)
        while math.nextafter(t, -math.inf) // slot_s >= index:
            t = math.nextafter(t, -math.inf)
        return t

    def stats(self, now: float) -> ClientStats:
        """Return the client distribution of the window that ends at ``now`` (event time)."""
        last = int(now // self.slot_s)
        window = [s for s in self._slots if last - SLOTS_PER_WINDOW < s[0] <= last]
        merged: dict[str, int] = {}
        proxies: set[str] = set()
        capped = False
        for _, clients, logged_by, over in window:
            for client, n in clients.items():
                merged[client] = merged.get(client, 0) + n
            proxies.update(logged_by)
            capped = capped or over > 0
        span = now - (last - SLOTS_PER_WINDOW + 1) * self.slot_s
        return ClientStats(
            clients=len(merged),
            max_requests=max(merged.values(), default=0),
            requests=sum(merged.values()),
            proxies=len(proxies),
            span_s=round(span, 3),
            capped=capped,
        )
