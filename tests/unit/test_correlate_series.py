"""Per-workload time series in 5 s event-time buckets (pure): counts, maxima, bounds."""

from __future__ import annotations

from typing import Any

import pytest

from detector.config import CorrelateSettings
from detector.correlate.correlator import RESERVATION_MARGIN, Correlator
from detector.correlate.series import (
    CEILING,
    ERRORS_5XX,
    GPU_MEMORY,
    KV_CACHE,
    PRESSURE,
    REQUESTS,
    SERIES_BUCKET_S,
    SHED_429,
    SeriesBook,
    SeriesPoint,
)
from detector.correlate.state import IncidentOpened, Stage, StageChanged
from detector.events.model import Signal, SignalKind, SourcePos

T0 = 1_732_890_000.0  # a multiple of the bucket: bucket n starts at T0 + 5 n
PODS = [f"vllm-llama-7d9f8b6c5d-{s}" for s in ("x2k4p", "b7q9z", "m4n8w")]
UPSTREAM = "llm-vllm-llama-8000"
K = SignalKind
_line = iter(range(1, 10**9))


def sig(kind: SignalKind, t: float, pod: str | None = None, **attrs: Any) -> Signal:
    ns = "ingress-nginx" if kind is K.LB_RESPONSE else "llm"
    return Signal(kind, T0 + t, SourcePos("rec", next(_line)), ns, pod, "vllm", attrs=attrs)


def lb(t: float, status: int, **attrs: Any) -> Signal:
    return sig(K.LB_RESPONSE, t, status=status, upstream=UPSTREAM, **attrs)


def oom(t: float, pod: str) -> Signal:
    return sig(K.GPU_OOM, t, pod, framework="pytorch", bytes_tried=2 << 30)


def lb_values(points: list[SeriesPoint]) -> dict[tuple[str, float], float]:
    """Return (metric, seconds after T0) -> value of the load-balancer points."""
    return {(p.metric, p.time - T0): p.value for p in points if p.label == ""}


# --- the book alone -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("responses", "expected"),
    [
        pytest.param(
            [(0.0, 200, 1), (4.9, 200, 1), (5.0, 200, 1)],
            {(REQUESTS, 0): 2, (ERRORS_5XX, 0): 0, (SHED_429, 0): 0,
             (REQUESTS, 5): 1, (ERRORS_5XX, 5): 0, (SHED_429, 5): 0},
            id="bucket-edges",
        ),
        pytest.param(
            [(1, 200, 1), (1, 429, 1), (1, 500, 1), (1, 502, 1), (1, 503, 1), (1, 504, 1),
             (1, 499, 1), (1, 404, 1), (1, 599, 1)],
            {(REQUESTS, 0): 9, (ERRORS_5XX, 0): 5, (SHED_429, 0): 1},
            id="5xx-and-429-apart",
        ),
        pytest.param(
            [(2, 503, 40), (3, 429, 7), (12, 200, 3)],
            {(REQUESTS, 0): 47, (ERRORS_5XX, 0): 40, (SHED_429, 0): 7,
             (REQUESTS, 10): 3, (ERRORS_5XX, 10): 0, (SHED_429, 10): 0},
            id="counts-and-an-empty-bucket-between",
        ),
        pytest.param(
            [(12, 200, 1), (1, 503, 1), (13, 429, 1)],
            {(REQUESTS, 0): 1, (ERRORS_5XX, 0): 1, (SHED_429, 0): 0,
             (REQUESTS, 10): 2, (ERRORS_5XX, 10): 0, (SHED_429, 10): 1},
            id="late-record-in-its-own-bucket",
        ),
    ],
)  # fmt: skip
def test_responses_are_counted_per_bucket(
    responses: list[tuple[float, int, int]], expected: dict[tuple[str, float], float]
) -> None:
    book: SeriesBook[str] = SeriesBook()
    for t, status, count in responses:
        book.add_responses("w", T0 + t, status, count)
    assert lb_values(book.points("w", T0)) == expected


@pytest.mark.parametrize(
    ("readings", "expected"),
    [
        pytest.param(
            [(0, "a", GPU_MEMORY, 0.5), (1, "a", GPU_MEMORY, 0.9), (2, "a", GPU_MEMORY, 0.7)],
            {("a", 0): (0.9, GPU_MEMORY)},
            id="max-in-the-bucket",
        ),
        pytest.param(
            [(0, "a", GPU_MEMORY, 0.5), (1, "b", GPU_MEMORY, 0.9), (6, "a", GPU_MEMORY, 0.6)],
            {("a", 0): (0.5, GPU_MEMORY), ("b", 0): (0.9, GPU_MEMORY), ("a", 5): (0.6, GPU_MEMORY)},
            id="per-pod-never-summed",
        ),
        pytest.param(
            [(0, "a", GPU_MEMORY, 0.97), (1, "a", KV_CACHE, 0.4), (2, "a", GPU_MEMORY, 0.99)],
            {("a", 0): (0.4, KV_CACHE)},
            id="kv-cache-wins-the-bucket",
        ),
        pytest.param(
            [(0, "a", GPU_MEMORY, 0.97), (6, "a", GPU_MEMORY, 0.98), (7, "a", KV_CACHE, 0.4)],
            {("a", 5): (0.4, KV_CACHE)},
            id="a-pod-with-kv-cache-is-charted-by-it-alone",
        ),
        pytest.param(
            [(0, "a", KV_CACHE, 0.8), (1, "a", KV_CACHE, 0.99), (2, "a", KV_CACHE, 0.3)],
            {("a", 0): (0.99, KV_CACHE)},
            id="kv-cache-max",
        ),
    ],
)
def test_pressure_keeps_the_highest_ratio_per_pod_and_bucket(
    readings: list[tuple[float, str, str, float]], expected: dict[tuple[str, float], Any]
) -> None:
    book: SeriesBook[str] = SeriesBook()
    for t, pod, detail, ratio in readings:
        book.add_pressure("w", T0 + t, pod, detail, ratio, 0.95)
    points = book.points("w", T0)
    got = {(p.label, p.time - T0): (p.value, p.detail) for p in points if p.metric == PRESSURE}
    assert got == expected
    ceilings = {(p.label, p.time - T0) for p in points if p.metric == CEILING}
    assert ceilings == set(expected)


def test_the_forecast_reads_every_measure_of_a_bucket() -> None:
    book: SeriesBook[str] = SeriesBook()
    book.add_pressure("w", T0, "a", GPU_MEMORY, 0.97, 1.0)
    book.add_pressure("w", T0 + 1, "a", KV_CACHE, 0.4, 0.95)
    got = sorted(book.pressure_since("w", T0))
    assert got == [(T0, "a", 0.4, 0.95, KV_CACHE), (T0, "a", 0.97, 1.0, GPU_MEMORY)]


def test_points_are_ordered_and_cut_to_the_span() -> None:
    book: SeriesBook[str] = SeriesBook()
    for t in (0, 5, 10, 15, 20):
        book.add_responses("w", T0 + t, 200, 1)
        book.add_pressure("w", T0 + t, "a", GPU_MEMORY, 0.5, 0.95)
    points = book.points("w", T0 + 7, T0 + 16)
    assert [(p.metric, p.time - T0) for p in points] == [
        (CEILING, 5), (CEILING, 10), (CEILING, 15),
        (ERRORS_5XX, 5), (ERRORS_5XX, 10), (ERRORS_5XX, 15),
        (PRESSURE, 5), (PRESSURE, 10), (PRESSURE, 15),
        (REQUESTS, 5), (REQUESTS, 10), (REQUESTS, 15),
        (SHED_429, 5), (SHED_429, 10), (SHED_429, 15),
    ]  # fmt: skip
    assert book.points("other", T0) == []


def test_since_returns_only_the_buckets_changed_after_a_version() -> None:
    book: SeriesBook[str] = SeriesBook()
    book.add_responses("w", T0 + 1, 200, 1)
    book.add_responses("w", T0 + 6, 200, 1)
    seen = book.version
    assert book.points("w", T0, since=seen) == []
    book.add_responses("w", T0 + 7, 503, 1)  # the second bucket grows
    book.add_pressure("w", T0 + 2, "a", GPU_MEMORY, 0.5, 0.95)
    book.add_pressure("w", T0 + 3, "a", GPU_MEMORY, 0.4, 0.95)  # lower: no change
    changed = book.points("w", T0, since=seen)
    assert {(p.metric, p.label, p.time - T0) for p in changed} == {
        (REQUESTS, "", 5), (ERRORS_5XX, "", 5), (SHED_429, "", 5),
        (PRESSURE, "a", 0), (CEILING, "a", 0),
    }  # fmt: skip
    assert lb_values(changed)[(ERRORS_5XX, 5)] == 1


def test_drop_before_forgets_whole_buckets_and_empty_workloads() -> None:
    book: SeriesBook[str] = SeriesBook()
    for t in range(0, 30):
        book.add_responses("w", T0 + t, 200, 1)
        book.add_pressure("w", T0 + t, "a", GPU_MEMORY, 0.5, 0.95)
    book.drop_before("w", T0 + 12)  # the bucket holding 12 s (10-15) stays
    times = sorted({p.time - T0 for p in book.points("w", T0)})
    assert times == [10, 15, 20, 25]
    book.drop_before("w", T0 + 100)
    assert "w" not in book.workloads
    book.drop_before("never-seen", T0)  # nothing to do


# --- fed by the correlator ----------------------------------------------------------------


def test_correlator_series_covers_the_window_before_the_incident_and_after() -> None:
    corr = Correlator(CorrelateSettings(window_s=60.0))
    signals = [lb(t, 200) for t in range(0, 100)] + [lb(t + 0.5, 503) for t in range(90, 100)]
    signals += [lb(95.2, 429), oom(92, PODS[0])]
    out = corr.observe_all(sorted(signals, key=lambda s: s.time))
    (opened,) = [d for d in out if isinstance(d, IncidentOpened)]
    points = corr.series(opened.key)
    values = lb_values(points)
    first = min(t for _, t in values)
    assert first == (int((opened.time - 60.0) // SERIES_BUCKET_S) * SERIES_BUCKET_S) - T0  # 30
    assert max(t for _, t in values) == 95
    assert values[(REQUESTS, 90)] == 10
    assert values[(ERRORS_5XX, 90)] == 5
    assert values[(REQUESTS, 95)] == 11
    assert values[(ERRORS_5XX, 95)] == 5
    assert values[(SHED_429, 95)] == 1
    assert sum(v for (m, _), v in values.items() if m == REQUESTS) == 100 - 30 + 10 + 1
    assert corr.series("no-such-incident") == []


def test_correlator_counts_a_counters_increase_not_its_total() -> None:
    corr = Correlator(CorrelateSettings())
    series = f'nginx_ingress_controller_requests{{status="503",upstream="{UPSTREAM}"}}'
    for t, total in ((0, 1000), (10, 1040), (20, 1100)):
        corr.observe(lb(t, 503, counter_total=total, series=series, count=None))
    (ref,) = corr.series_book.workloads
    values = lb_values(corr.series_book.points(ref, T0))
    assert values[(ERRORS_5XX, 10)] == 40
    assert values[(ERRORS_5XX, 20)] == 60
    assert (ERRORS_5XX, 0) not in values  # the first sample sets the baseline


def test_an_nginx_error_log_line_is_no_second_response() -> None:
    """nginx logs an access line for every request, the failed ones too; the error-log line
    of an upstream failure tells of the same request (or of one another upstream served)."""
    corr = Correlator(CorrelateSettings())
    corr.observe(lb(1.0, 504, error_log=True, error="upstream_timed_out"))
    corr.observe(lb(1.0, 504))  # the access line of the same request
    corr.observe(lb(2.0, 502, error_log=True, error="connect_failed"))
    corr.observe(lb(2.0, 200))  # the next upstream answered
    (ref,) = corr.series_book.workloads
    values = lb_values(corr.series_book.points(ref, T0))
    assert (values[(REQUESTS, 0)], values[(ERRORS_5XX, 0)]) == (2, 1)


def gpu(t: float, pod: str, used_gib: int, total_gib: int = 80) -> Signal:
    return sig(K.GPU_MEMORY, t, pod, used_bytes=used_gib << 30, total_bytes=total_gib << 30,
               uuid=f"GPU-{pod}")  # fmt: skip


def kv(t: float, pod: str, usage: float) -> Signal:
    return sig(K.ENGINE_PRESSURE, t, pod, engine="vllm", kv_cache_usage=usage)


def pressure(corr: Correlator) -> dict[tuple[str, float], tuple[float, float, str]]:
    """Return (pod, seconds after T0) -> (ratio, ceiling, detail) of every workload."""
    out = {}
    book = corr.series_book
    for ref in book.workloads:
        points = book.points(ref, T0)
        ceilings = {(p.label, p.time): p.value for p in points if p.metric == CEILING}
        for p in points:
            if p.metric == PRESSURE:
                out[(p.label, p.time - T0)] = (p.value, ceilings[(p.label, p.time)], p.detail)
    return out


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        pytest.param(
            [gpu(0, PODS[0], 40), gpu(2, PODS[0], 76), gpu(3, PODS[1], 20)],
            {(PODS[0], 0): (0.95, 0.95, GPU_MEMORY), (PODS[1], 0): (0.25, 0.95, GPU_MEMORY)},
            id="gpu-memory-against-the-ceiling",
        ),
        pytest.param(
            [kv(0, PODS[0], 0.5), kv(1, PODS[0], 0.97), gpu(2, PODS[0], 72)],
            {(PODS[0], 0): (0.97, 0.95, KV_CACHE)},
            id="vllm-with-kv-metrics-vram-is-not-pressure",
        ),
        pytest.param(
            [sig(K.ENGINE_CONFIG, 0, PODS[0], engine="vllm", gpu_memory_utilization=0.9),
             gpu(1, PODS[0], 72)],
            {(PODS[0], 0): (0.9, 0.9 + RESERVATION_MARGIN, GPU_MEMORY)},
            id="reserved-engine-against-its-reservation",
        ),
        pytest.param(
            [sig(K.GPU_MEMORY, 0, None, used_bytes=1, total_bytes=2, uuid="GPU-x")],
            {},
            id="no-pod-no-series",
        ),
    ],
)  # fmt: skip
def test_correlator_feeds_pressure(
    signals: list[Signal], expected: dict[tuple[str, float], tuple[float, float, str]]
) -> None:
    corr = Correlator(CorrelateSettings())
    corr.observe_all(signals)
    got = pressure(corr)
    assert got.keys() == expected.keys()
    for key, (ratio, ceiling, detail) in expected.items():
        assert got[key] == (pytest.approx(ratio), pytest.approx(ceiling), detail)


def test_buckets_are_bounded_by_the_window_without_an_incident() -> None:
    corr = Correlator(CorrelateSettings(window_s=60.0))
    for t in range(0, 3600):
        corr.observe(lb(t, 200))
        if t % 10 == 0:
            corr.observe(gpu(t, PODS[t % 3], 40))
    (ws,) = corr.series_book.workloads.values()
    bound = 60.0 / SERIES_BUCKET_S + 60.0 / 4 / SERIES_BUCKET_S + 2  # window + a sweep's lag
    assert len(ws.lb) <= bound
    assert len(ws.pressure) <= 3 * bound


def test_an_open_incident_keeps_its_span_and_a_resolved_one_ends_at_resolution() -> None:
    cfg = CorrelateSettings(window_s=60.0, contained_after_s=60.0, quiet_s=120.0)
    corr = Correlator(cfg)
    decisions = []
    for t in range(0, 1200):
        if t == 300:
            decisions += corr.observe(oom(300, PODS[0]))
        decisions += corr.observe(lb(t, 200))
    (opened,) = [d for d in decisions if isinstance(d, IncidentOpened)]
    resolved = [d for d in decisions if isinstance(d, StageChanged) and d.stage is Stage.RESOLVED]
    assert resolved  # contained after 60 s, resolved 120 s later
    # its span was held while open, and dropped once resolved and out of the window
    (ws,) = corr.series_book.workloads.values()
    assert min(ws.lb) * SERIES_BUCKET_S >= T0 + 1200 - 60 - 15 - SERIES_BUCKET_S
    assert corr.series(opened.key) == []  # resolved long ago: its buckets are gone

    corr = Correlator(cfg)
    for t in range(0, 485):  # stop right after the resolution (at 480)
        if t == 300:
            corr.observe(oom(300, PODS[0]))
        corr.observe(lb(t, 200))
    times = [p.time for p in corr.series(opened.key) if p.metric == REQUESTS]
    assert min(times) == T0 + 240  # opened at 300, minus the 60 s window
    assert max(times) <= resolved[0].time
    assert max(times) == int(resolved[0].time // SERIES_BUCKET_S) * SERIES_BUCKET_S
