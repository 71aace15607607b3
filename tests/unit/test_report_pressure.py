"""The pressure lines every face draws (detector.report.pressure): one per pod and measure,
broken over the pod's down spans and over gaps in its readings (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from detector.report.pressure import PressureLine, pressure_lines, segments

T0 = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_lines_are_by_pod_then_measure_and_keep_their_readings_in_time_order() -> None:
    readings = [
        ("b", "KV cache", at(10), 0.2),
        ("a", "KV cache", at(5), 0.3),
        ("b", "KV cache", at(0), 0.1),
        ("a", "GPU memory", at(0), 0.9),
        ("a", "", at(0), 0.5),  # no measure named
    ]
    lines = pressure_lines(readings, [], 5.0)
    assert [(ln.pod, ln.detail) for ln in lines] == [
        ("a", ""),
        ("a", "GPU memory"),
        ("a", "KV cache"),
        ("b", "KV cache"),
    ]
    assert lines[3] == PressureLine("b", "KV cache", (((at(0), 0.1), (at(10), 0.2)),))


def test_a_line_whose_readings_all_fall_while_its_pod_was_down_is_left_out() -> None:
    readings = [("a", "KV cache", at(20), 0.0), ("b", "KV cache", at(20), 0.4)]
    down = [("a", at(10), at(40)), ("b", at(30), None)]
    assert [ln.pod for ln in pressure_lines(readings, down, 5.0)] == ["b"]


def test_naive_times_are_utc() -> None:
    naive = [("a", "KV cache", at(s).replace(tzinfo=None), 0.3) for s in (0, 10, 20, 30)]
    down = [("a", at(12), None)]
    [line] = pressure_lines(naive, down, 5.0)
    assert [len(s) for s in line.segments] == [2, 2] and line.points == 4


def test_segments_break_at_a_death_between_two_readings_and_at_a_long_gap() -> None:
    pts = [(float(t), t) for t in (0, 10, 20, 30, 40, 100, 110)]
    # interval 10 s (the step across the death not counted): 60 s > 3 intervals
    assert segments(pts, [(25.0, None)], 5.0) == [pts[:3], pts[3:5], pts[5:]]
    assert segments([], [(25.0, None)], 5.0) == []
