"""The next-victim forecast on recorded pressure series, and its place in the correlator.

The recording is the bundled cascade (``examples/cascade``: four vLLM pods of one
Deployment; its ``gpu-metrics.jsonl`` holds DCGM framebuffer gauges every 15 s and vLLM's
``vllm:kv_cache_usage_perc`` every 30 s, as the two exporters scrape them).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from detector.config import CorrelateSettings
from detector.correlate.correlator import NEXT_VICTIM, Correlator
from detector.correlate.forecast import (
    MIN_SAMPLES,
    NextVictim,
    PressureSample,
    forecast,
    huber_trend,
    to_announce,
)
from detector.correlate.state import EvidenceAdded, VictimAdded
from detector.events.model import Signal, SignalKind, SourcePos
from detector.pipeline import merged

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
POD = "vllm-llama-t4pz2q9s6-"
WINDOW_S, HORIZON_S = 120.0, 300.0


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def recorded() -> tuple[list[PressureSample], list[PressureSample]]:
    """Return the recording's (KV-cache usage, framebuffer used/total) samples per pod.

    KV cache is judged against the 0.95 ceiling; VRAM against vLLM's reservation 0.90 + 0.07
    (the correlator's ``RESERVATION_MARGIN``), readings under 0.90 - 0.07 left out (a pod
    loading its weights), as the correlator does.
    """
    kv, fb = [], []
    frames: dict[tuple[str, float], dict[str, int]] = {}
    with (CASCADE / "gpu-metrics.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            r = json.loads(line)
            pod, t = r["labels"]["pod"], _time(r["timestamp"])
            if r["name"] == "vllm:kv_cache_usage_perc":
                kv.append(PressureSample(t, pod, float(r["value"]), 0.95))
            elif r["name"].startswith("DCGM_FI_DEV_FB_"):
                frames.setdefault((pod, t), {})[r["name"]] = int(r["value"])
    for (pod, t), v in frames.items():
        used, free = v["DCGM_FI_DEV_FB_USED"], v["DCGM_FI_DEV_FB_FREE"]
        fb.append(PressureSample(t, pod, used / (used + free), 0.97, 0.83))
    return kv, fb


def deaths() -> dict[str, float]:
    """Return pod -> its first GPU OOM in the recording's container logs."""
    out: dict[str, float] = {}
    for parsed in merged([CASCADE / "container-logs.jsonl"]):
        for s in parsed.signals:
            if s.kind is SignalKind.GPU_OOM and s.pod and s.pod not in out:
                out[s.pod] = s.time
    return out


def survivors_at(samples: list[PressureSample], now: float, dead: dict[str, float]) -> list:
    """Return the samples of the pods still alive at ``now`` (the correlator's survivors)."""
    return [s for s in samples if not (s.pod in dead and dead[s.pod] <= now)]


@pytest.mark.parametrize("measure", ["kv_cache", "framebuffer"])
def test_every_named_survivor_of_the_recording_dies_after_it_is_named(measure: str) -> None:
    kv, fb = recorded()
    samples = kv if measure == "kv_cache" else fb
    dead = deaths()
    first = min(dead.values())
    named: dict[str, tuple[float, float]] = {}  # pod -> (first named at, its ETA then)
    for step in range(0, 200):  # every 5 s from the first death, as the correlator fits
        now = first + 5.0 * step
        for risk in forecast(
            survivors_at(samples, now, dead), now, window_s=WINDOW_S, horizon_s=HORIZON_S
        ):
            named.setdefault(risk.pod, (now, risk.eta_s))
    # each of the three survivors of the first death is named before its own death
    assert set(named) == set(dead) - {min(dead, key=dead.__getitem__)}
    for pod, (at, _) in named.items():
        assert at < dead[pod], f"{pod} named at {at} after its death at {dead[pod]}"
    if measure == "kv_cache":  # KV cache climbs first: the earliest warning, a minute ahead
        lead = max(dead[p] - at for p, (at, _) in named.items())
        assert lead >= 60.0


def test_the_recording_names_the_rising_survivors_and_not_the_flat_ones() -> None:
    kv, _ = recorded()
    dead = deaths()
    first = min(dead.values())
    # before the burst every pod hovers at 15-26 % KV cache: nobody is at risk
    calm = [s for s in kv if s.time < first - 60.0]
    for now in sorted({s.time for s in calm})[MIN_SAMPLES:]:
        assert forecast(calm, now, window_s=WINDOW_S, horizon_s=HORIZON_S) == []
    # the pods come back after the cascade and stay flat: nobody is at risk either
    after = max(dead.values()) + 120.0
    assert forecast(kv, after + 120.0, window_s=WINDOW_S, horizon_s=HORIZON_S) == []


def samples(values: list[float | None], pod: str = "p", step_s: float = 15.0) -> list:
    """Return one reading per ``step_s`` ending at t=0 (None: a gap in the scrapes)."""
    start = -step_s * (len(values) - 1)
    return [
        PressureSample(start + i * step_s, pod, v, 0.95)
        for i, v in enumerate(values)
        if v is not None
    ]


def one(values: list[float | None], **kw: Any) -> NextVictim | None:
    found = forecast(samples(values, **kw), 0.0, window_s=WINDOW_S, horizon_s=HORIZON_S)
    return found[0] if found else None


@pytest.mark.parametrize(
    ("values", "at_risk"),
    [
        ([0.50, 0.55, 0.60, 0.65, 0.70], True),  # rising 0.33 %/s: 0.95 in ~75 s
        ([0.60, 0.60, 0.60, 0.60, 0.60], False),  # constant
        ([0.60, 0.61, 0.59, 0.60, 0.61, 0.60], False),  # noise around a level
        ([0.90, 0.85, 0.80, 0.75, 0.70], False),  # falling
        ([0.70, 0.80], False),  # too few samples (MIN_SAMPLES)
        ([0.40, 0.41, 0.42, 0.43, 0.44], False),  # rising, but past the horizon
        ([0.50, 0.55, 0.99, 0.65, 0.70], True),  # one spike does not hide the trend
        ([0.60, 0.60, 0.60, 0.60, 0.97], True),  # already over the ceiling: ETA 0
    ],
)
def test_who_is_at_risk(values: list[float | None], at_risk: bool) -> None:
    assert (one(values) is not None) is at_risk


def test_eta_of_a_steady_rise_and_over_the_ceiling() -> None:
    rising = one([0.50, 0.55, 0.60, 0.65, 0.70])
    assert rising is not None and rising.eta_s == pytest.approx(75.0, abs=3.0)
    assert rising.summary() == f"next victim at risk: pod p in ~{rising.eta_s:.0f} s"
    over = one([0.60, 0.60, 0.60, 0.60, 0.97])
    assert over is not None and over.eta_s == 0.0 and over.ratio == 0.97
    assert over.summary() == "next victim at risk: pod p, at its ceiling now"


def test_gaps_are_dropped_not_read_as_zero() -> None:
    with_gaps = one([0.50, None, 0.60, None, None, 0.75], step_s=10.0)
    assert with_gaps is not None and with_gaps.samples == 3
    assert with_gaps.eta_s == pytest.approx(40.0, abs=3.0)  # 0.01/s from 0.75 at t=0
    assert one([0.50, None, None, None, 0.60], step_s=10.0) is None  # two readings: too few


def test_readings_under_the_floor_are_an_engine_loading_not_a_trend() -> None:
    # a restarted vLLM pod: 0 -> its reservation 0.90 in a minute, then flat at it
    loading = [
        PressureSample(t, "p", v, 0.97, 0.83)
        for t, v in [(-75, 0.0), (-60, 0.2), (-45, 0.9), (-30, 0.9), (-15, 0.9), (0, 0.9)]
    ]
    assert forecast(loading, 0.0, window_s=WINDOW_S, horizon_s=HORIZON_S) == []


def test_old_and_future_readings_are_outside_the_window() -> None:
    old = samples([0.50, 0.60, 0.70, 0.80, 0.90], step_s=60.0)  # rising, minutes ago
    assert forecast(old, 0.0, window_s=WINDOW_S, horizon_s=HORIZON_S) == []
    late = samples([0.5, 0.6, 0.7])
    assert forecast(late, -30.0, window_s=WINDOW_S, horizon_s=HORIZON_S) == []  # all after


def nv(pod: str, eta_s: float, at: float) -> NextVictim:
    return NextVictim(pod, eta_s, at, 0.8, 0.95, 0.001, 5)


@pytest.mark.parametrize(
    ("found", "told"),
    [
        ([], None),
        ([nv("a", 100, 10)], "a"),  # as expected: 110 - 10 s
        ([nv("a", 40, 10)], "a"),  # moved by 60 s: the trend changed
        ([nv("b", 90, 10), nv("a", 100, 10)], None),  # b a little sooner: no turn-taking
        ([nv("b", 20, 10), nv("a", 100, 10)], "b"),  # b a lot sooner
        ([nv("b", 90, 10)], "b"),  # a is no longer at risk
    ],
)
def test_announcements_are_not_repeated(found: list[NextVictim], told: str | None) -> None:
    last = nv("a", 110, 0)
    got = to_announce(found, last)
    if found and found[0].pod == "a" and found[0].eta_s == 100:
        assert got is None  # the same forecast, counted down
    else:
        assert (got.pod if got is not None else None) == told


def test_a_countdown_is_announced_as_the_time_left_halves() -> None:
    last, told = None, []
    for at in range(0, 200, 5):  # a steady rise: 200 s left at t=0
        found = [nv("a", 200.0 - at, float(at))]
        got = to_announce(found, last)
        if got is not None:
            last = got
            told.append(got.eta_s)
    assert told == [200.0, 100.0, 50.0, 25.0, 10.0]


# --- the correlator -----------------------------------------------------------------------


def test_the_correlator_announces_the_next_victim_of_the_bundled_cascade() -> None:
    corr = Correlator(CorrelateSettings())
    files = sorted(CASCADE.glob("*.jsonl"))
    announced: list[EvidenceAdded] = []
    died: dict[str, float] = {}
    for parsed in merged(files):
        for signal in parsed.signals:
            for d in corr.observe(signal):
                if isinstance(d, EvidenceAdded) and d.kind == NEXT_VICTIM:
                    announced.append(d)
                elif isinstance(d, VictimAdded):
                    died[d.pod] = d.time
    assert len(died) == 4
    assert 1 <= len(announced) <= 8  # re-announced on news only: no flood
    for d in announced:
        pod = str(d.signal.attrs["pod"])
        eta = float(d.signal.attrs["eta_s"])  # type: ignore[arg-type]
        when = f" in ~{eta:.0f} s" if eta >= 1 else ", at its ceiling now"
        assert d.summary == f"next victim at risk: pod {pod}{when}"
        assert pod in died and d.signal.time < died[pod]  # named before its death
        # the record of the pod's latest pressure reading: a metric sample or an engine line
        assert d.signal.pod == pod
        assert d.signal.kind in (SignalKind.ENGINE_PRESSURE, SignalKind.GPU_MEMORY)
    # from the headroom beside the KV pool: the last survivor, whose VRAM climbed past half of
    # it for three scrapes; the others jumped between two 15 s scrapes, with no warning
    last = sorted(died, key=died.__getitem__)[-1]
    assert announced[0].signal.attrs["pod"] == last
    key = announced[0].key
    ctx = corr.context(key)
    assert ctx is not None  # resolved by the end: the forecast went with the open stages
    assert ctx.stage == "resolved" or ctx.next_victim is None


PODS = [f"vllm-llama-7d9f8b6c5d-{s}" for s in ("x2k4p", "b7q9z", "m4n8w")]


def _sig(kind: SignalKind, t: float, pod: str, n: int, **attrs: Any) -> Signal:
    return Signal(kind, t, SourcePos("m.jsonl", n), "llm", pod, attrs=attrs)


def _kv(t: float, pod: str, n: int, usage: float) -> Signal:
    return _sig(SignalKind.ENGINE_PRESSURE, t, pod, n, kv_cache_usage=usage)


def _fb(t: float, pod: str, n: int, ratio: float) -> Signal:
    total = 80 * 2**30
    return _sig(SignalKind.GPU_MEMORY, t, pod, n, used_bytes=int(ratio * total),
                total_bytes=total, uuid=f"GPU-{pod}")  # fmt: skip


def test_a_kv_cache_that_fills_up_names_no_next_victim() -> None:
    """vLLM fills its KV pool by design and preempts when it is full: no sign of a death."""
    corr = Correlator(CorrelateSettings())
    a, b, _ = PODS
    t = 1_000_000.0
    corr.observe(_sig(SignalKind.GPU_OOM, t, a, 1, framework="pytorch"))
    out = []
    for i in range(12):
        out += corr.observe(_kv(t + 5 * i, b, 2 + i, 0.80 + 0.02 * i))
    assert [d for d in out if isinstance(d, EvidenceAdded) and d.kind == NEXT_VICTIM] == []


def test_the_forecast_runs_only_with_an_open_incident_and_at_most_every_5_s() -> None:
    corr = Correlator(CorrelateSettings())
    a, b, c = PODS
    t = 1_000_000.0
    # a rising survivor, no incident: nothing is fitted
    for i in range(6):
        assert corr.observe(_fb(t + 15 * i, b, i, 0.5 + 0.05 * i)) == []
    opened = corr.observe(_sig(SignalKind.GPU_OOM, t + 80, a, 100, framework="pytorch"))
    inc = next(iter(corr.workloads.values())).incident
    assert inc is not None and inc.next_victim is None and opened
    # a record at the same instant moves no clock: no forecast yet
    out = corr.observe(_fb(t + 80, b, 101, 0.76))
    assert [d for d in out if isinstance(d, EvidenceAdded) and d.kind == NEXT_VICTIM] == []
    # the next record that moves the clock fits once
    out = corr.observe(_sig(SignalKind.POD_READY, t + 82, c, 102))
    told = [d for d in out if isinstance(d, EvidenceAdded) and d.kind == NEXT_VICTIM]
    assert len(told) == 1 and told[0].signal.attrs["pod"] == b
    fitted = inc.next_victim
    assert fitted is not None and fitted.fitted_at == t + 82 and fitted.pod == b
    for i in range(3):  # within 5 s of event time: not fitted again, however many samples
        corr.observe(_fb(t + 83 + i, b, 103 + i, 0.8))
    assert inc.next_victim is fitted
    corr.observe(_sig(SignalKind.POD_READY, t + 88, c, 110))
    assert inc.next_victim is not fitted  # 5 s later, after new samples: fitted again
    ctx = corr.context(inc.key)
    assert ctx is not None and ctx.next_victim == inc.next_victim
    # the victim itself is never its own next victim
    assert all(d.signal.attrs["pod"] != a for d in told)


def test_the_record_path_and_the_cli_import_no_analysis_library() -> None:
    code = (
        "import sys, detector.cli.main, detector.stream.app, detector.pipeline; "
        "from detector.correlate.forecast import PressureSample, forecast; "
        "samples = [PressureSample(float(t), 'p', 0.5 + 0.01 * t, 0.95) for t in range(30)]; "
        "assert forecast(samples, 29.0, window_s=300.0, horizon_s=300.0); "
        "loaded = {'sklearn', 'pandas', 'matplotlib', 'numpy'} & set(sys.modules); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("seed", range(8))
def test_the_trend_agrees_with_scikit_learns_huber_regression(seed: int) -> None:
    # scikit-learn's HuberRegressor as the reference (it estimates the scale jointly, Owen
    # 2007; huber_trend by MAD each round): the same line within a few percent of the slope
    from sklearn.linear_model import HuberRegressor

    rng = random.Random(seed)
    x = [-5.0 * i for i in range(24)][::-1]  # two minutes of 5 s buckets
    y = [0.6 + 0.002 * t + rng.gauss(0.0, 0.01) for t in x]
    for i in rng.sample(range(len(x)), 3):  # spikes and late scrapes
        y[i] += rng.choice((0.25, -0.25))
    slope, level = huber_trend(x, y)
    reference = HuberRegressor(epsilon=1.35, alpha=0.0).fit([[t] for t in x], y)
    assert slope == pytest.approx(float(reference.coef_[0]), rel=0.1)
    assert level == pytest.approx(float(reference.intercept_), abs=0.01)
    assert slope == pytest.approx(0.002, rel=0.2)  # and the spikes did not tilt it


def test_the_trend_of_a_line_and_of_degenerate_input() -> None:
    assert huber_trend([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 7.0]) == pytest.approx((2.0, 1.0))
    assert huber_trend([0.0, 1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 50.0, 7.0, 9.0])[0] == (
        pytest.approx(2.0, rel=0.05)
    )
    assert huber_trend([2.0, 2.0, 2.0], [0.1, 0.2, 0.3]) == pytest.approx((0.0, 0.2))
