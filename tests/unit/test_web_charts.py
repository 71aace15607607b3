"""The incident page's charts (detector.web.charts): one line per pod and measure, broken where
the pod was down or its readings stopped; the chart template keeps every label text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from detector.report.now import down_spans
from detector.web.charts import Chart, Line, charts
from detector.web.pages import templates

T0 = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)
POD = "pod-a"


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def reading(s: float, value: float, detail: str = "KV cache", pod: str = POD) -> dict[str, Any]:
    """Return a pressure row of bucket ``s`` s after T0 (buckets of 5 s)."""
    return {"time": at(s), "metric": "pressure", "label": pod, "value": value, "detail": detail}


def ceiling(s: float, value: float, detail: str, pod: str = POD) -> dict[str, Any]:
    return {"time": at(s), "metric": "ceiling", "label": pod, "value": value, "detail": detail}


def pressure(series: list[dict[str, Any]], **kw: Any) -> Chart:
    """Return the pressure chart of ``series``, with the death markers of ``kw['down']``."""
    down = kw.get("down", ())
    marks = [(death, "death", pod) for pod, death, _ in down]
    [chart] = charts(series, marks, 0.95, 5.0, down)
    return chart


def xs(points: str) -> list[float]:
    return [float(p.split(",")[0]) for p in points.split()]


def line(chart: Chart, label: str) -> Line:
    [found] = [ln for ln in chart.lines if ln.label == label]
    return found


def test_a_pod_that_died_and_came_back_has_a_break_over_the_death() -> None:
    # KV cache every 10 s; died at 52 s, ready again at 131 s; a stale reading at 80 s
    # (the bucket lies inside the span) is not drawn
    series = [reading(s, 0.2 + s / 1000) for s in range(0, 60, 10)]
    series += [reading(80, 0.0), *(reading(s, 0.15) for s in range(130, 200, 10))]
    chart = pressure(series, down=[(POD, at(52), at(131))])
    kv = line(chart, "pod-a KV cache")
    assert len(kv.segments) == 2
    [death] = [m.x for m in chart.markers]
    before, after = xs(kv.segments[0]), xs(kv.segments[1])
    assert max(before) < death < min(after)
    assert len(before) == 6 and len(after) == 7  # 0..50 s, then 130..190 s: not the 80 s one


def test_with_no_readiness_recorded_the_gap_runs_from_the_death_to_the_next_reading() -> None:
    series = [reading(s, 0.3) for s in (0, 10, 20, 30, 40, 50)]
    chart = pressure(series, down=[(POD, at(22), None)])
    segments = line(chart, "pod-a KV cache").segments
    assert [len(xs(s)) for s in segments] == [3, 3]


def test_readings_further_apart_than_three_intervals_are_not_joined() -> None:
    # every 10 s, then a 30 s step (3 intervals: joined), then a 60 s hole (broken)
    times = [0, 10, 20, 30, 60, 70, 80, 140, 150, 160]
    chart = pressure([reading(s, 0.4) for s in times])
    segments = line(chart, "pod-a KV cache").segments
    assert [len(xs(s)) for s in segments] == [7, 3]


def test_a_lone_reading_between_gaps_still_shows() -> None:
    times = [0, 10, 20, 200, 400, 410, 420]
    segments = line(pressure([reading(s, 0.4) for s in times]), "pod-a KV cache").segments
    assert len(segments) == 3
    lone = xs(segments[1])
    assert len(lone) == 2 and lone[1] - lone[0] == 2.0


def test_gpu_memory_and_kv_cache_of_one_pod_are_two_lines_under_their_own_names() -> None:
    # vLLM pre-reserves 90% of VRAM at start (dcgm-exporter's framebuffer) while its KV cache
    # is 15% used: the store holds both, in different buckets of the same pod
    series = [reading(s, 0.9, "GPU memory") for s in (0, 15, 30, 45)]
    series += [reading(s, 0.15, "KV cache") for s in (5, 20, 35, 50)]
    series += [ceiling(0, 0.93, "GPU memory"), ceiling(5, 0.95, "KV cache")]
    chart = pressure(series)
    assert [ln.label for ln in chart.lines] == ["pod-a GPU memory", "pod-a KV cache"]
    memory, kv = line(chart, "pod-a GPU memory"), line(chart, "pod-a KV cache")
    assert (memory.last, kv.last) == (0.9, 0.15)
    assert [len(xs(s)) for s in memory.segments] == [4]
    assert [len(xs(s)) for s in kv.segments] == [4]
    assert memory.css == "pod0 gpu-memory" and kv.css == "pod0 kv-cache"  # one colour
    assert [label for _, label in chart.rules] == ["GPU memory ceiling 93%", "KV cache ceiling 95%"]


def test_pods_keep_their_colour_across_measures() -> None:
    series = [reading(0, 0.9, "GPU memory", "pod-a"), reading(0, 0.2, "KV cache", "pod-b")]
    series.append(reading(5, 0.2, "KV cache", "pod-a"))
    chart = pressure(series)
    css = {ln.label: ln.css for ln in chart.lines}
    assert css == {
        "pod-a GPU memory": "pod0 gpu-memory",
        "pod-a KV cache": "pod0 kv-cache",
        "pod-b KV cache": "pod1 kv-cache",
    }


def test_down_spans_fold_the_deaths_of_one_span_and_end_at_readiness() -> None:
    view = {
        "victims": [{"pod": "a", "position": 1, "first_oom_at": at(10).isoformat()}],
        "evidence": [
            {"kind": "gpu_oom", "pod": "a", "time": at(10).isoformat()},
            {"kind": "engine_dead", "pod": "a", "time": at(10.01).isoformat()},
            {"kind": "pod_ready", "pod": "a", "time": at(90).isoformat()},
            {"kind": "engine_dead", "pod": "a", "time": at(200).isoformat()},
            {"kind": "pod_ready", "pod": "b", "time": at(5).isoformat()},  # no death: no span
            {"kind": "gpu_oom", "pod": "c", "time": at(50).isoformat()},
            {"kind": "gpu_memory", "pod": "c", "time": at(60).isoformat()},
        ],
    }
    assert down_spans(view) == [("a", at(10), at(90)), ("a", at(200), None), ("c", at(50), None)]


def test_the_chart_template_keeps_labels_as_text() -> None:
    hostile = "<script>alert(1)</script>"
    series = [reading(s, 0.5, "GPU memory", hostile) for s in (0, 10)]
    chart = pressure(series, down=[(hostile, at(5), None)])
    html = templates.env.get_template("chart.html").render(c=chart)
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; GPU memory" in html
    assert html.count("<polyline") == 2  # a break at the death
