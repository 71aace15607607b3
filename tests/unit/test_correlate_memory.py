"""The correlator's state stays bounded by the window while pods come and go (rollouts)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from typing import Any

from detector.config import CorrelateSettings
from detector.correlate.correlator import RESOLVED_KEPT_PER_WORKLOAD, Correlator
from detector.correlate.state import IncidentOpened, StageChanged, WorkloadState
from detector.events.model import Signal, SignalKind, SourcePos

T0 = 1_732_890_000.0
RS_HASH = "7d9f8b6c5d"  # a ReplicaSet hash: the pods resolve to Deployment vllm-llama
K = SignalKind
_line = iter(range(1, 10**9))


def pod_name(n: int) -> str:
    """Return the n-th pod name of the Deployment (5-character suffix, base 36)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    suffix = ""
    for _ in range(5):
        n, d = divmod(n, 36)
        suffix += digits[d]
    return f"vllm-llama-{RS_HASH}-{suffix}"


def sig(kind: SignalKind, t: float, pod: str, **attrs: Any) -> Signal:
    return Signal(kind, T0 + t, SourcePos("rec", next(_line)), "llm", pod, "vllm", attrs=attrs)


def churn(first: int, count: int, every_s: float = 2.0, life_s: float = 60.0) -> Iterator[Signal]:
    """Yield the signals of ``count`` pods, one starting every ``every_s`` and living ``life_s``.

    Each pod reports its GPU memory (its own GPU: nodes come and go too), KV-cache usage and
    preemptions every 10 s of its life, logs its engine configuration once, and is at the KV
    cache ceiling once: every per-pod map of the workload gets an entry per pod.
    """
    events: list[Signal] = []
    for n in range(first, first + count):
        pod, start = pod_name(n), n * every_s
        events.append(sig(K.ENGINE_CONFIG, start, pod, engine="vllm", max_num_seqs=256))
        for i in range(int(life_s // 10)):
            t = start + i * 10
            events.append(sig(K.GPU_MEMORY, t, pod, used_bytes=70 << 30, total_bytes=80 << 30,
                              uuid=f"GPU-{n}"))  # fmt: skip
            usage = 0.99 if i == 1 else 0.5
            events.append(sig(K.ENGINE_PRESSURE, t, pod, engine="vllm", kv_cache_usage=usage,
                              preemptions=i))  # fmt: skip
    yield from sorted(events, key=lambda s: s.time)


def per_pod_sizes(corr: Correlator) -> dict[str, int]:
    (ws,) = corr.workloads.values()
    return {
        "pods": len(ws.pods),
        "gpu_used": len(ws.gpu_used),
        "preemptions": len(ws.preemptions),
        "at_ceiling": len(ws.at_ceiling),
        "resolver": corr.resolver.cached_pods,
    }


def test_thousands_of_pods_leave_state_bounded_by_the_window() -> None:
    cfg = CorrelateSettings()  # window_s 300: about 180 pods of this churn live in one window
    corr = Correlator(cfg)
    peak: dict[str, int] = {}
    for i, signal in enumerate(churn(0, 5000)):
        assert corr.observe(signal) == []  # healthy: nothing to decide
        if i % 500 == 0:
            for key, size in per_pod_sizes(corr).items():
                peak[key] = max(peak.get(key, 0), size)
    # pods of the last window, plus those that went idle since the last sweep (a quarter)
    bound = int((cfg.window_s * 1.25 + 60) / 2.0) + 1
    assert peak["pods"] > 100  # the churn did fill the window
    assert all(size <= bound for size in peak.values()), peak
    (ws,) = corr.workloads.values()
    assert len(ws.engine_config) <= 64  # its own cap: pods log their configuration once


def test_memory_does_not_grow_with_the_pods_ever_seen() -> None:
    corr = Correlator(CorrelateSettings())
    for signal in churn(0, 1500):
        corr.observe(signal)
    more, most = list(churn(1500, 1500)), list(churn(3000, 3000))
    tracemalloc.start()
    try:
        corr.observe_all(more)
        before = tracemalloc.get_traced_memory()[0]
        corr.observe_all(most)  # 3,000 more pods, the same window's worth of them at the end
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # per-pod state kept for ever would be about 0.9 KB per pod here: 2.6 MB
    assert grown < 64 * 1024, f"{grown / 1024:.0f} KiB for 3,000 more pods"


def test_a_pod_seen_again_after_it_was_forgotten_is_resolved_again() -> None:
    corr = Correlator(CorrelateSettings())
    corr.observe(sig(K.ENGINE_PRESSURE, 0, pod_name(1), kv_cache_usage=0.5))
    for t in range(0, 900, 10):
        corr.observe(sig(K.ENGINE_PRESSURE, t, pod_name(2), kv_cache_usage=0.5))
    (ws,) = corr.workloads.values()
    assert list(ws.pods) == [pod_name(2)]
    corr.observe(sig(K.ENGINE_PRESSURE, 900, pod_name(1), kv_cache_usage=0.5))
    assert list(corr.workloads.values()) == [ws]
    assert list(ws.pods) == [pod_name(2), pod_name(1)]


def test_pods_of_a_workload_with_an_open_incident_are_kept() -> None:
    cfg = CorrelateSettings(contained_after_s=10_000)  # the incident stays open
    corr = Correlator(cfg)
    victim, early, late = pod_name(1), pod_name(2), pod_name(3)
    out = corr.observe_all([
        sig(K.ENGINE_PRESSURE, 0, early, kv_cache_usage=0.5, preemptions=3),
        sig(K.GPU_OOM, 1, victim, framework="pytorch"),
        *(sig(K.ENGINE_PRESSURE, t, late, kv_cache_usage=0.5) for t in range(10, 1200, 10)),
    ])  # fmt: skip
    (opened,) = [d for d in out if isinstance(d, IncidentOpened)]
    ws: WorkloadState = corr.workloads[opened.workload]
    assert list(ws.pods) == [early, victim, late]
    assert ws.preemptions == {early: 3.0} and victim in ws.last_oom
    ctx = corr.context(opened.key)
    assert ctx is not None and ctx.pods_seen == (early, victim, late)


def test_pods_idle_before_an_incident_are_not_counted_as_seen() -> None:
    corr = Correlator(CorrelateSettings())
    gone, victim = pod_name(1), pod_name(2)  # ``gone`` left in a rollout long before
    out = corr.observe_all([
        sig(K.ENGINE_PRESSURE, 0, gone, kv_cache_usage=0.5),
        *(sig(K.ENGINE_PRESSURE, t, victim, kv_cache_usage=0.5) for t in range(10, 800, 10)),
        sig(K.GPU_OOM, 800, victim, framework="pytorch"),
    ])  # fmt: skip
    (opened,) = [d for d in out if isinstance(d, IncidentOpened)]
    ctx = corr.context(opened.key)
    assert ctx is not None and ctx.pods_seen == (victim,)


def test_resolved_incident_views_are_kept_for_the_last_few_per_workload() -> None:
    corr = Correlator(CorrelateSettings(contained_after_s=60, quiet_s=120))
    keys: list[str] = []
    for n in range(12):  # one death, then calm until resolved, twelve times over
        start = n * 1000
        out = corr.observe(sig(K.GPU_OOM, start, pod_name(n), framework="pytorch"))
        keys += [d.key for d in out if isinstance(d, IncidentOpened)]
        for t in range(start + 10, start + 1000, 10):
            out = corr.observe(sig(K.ENGINE_PRESSURE, t, pod_name(100 + n), kv_cache_usage=0.5))
            assert not any(isinstance(d, IncidentOpened) for d in out)
    assert len(keys) == 12 and corr.open_incidents == 0
    kept = [key for key in keys if corr.context(key) is not None]
    assert kept == keys[-RESOLVED_KEPT_PER_WORKLOAD:]
    last = corr.context(keys[-1])
    assert last is not None and last.stage == "resolved"


def test_incident_stages_are_unchanged_by_forgetting_idle_pods() -> None:
    corr = Correlator(CorrelateSettings())
    signals = list(churn(0, 400))  # 800 s of rollouts, then two deaths in the window
    signals += [
        sig(K.GPU_OOM, 900, pod_name(398), framework="pytorch"),
        sig(K.GPU_OOM, 910, pod_name(399), framework="pytorch"),
    ]
    out = corr.observe_all(signals)
    stages = [d.stage.value for d in out if isinstance(d, StageChanged)]
    assert stages == ["suspected", "cascading"]


def test_one_pod_workloads_of_unknown_kind_go_with_their_pod() -> None:
    corr = Correlator(CorrelateSettings())
    for n in range(3000):  # bare pods, no controller in their names: each its own workload
        for i in range(3):
            corr.observe(
                Signal(K.ENGINE_PRESSURE, T0 + n * 2 + i, SourcePos("rec", n), "batch",
                       f"render-job{n}", attrs={"kv_cache_usage": 0.5})
            )  # fmt: skip
    assert {ref.kind for ref in corr.workloads} == {"unknown"}
    assert len(corr.workloads) <= int(300 * 1.25 / 2) + 2
    assert corr.resolver.cached_pods == len(corr.workloads)
