"""Align partitions in event time while the consumer catches up (a bounded reorder buffer).

After a restart or a rebalance, one partition's backlog can run minutes ahead of another's:
processed as polled, the correlator's clock would follow the fastest partition, and a stage that
waits for quiet (``contained``) could fire before the slower partition's OOMs arrive. The buffer
holds polled records until every partition that is still *behind* (records left below its high
watermark, or not fetched yet) has been read up to their time: the watermark is the smallest time
of the latest record read from each of those partitions, and records at or before it are
released in time order. Partitions that are caught up do not hold the watermark, so a live
stream is released as soon as it is polled: event time, with a bounded lateness. The consumer
does not pause the partitions ahead: kafka-python 3.0 with Tansu stopped fetching resumed
partitions in our tests, so the buffer's own bounds do that work.

Bounds: at most ``max_records`` held (the oldest are released beyond that) and at most
``max_hold_s`` seconds of wall-clock time without a release (then everything is released), so a
partition that reports lag but delivers nothing cannot stall the stream or grow memory.
Times are Kafka record timestamps, ms since the epoch.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable

from detector.stream.consumer import Partition, Record

NO_TIME = -(2**62)  # the watermark of a partition that is behind but has delivered nothing yet


class ReorderBuffer:
    """Hold records until the partitions behind have caught up to their event time."""

    def __init__(
        self, max_records: int, max_hold_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_records = max_records
        self._max_hold_s = max_hold_s
        self._clock = clock
        self._heap: list[tuple[int, int, Record]] = []
        self._seq = itertools.count()
        self._seen_ms: dict[Partition, int] = {}
        self._last_release = clock()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, records: Iterable[Record]) -> None:
        """Hold ``records`` (each partition's in offset order) and note their partitions' times."""
        for record in records:
            heapq.heappush(self._heap, (record.timestamp_ms, next(self._seq), record))
            # the partition's position in time: its latest record's time (not the maximum, so
            # that one record stamped far ahead does not let the others run past it)
            self._seen_ms[(record.topic, record.partition)] = record.timestamp_ms

    def watermark(self, behind: Iterable[Partition]) -> int | None:
        """Return the time up to which every partition behind was read; None when none is."""
        times = [self._seen_ms.get(p, NO_TIME) for p in behind]
        return min(times) if times else None

    def release(self, behind: Iterable[Partition]) -> list[Record]:
        """Pop and return, oldest first, what may be processed now (see module docstring)."""
        mark = self.watermark(behind)
        now = self._clock()
        if mark is None or now - self._last_release > self._max_hold_s:
            mark = None  # nothing behind, or stalled: release everything
        out = []
        heap = self._heap
        while heap and (mark is None or heap[0][0] <= mark or len(heap) > self._max_records):
            out.append(heapq.heappop(heap)[2])
        if out or not heap:
            self._last_release = now
        return out

    def first_held(self, unprocessed: Iterable[Record] = ()) -> dict[Partition, Record]:
        """Return the held record of smallest offset per partition (commits stay below it),
        counting ``unprocessed`` (released, not processed yet) as held."""
        first: dict[Partition, Record] = {}
        for r in itertools.chain((r for _, _, r in self._heap), unprocessed):
            key = (r.topic, r.partition)
            if key not in first or r.offset < first[key].offset:
                first[key] = r
        return first

    def clear(self) -> None:
        """Drop everything held (after a seek: the records will be polled again)."""
        self._heap.clear()
        self._seen_ms.clear()
        self._last_release = self._clock()
