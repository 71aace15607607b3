"""Table-driven scenarios for the cascade pattern (pure correlator, event time)."""

from __future__ import annotations

from typing import Any

import pytest

from detector.config import CorrelateSettings, UpstreamMapping, WorkloadMap
from detector.correlate.correlator import Correlator
from detector.correlate.identity import workload_of_pod
from detector.correlate.state import (
    Decision,
    EvidenceAdded,
    IncidentOpened,
    StageChanged,
    VerdictRecorded,
    VictimAdded,
)
from detector.events.model import Signal, SignalKind, SourcePos

T0 = 1_732_890_000.0
PODS = [f"vllm-llama-7d9f8b6c5d-{s}" for s in ("x2k4p", "b7q9z", "m4n8w", "r2t6v")]
UPSTREAM = "llm-vllm-llama-8000"
_line = iter(range(1, 10**9))


def sig(kind: SignalKind, t: float, pod: str | None = None, **attrs: Any) -> Signal:
    ns = "ingress-nginx" if kind is SignalKind.LB_RESPONSE else "llm"
    return Signal(kind, T0 + t, SourcePos("rec", next(_line)), ns, pod, "vllm", attrs=attrs)


def oom(t: float, pod: str) -> Signal:
    return sig(SignalKind.GPU_OOM, t, pod, framework="pytorch", bytes_tried=2 << 30)


def traffic(t0: float, t1: float, status: int, per_s: int = 5) -> list[Signal]:
    return [
        sig(SignalKind.LB_RESPONSE, t0 + i / per_s, status=status, upstream=UPSTREAM)
        for i in range(int((t1 - t0) * per_s))
    ]


def run(signals: list[Signal], **cfg: Any) -> list[Decision]:
    corr = Correlator(CorrelateSettings(**cfg))
    return corr.observe_all(sorted(signals, key=lambda s: s.time))


def stages(decisions: list[Decision]) -> list[str]:
    return [d.stage.value for d in decisions if isinstance(d, StageChanged)]


def test_two_pods_dying_in_the_window_is_a_cascade_with_victims_in_order() -> None:
    signals = [*traffic(0, 200, 200), oom(60, PODS[0]), oom(61, PODS[0]), oom(100, PODS[2])]
    signals += [oom(130, PODS[1]), *traffic(60, 200, 503, per_s=10)]
    out = run(signals)
    assert sum(isinstance(d, IncidentOpened) for d in out) == 1
    assert stages(out)[:2] == ["suspected", "cascading"]
    assert [d.pod for d in out if isinstance(d, VictimAdded)] == [PODS[0], PODS[2], PODS[1]]
    assert sum(isinstance(d, EvidenceAdded) and d.kind == "gpu_oom" for d in out) == 3
    assert any(isinstance(d, EvidenceAdded) and d.kind == "lb_errors" for d in out)


def test_single_death_that_recovers_is_suspected_then_resolved_never_cascading() -> None:
    signals = [*traffic(0, 600, 200), oom(30, PODS[0])]
    out = run(signals, contained_after_s=60, quiet_s=120)
    assert stages(out) == ["suspected", "contained", "resolved"]


def test_redelivered_oom_creates_no_second_victim() -> None:
    first = oom(10, PODS[0])
    out = run([first, first, oom(12, PODS[0])])
    assert sum(isinstance(d, VictimAdded) for d in out) == 1
    assert stages(out) == ["suspected"]


def test_late_record_of_a_second_victim_still_escalates() -> None:
    corr = Correlator(CorrelateSettings())
    corr.observe_all([oom(10, PODS[0]), *traffic(10, 40, 200)])
    out = corr.observe(oom(20, PODS[1]))  # arrives after records of t=40
    assert stages(out) == ["cascading"]


def test_host_ram_oom_gives_a_verdict_not_an_incident() -> None:
    kill = sig(SignalKind.HOST_OOM, 5, PODS[0], reason="OOMKilled", exit_code=137)
    again = sig(SignalKind.HOST_OOM, 50, PODS[1], reason="OOMKilled", exit_code=137)
    out = run([kill, sig(SignalKind.CRASH_LOOP, 6, PODS[0], reason="BackOff"), again])
    verdicts = [d for d in out if isinstance(d, VerdictRecorded)]
    assert len(verdicts) == 1 and "host-RAM OOM" in verdicts[0].reason
    assert not any(isinstance(d, IncidentOpened) for d in out)


def test_5xx_surge_without_gpu_oom_gives_a_verdict() -> None:
    out = run(traffic(0, 60, 200) + traffic(60, 150, 503, per_s=10))
    verdicts = [d for d in out if isinstance(d, VerdictRecorded)]
    assert len(verdicts) == 1 and "no GPU OOM" in verdicts[0].reason
    assert verdicts[0].workload.name == "vllm-llama"
    assert not any(isinstance(d, IncidentOpened) for d in out)


def test_survivors_at_the_ceiling_with_sustained_5xx_escalate_after_one_death() -> None:
    pressure = [
        sig(SignalKind.ENGINE_PRESSURE, 70 + i, PODS[1], kv_cache_usage=0.99) for i in range(3)
    ]
    out = run([oom(60, PODS[0]), *pressure, *traffic(0, 60, 200), *traffic(60, 120, 503, 10)])
    assert stages(out) == ["suspected", "cascading"]
    assert any(isinstance(d, EvidenceAdded) and d.kind == "gpu_memory" for d in out)


def test_vram_below_the_ceiling_is_not_pressure() -> None:
    used = sig(SignalKind.GPU_MEMORY, 1, PODS[0], used_bytes=73_000 << 20, uuid="GPU-1")
    free = sig(SignalKind.GPU_MEMORY, 1, PODS[0], free_bytes=8_559 << 20, uuid="GPU-1")
    corr = Correlator(CorrelateSettings())
    corr.observe_all([used, free])
    assert not any(ws.at_ceiling for ws in corr.workloads.values())


def test_upstream_mapping_file_overrides_the_convention() -> None:
    mapping = WorkloadMap(upstreams={"gw-llm": UpstreamMapping(namespace="llm", workload="x")})
    corr = Correlator(CorrelateSettings(), mapping)
    ref = corr.resolver.for_upstream("gw-llm")
    assert ref is not None and (ref.namespace, ref.name) == ("llm", "x")


@pytest.mark.parametrize(
    ("pod", "labels", "owner", "expected"),
    [
        ("vllm-llama-7d9f8b6c5d-x2k4p", {}, None, ("Deployment", "vllm-llama")),
        ("tgi-0", {}, None, ("StatefulSet", "tgi")),
        ("api-5c6d7-abcde", {"pod-template-hash": "5c6d7"}, None, ("Deployment", "api")),
        ("x-1", {}, ("ReplicaSet", "serve-6b8f9d7c4"), ("Deployment", "serve")),
        ("ray-worker", {}, ("StatefulSet", "ray"), ("StatefulSet", "ray")),
        ("standalone", {}, None, ("unknown", "standalone")),
    ],
)
def test_workload_of_pod(
    pod: str, labels: dict[str, str], owner: tuple[str, str] | None, expected: tuple[str, str]
) -> None:
    assert workload_of_pod(pod, labels, owner) == expected


def counter(t: float, status: int, total: float) -> Signal:
    return sig(
        SignalKind.LB_RESPONSE,
        t,
        status=status,
        upstream=UPSTREAM,
        counter_total=total,
        series=f"nginx_ingress_controller_requests|{status}",
    )


def test_prometheus_counters_become_rates_and_resets_are_handled() -> None:
    ok = [counter(t, 200, 1000 + 10 * t) for t in range(0, 120, 15)]
    errors = [counter(t, 503, 50 + 40 * max(0, t - 30)) for t in range(0, 120, 15)]
    errors.append(counter(121, 503, 5))  # the controller restarted: counter reset
    out = run([*ok, *errors])
    verdicts = [d for d in out if isinstance(d, VerdictRecorded)]
    assert len(verdicts) == 1 and "no GPU OOM" in verdicts[0].reason


def test_first_counter_sample_is_only_a_baseline() -> None:
    corr = Correlator(CorrelateSettings())
    corr.observe(counter(0, 503, 10**6))
    ws = next(iter(corr.workloads.values()))
    assert ws.lb.total == 0


def test_sidecar_lines_name_the_serving_pod() -> None:
    line = Signal(
        SignalKind.LB_RESPONSE,
        T0,
        SourcePos("rec", 1),
        "llm",
        PODS[0],
        "istio-proxy",
        attrs={"status": 503, "sidecar": True},
    )
    corr = Correlator(CorrelateSettings())
    corr.observe(line)
    (ref,) = corr.workloads
    assert (ref.namespace, ref.name) == ("llm", "vllm-llama")


def test_an_ambiguous_oom_needs_context() -> None:
    amb = sig(SignalKind.GPU_OOM, 10, PODS[0], ambiguous=True, framework="onnxruntime")
    assert not any(isinstance(d, IncidentOpened) for d in run([amb]))
    crash = sig(SignalKind.CRASH_LOOP, 25, PODS[0], reason="BackOff")
    out = run([amb, crash])
    assert [d.pod for d in out if isinstance(d, VictimAdded)] == [PODS[0]]


def test_vram_is_not_pressure_for_a_pre_reserving_engine_with_kv_metrics() -> None:
    config = sig(SignalKind.ENGINE_CONFIG, 0, PODS[1], engine="vllm", max_num_seqs=256)
    kv = sig(SignalKind.ENGINE_PRESSURE, 1, PODS[1], engine="vllm", kv_cache_usage=0.3)
    vram = sig(SignalKind.GPU_MEMORY, 2, PODS[1], used_bytes=97, total_bytes=100, uuid="G1")
    corr = Correlator(CorrelateSettings())
    corr.observe_all([config, kv, vram])
    assert not next(iter(corr.workloads.values())).at_ceiling
    corr2 = Correlator(CorrelateSettings())  # no KV metrics in the input: VRAM is all we have
    corr2.observe_all([config, vram])
    (pressure,) = next(iter(corr2.workloads.values())).at_ceiling.values()
    assert "pre-reserves VRAM" in pressure.attrs["pressure"]


@pytest.mark.parametrize(
    ("attrs", "measure"),
    [
        ({"preemptions": 3}, "KV cache preemptions"),
        ({"requests_waiting": 150}, "queue depth"),
        ({"kv_cache_usage": 0.99}, "KV cache"),
    ],
)
def test_engine_pressure_measures(attrs: dict[str, Any], measure: str) -> None:
    first = sig(SignalKind.ENGINE_PRESSURE, 0, PODS[0], engine="vllm", preemptions=1)
    later = sig(SignalKind.ENGINE_PRESSURE, 5, PODS[0], engine="vllm", **attrs)
    corr = Correlator(CorrelateSettings())
    corr.observe_all([first, later])
    ws = next(iter(corr.workloads.values()))
    assert (PODS[0], measure) in ws.at_ceiling


def test_envoy_per_class_counters_are_not_added_to_the_per_code_ones() -> None:
    def envoy(t: float, metric: str, total: float) -> Signal:
        return sig(
            SignalKind.LB_RESPONSE, t, status=503, upstream=UPSTREAM, counter_total=total,
            series=f"{metric}|503", metric=metric,
        )  # fmt: skip

    corr = Correlator(CorrelateSettings())
    for t, total in ((0, 0), (10, 40)):
        corr.observe(envoy(t, "envoy_cluster_upstream_rq", total))
        corr.observe(envoy(t, "envoy_cluster_upstream_rq_xx", total))
    assert next(iter(corr.workloads.values())).lb.errors == 40
