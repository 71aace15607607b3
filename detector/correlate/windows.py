"""Sliding event-time windows over load-balancer responses (pure, time passed in)."""

from __future__ import annotations

from collections import deque

ERROR_STATUSES = frozenset({502, 503, 504})


class RateWindow:
    """Count requests, 5xx (502/503/504) and 429s in 1-second buckets over ``width_s``.

    Rates are per second of window width. A record older than the window is dropped from
    the rate (it still counts as evidence elsewhere).
    """

    def __init__(self, width_s: float) -> None:
        self.width_s = width_s
        self._buckets: deque[list[int]] = deque()  # [second, total, errors, throttled]
        self.total = 0
        self.errors = 0
        self.throttled = 0

    def add(self, time: float, status: int, count: int = 1) -> None:
        """Add ``count`` responses with HTTP ``status`` at event ``time`` (Unix seconds)."""
        second = int(time)
        err = count if status in ERROR_STATUSES else 0
        thr = count if status == 429 else 0
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

    def _find_or_insert(self, second: int) -> list[int] | None:
        buckets = self._buckets
        if not buckets or buckets[-1][0] < second:
            buckets.append([second, 0, 0, 0])
            self.advance(second)
            return buckets[-1]
        if second < buckets[-1][0] - self.width_s:
            return None
        for bucket in reversed(buckets):  # late record: walk back a few buckets
            if bucket[0] == second:
                return bucket
            if bucket[0] < second:
                break
        new = [second, 0, 0, 0]
        buckets.append(new)
        self._buckets = deque(sorted(buckets, key=lambda b: b[0]))
        return new

    def advance(self, now: float) -> None:
        """Drop buckets older than ``now - width_s``."""
        horizon = now - self.width_s
        buckets = self._buckets
        while buckets and buckets[0][0] <= horizon:
            _, total, err, thr = buckets.popleft()
            self.total -= total
            self.errors -= err
            self.throttled -= thr

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
