"""The reorder buffer: event-time release across partitions, and its two bounds."""

from __future__ import annotations

from detector.stream.consumer import Record
from detector.stream.reorder import ReorderBuffer

A, B = ("a", 0), ("b", 0)


def rec(partition: tuple[str, int], offset: int, ts_ms: int) -> Record:
    return Record(partition[0], partition[1], offset, ts_ms, None, b"x")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_records_past_the_slowest_partition_behind_wait_and_come_out_in_time_order() -> None:
    buf = ReorderBuffer(max_records=100, max_hold_s=5.0, clock=Clock())
    buf.add([rec(A, 0, 10), rec(A, 1, 20), rec(B, 0, 5), rec(B, 1, 15), rec(B, 2, 40)])
    out = buf.release(behind=[A])  # B was read to its end; A has more to come
    assert [(r.topic, r.timestamp_ms) for r in out] == [("b", 5), ("a", 10), ("b", 15), ("a", 20)]
    assert {p: r.offset for p, r in buf.first_held().items()} == {B: 2}
    buf.add([rec(A, 2, 50)])
    assert [r.timestamp_ms for r in buf.release(behind=[])] == [40, 50]


def test_a_partition_behind_that_delivered_nothing_holds_everything() -> None:
    buf = ReorderBuffer(max_records=100, max_hold_s=5.0, clock=Clock())
    buf.add([rec(A, 0, 10)])
    assert buf.release(behind=[B]) == []
    assert len(buf) == 1


def test_a_stall_longer_than_max_hold_releases_everything() -> None:
    clock = Clock()
    buf = ReorderBuffer(max_records=100, max_hold_s=5.0, clock=clock)
    buf.add([rec(A, 0, 10), rec(A, 1, 30)])
    clock.now = 4.0
    assert buf.release(behind=[B]) == []
    clock.now = 5.5
    assert [r.offset for r in buf.release(behind=[B])] == [0, 1]


def test_the_buffer_never_holds_more_than_max_records() -> None:
    buf = ReorderBuffer(max_records=3, max_hold_s=5.0, clock=Clock())
    buf.add([rec(A, i, 100 - i) for i in range(5)])
    out = buf.release(behind=[B])
    assert [r.timestamp_ms for r in out] == [96, 97]  # the oldest go first
    assert len(buf) == 3


def test_clear_forgets_records_and_partition_times() -> None:
    buf = ReorderBuffer(max_records=10, max_hold_s=5.0, clock=Clock())
    buf.add([rec(A, 0, 10)])
    buf.clear()
    assert len(buf) == 0 and buf.watermark([A]) is not None and buf.release([]) == []
