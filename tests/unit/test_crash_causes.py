"""Known non-memory crash causes: recognized on real lines, and a verdict instead of a cascade.

Fixtures: ``fixtures/crash_causes_public.jsonl``, one real line per row with its source URL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.config import CorrelateSettings
from detector.correlate.correlator import Correlator
from detector.correlate.state import (
    Decision,
    EvidenceAdded,
    IncidentOpened,
    VerdictRecorded,
)
from detector.events.container_log import signals_from_log_line
from detector.events.crash_causes import crash_cause
from detector.events.model import LogLine, Signal, SignalKind, SourcePos

FIXTURES = Path(__file__).parent / "fixtures"
ROWS = [
    json.loads(row)
    for row in (FIXTURES / "crash_causes_public.jsonl").read_text(encoding="utf-8").splitlines()
    if row
]
T0 = 1_732_890_000.0
PODS = [f"vllm-llama-7d9f8b6c5d-{s}" for s in ("x2k4p", "b7q9z", "m4n8w")]
UPSTREAM = "llm-vllm-llama-8000"
GIB = 1 << 30
K = SignalKind
_line = iter(range(1, 10**9))


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['cause']}-{i}" for i, r in enumerate(ROWS)])
def test_real_lines_name_their_cause(row: dict[str, str]) -> None:
    found = crash_cause(row["text"])
    assert found is not None and found["cause"] == row["cause"], row["source"]
    line = LogLine(T0, row["text"], "llm", PODS[0], "vllm")
    (signal,) = signals_from_log_line(line, SourcePos("rec", 1))
    assert signal.kind is K.CRASH_CAUSE and signal.attrs["cause"] == row["cause"]


def test_an_xid_line_carries_its_number_and_name() -> None:
    found = crash_cause("NVRM: Xid (PCI:0000:44:00): 79, pid=2214, GPU has fallen off the bus.")
    assert found == {"cause": "xid", "cause_text": "NVIDIA Xid 79 (GPU has fallen off the bus)",
                     "xid": 79}  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        "gpu-h100:534:1763 [3] NCCL INFO NCCL_IB_TIMEOUT set by environment to 22",
        "INFO 09-27 06:40:01 api_server.py:212] vLLM API server version 0.6.1",
        "ECC mode is enabled on all GPUs",
    ],
)
def test_hints_and_info_lines_are_no_cause(text: str) -> None:
    assert crash_cause(text) is None


def test_a_gpu_oom_line_stays_a_gpu_oom() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.14 GiB of which 1.02 GiB is free."
    )
    kinds = [
        s.kind for s in signals_from_log_line(LogLine(T0, text, pod=PODS[0]), SourcePos("r", 1))
    ]
    assert kinds == [K.GPU_OOM]


def test_a_multi_line_record_keeps_the_line_that_states_the_cause() -> None:
    text = 'Traceback (most recent call last):\n  File "x.py", line 3\n' + ROWS[0]["text"]
    (signal,) = signals_from_log_line(LogLine(T0, text, pod=PODS[0]), SourcePos("r", 1))
    assert signal.text == ROWS[0]["text"]


# --- the correlator ----------------------------------------------------------------------


def sig(kind: SignalKind, t: float, pod: str | None = None, **attrs: Any) -> Signal:
    ns = "ingress-nginx" if kind is K.LB_RESPONSE else "llm"
    return Signal(kind, T0 + t, SourcePos("rec", next(_line)), ns, pod, "vllm", attrs=attrs)


def traffic(t0: float, t1: float, status: int, per_s: int = 5) -> list[Signal]:
    return [
        sig(K.LB_RESPONSE, t0 + i / per_s, status=status, upstream=UPSTREAM)
        for i in range(int((t1 - t0) * per_s))
    ]


def vram(t: float, pod: str, ratio: float, gpu: int) -> Signal:
    used = int(80 * GIB * ratio)
    return sig(K.GPU_MEMORY, t, pod, used_bytes=used, total_bytes=80 * GIB, uuid=f"GPU-{gpu}")


def startup(t: float, pod: str, utilization: float = 0.9) -> Signal:
    return sig(K.ENGINE_CONFIG, t, pod, engine="vllm", gpu_memory_utilization=utilization,
               max_num_seqs=256, paged_attention=True)  # fmt: skip


def illegal_address_loop(
    ratio: float, *, startup_lines: bool = True, survivor: float | None = None
) -> list[Signal]:
    """Three vLLM pods; two die of illegal memory access and crash-loop while 5xx rise.

    VRAM of every pod at ``ratio`` (the survivor's at ``survivor`` when given).
    """
    out: list[Signal] = [*traffic(0, 200, 200)]
    for i, pod in enumerate(PODS):
        out += [startup(1.0 + i, pod)] if startup_lines else []
        at = survivor if survivor is not None and i == 2 else ratio
        out += [vram(t, pod, at, i) for t in range(5, 200, 10)]
    for pod, t in ((PODS[0], 60.0), (PODS[1], 75.0)):
        words = "CUDA illegal memory access (cudaErrorIllegalAddress)"
        out.append(sig(K.CRASH_CAUSE, t, pod, cause="illegal_memory_access", cause_text=words))
        out.append(sig(K.CRASH_LOOP, t + 20, pod, reason="BackOff", count=3))
    out += traffic(60, 200, 502, per_s=10)
    return out


def run(signals: list[Signal]) -> list[Decision]:
    return Correlator(CorrelateSettings()).observe_all(sorted(signals, key=lambda s: s.time))


def test_illegal_address_crash_loop_with_reserved_vram_is_a_verdict_not_an_incident() -> None:
    out = run(illegal_address_loop(0.96))
    assert not [d for d in out if isinstance(d, IncidentOpened)]
    (verdict,) = [d for d in out if isinstance(d, VerdictRecorded)]
    assert verdict.verdict == "not_gpu_oom_cascade"
    assert "CUDA illegal memory access" in verdict.reason
    assert f"in pods {PODS[1]}, {PODS[0]}" in verdict.reason  # sorted
    assert "VRAM 96% is vllm's own reservation 0.90 (+ CUDA context): not pressure" in (
        verdict.reason
    )
    assert verdict.dedupe_key.startswith("llm/vllm-llama:crash_cause@")


def test_a_crash_cause_without_startup_lines_still_gives_the_verdict() -> None:
    # no reservation known: the crashed pods' VRAM at 96 % is theirs, not survivors' pressure
    out = run(illegal_address_loop(0.96, startup_lines=False, survivor=0.5))
    assert not [d for d in out if isinstance(d, IncidentOpened)]
    (verdict,) = [d for d in out if isinstance(d, VerdictRecorded)]
    assert "CUDA illegal memory access" in verdict.reason


def test_vram_over_the_reservation_is_still_pressure() -> None:
    out = run(illegal_address_loop(0.99))
    opened = [d for d in out if isinstance(d, IncidentOpened)]
    assert len(opened) == 1  # the surviving pod sits over its reservation while 5xx rise
    summaries = [d.summary for d in out if isinstance(d, EvidenceAdded) and d.kind == "gpu_memory"]
    assert summaries == [f"VRAM 99% over vllm's reservation 0.90 in pod {PODS[2]}"]
    (evidence,) = [d for d in out if isinstance(d, EvidenceAdded) and d.kind == "gpu_memory"]
    assert evidence.signal.attrs["reservation"] == 0.9
    assert evidence.signal.attrs["pressure"] == "GPU memory over the engine's reservation"


def test_reserved_vram_alone_with_5xx_is_the_failing_upstream_verdict() -> None:
    signals = [*traffic(0, 200, 200), *traffic(60, 200, 502, per_s=10)]
    for i, pod in enumerate(PODS):
        signals += [startup(1.0 + i, pod), *[vram(t, pod, 0.96, i) for t in range(5, 200, 10)]]
    out = run(signals)
    assert not [d for d in out if isinstance(d, IncidentOpened)]
    (verdict,) = [d for d in out if isinstance(d, VerdictRecorded)]
    assert ":lb_5xx_without_gpu_oom@" in verdict.dedupe_key
    assert "vllm's own reservation 0.90" in verdict.reason


def test_a_gpu_oom_in_the_same_pods_wins() -> None:
    signals = illegal_address_loop(0.96)
    signals.append(sig(K.GPU_OOM, 70.0, PODS[0], framework="pytorch", bytes_tried=2 * GIB))
    signals.append(sig(K.GPU_OOM, 80.0, PODS[1], framework="pytorch", bytes_tried=2 * GIB))
    out = run(signals)
    assert len([d for d in out if isinstance(d, IncidentOpened)]) == 1
    assert not [d for d in out if isinstance(d, VerdictRecorded)]


def test_kv_cache_usage_stays_pressure_with_a_reservation() -> None:
    signals = [*traffic(0, 200, 200), *traffic(60, 200, 502, per_s=10)]
    for i, pod in enumerate(PODS):
        signals += [startup(1.0 + i, pod), *[vram(t, pod, 0.93, i) for t in range(5, 200, 10)]]
        signals += [sig(K.ENGINE_PRESSURE, t, pod, engine="vllm", kv_cache_usage=0.99)
                    for t in range(50, 200, 10)]  # fmt: skip
    out = run(signals)
    assert len([d for d in out if isinstance(d, IncidentOpened)]) == 1
    kinds = {d.signal.attrs.get("pressure") for d in out if isinstance(d, EvidenceAdded)
             and d.kind == "gpu_memory"}  # fmt: skip
    assert kinds == {"KV cache"}


def test_one_verdict_per_crash_loop_episode_across_two_surges() -> None:
    signals = [s for s in illegal_address_loop(0.96) if s.kind is not K.LB_RESPONSE]
    signals += [*traffic(0, 60, 200), *traffic(60, 110, 502, per_s=10)]
    signals += [*traffic(110, 160, 200), *traffic(160, 230, 502, per_s=10)]
    out = run(signals)
    assert len([d for d in out if isinstance(d, VerdictRecorded)]) == 1
    assert not [d for d in out if isinstance(d, IncidentOpened)]


def test_a_crash_loop_does_not_confirm_an_ambiguous_oom_of_a_pod_with_a_known_cause() -> None:
    signals = illegal_address_loop(0.96)
    signals.append(sig(K.GPU_OOM, 61.0, PODS[0], framework="pytorch", ambiguous=True))
    out = run(signals)
    assert not [d for d in out if isinstance(d, IncidentOpened)]
    assert len([d for d in out if isinstance(d, VerdictRecorded)]) == 1
