"""Device-memory exhaustion by its shape on every accelerator stack, and its look-alikes.

``oom_accelerators_build.jsonl`` is the set the shape rule was written against;
``oom_accelerators_heldout.jsonl`` was split off per family before any rule was written and
only measured; its rows with ``"batch": 2`` were collected after the rule was written and
measured once (see the README's classifier section for the figures). Each row has the line,
its expected verdict, its family and the public report it comes from. A look-alike is a
false alarm only when called ``gpu_oom`` (``ambiguous`` leaves the decision to context).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from detector.correlate.pattern import oom_summary
from detector.events.classify import OomClass, classify_line
from detector.events.container_log import signals_from_log_line
from detector.events.model import LogLine, SignalKind, SourcePos
from detector.postmortem.analysis import _oom_text

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MEASURED_RECALL = 37 / 38  # what the rule reaches there now: no regression below it


def _load(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line]


BUILD = _load("oom_accelerators_build.jsonl")
HELDOUT = _load("oom_accelerators_heldout.jsonl")


def _id(row: dict[str, Any]) -> str:
    return f"{row['expect']}:{row['family']}:{row['source'].split('github.com/')[-1]}"


def test_fixtures_have_sources_and_both_kinds() -> None:
    for row in BUILD + HELDOUT:
        assert row["source"].startswith("https://github.com/"), row
        assert row["expect"] in {"gpu_oom", "not_gpu_oom"}, row
    assert not {r["text"] for r in BUILD} & {r["text"] for r in HELDOUT}
    for rows in (BUILD, HELDOUT):
        assert sum(r["expect"] == "not_gpu_oom" for r in rows) >= 10
        assert len({r["family"] for r in rows if r["expect"] == "gpu_oom"}) >= 10


@pytest.mark.parametrize("row", BUILD, ids=_id)
def test_build_set(row: dict[str, Any]) -> None:
    verdict = classify_line(row["text"]).verdict
    assert (verdict is OomClass.GPU_OOM) == (row["expect"] == "gpu_oom"), row["text"]


def _heldout_counts() -> tuple[int, int, list[str]]:
    positives = [r for r in HELDOUT if r["expect"] == "gpu_oom"]
    negatives = [r for r in HELDOUT if r["expect"] != "gpu_oom"]
    found = [r for r in positives if classify_line(r["text"]).verdict is OomClass.GPU_OOM]
    alarms = [r["text"] for r in negatives if classify_line(r["text"]).verdict is OomClass.GPU_OOM]
    return len(found), len(positives), alarms


def test_heldout_no_false_alarm_and_recall_kept() -> None:
    found, positives, alarms = _heldout_counts()
    assert alarms == []
    assert found / positives >= MEASURED_RECALL, (found, positives)


@pytest.mark.parametrize(
    ("text", "accelerator", "sharing_layer"),
    [
        (BUILD[0]["text"], "tpu", None),  # XLA:TPU ... hbm
        ("RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed", "hpu", None),
        (
            "EL0004: [PID: 316198] 2025-09-28-07:22:29.827.496 Failed to allocate memory.",
            "npu",
            None,
        ),
        (
            "[HAMI-core ERROR (pid:30 thread=140382094939712 allocator.c:53)]: Device 0 OOM "
            "3171158016 / 3145728000",
            None,
            "hami",
        ),
        ("ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory", "vulkan", None),
        (
            "level_zero backend failed with error: 39 [UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY]",
            "sycl",
            None,
        ),
        (
            "ggml_gallocr_reserve_n: failed to allocate Metal buffer of size 8891928576",
            "metal",
            None,
        ),
        ("OpenCL error: CL_MEM_OBJECT_ALLOCATION_FAILURE", "opencl", None),
        (
            "2019-01-08 19:06:11.303639: E tensorflow/stream_executor/rocm/rocm_driver.cc:601] "
            "failed to allocate 7.35G (7889485824 bytes) from device: hipError_t(1002)",
            "rocm",
            None,
        ),
    ],
)
def test_evidence_names_the_family_and_the_sharing_layer(
    text: str, accelerator: str | None, sharing_layer: str | None
) -> None:
    found = classify_line(text)
    assert found.verdict is OomClass.GPU_OOM
    assert (found.accelerator, found.sharing_layer) == (accelerator, sharing_layer)


@pytest.mark.parametrize(
    ("text", "verdict", "reason"),
    [
        (  # https://github.com/sgl-project/sglang/issues/4184: the scheduler retracts, works on
            "[2025-03-07 21:49:33 TP13] Decode out of memory happened. #retracted_reqs: 1, "
            "#new_token_ratio: 0.1474 -> 0.1845",
            OomClass.NOT_GPU_OOM,
            "scheduler_retract",
        ),
        (  # https://github.com/sgl-project/sglang/issues/4602: nothing left to retract
            "RuntimeError: Decode out of memory. Try to lower your batch size.",
            OomClass.GPU_OOM,
            "kv_pool_exhausted",
        ),
        (  # https://github.com/marcoslucianops/DeepStream-Yolo/issues/366: the builder goes on
            "WARNING: [TRT]: Skipping tactic 3 due to insufficient memory on requested size of "
            "4294967296 detected for tactic 0x0000000000000004.",
            OomClass.NOT_GPU_OOM,
            "retried",
        ),
        (  # https://github.com/real-stanford/flingbot/issues/11: Ray's node memory monitor
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on "
            "memory.",
            OomClass.NOT_GPU_OOM,
            "host_ram",
        ),
    ],
)
def test_schedulers_that_recover_and_host_lookalikes(
    text: str, verdict: OomClass, reason: str
) -> None:
    found = classify_line(text)
    assert (found.verdict, found.reason) == (verdict, reason)


def test_a_reraised_oom_without_its_cause_is_ambiguous() -> None:
    # Ray re-raises a task's exception as RayTaskError(<cause class>), the cause's message on
    # later lines, which decide: https://docs.ray.io/en/latest/ray-core/api/doc/ray.exceptions.RayTaskError.html
    found = classify_line(
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_"
        "actor() (pid=400862, ip=10.128.0.9)"
    )
    assert (found.verdict, found.reason) == (OomClass.AMBIGUOUS, "reraised_cause_elsewhere")


def test_the_signal_and_the_incident_line_say_the_family_and_the_layer() -> None:
    text = HELDOUT[0]["text"] if HELDOUT[0]["family"] == "tpu" else BUILD[0]["text"]
    line = LogLine(0.0, text, namespace="llm", pod="vllm-0")
    (signal,) = signals_from_log_line(line, SourcePos("f", 1))
    assert signal.kind is SignalKind.GPU_OOM and signal.attrs["accelerator"] == "tpu"
    assert "on tpu" in oom_summary(signal)
    hami = (
        "[HAMI-core ERROR (pid:30 thread=1 allocator.c:53)]: Device 0 OOM 3171158016 / 3145728000"
    )
    (signal,) = signals_from_log_line(LogLine(0.0, hami, "llm", "vllm-0"), SourcePos("f", 2))
    assert signal.attrs["sharing_layer"] == "hami"
    assert "under the hami GPU-sharing quota" in oom_summary(signal)


def test_the_postmortem_says_the_family_and_the_layer() -> None:
    row = SimpleNamespace(
        pod="vllm-0",
        time=pd.Timestamp("2026-01-01T00:00:00Z"),
        attrs={"accelerator": "npu", "sharing_layer": "hami", "bytes_tried": 1 << 30},
    )
    text = _oom_text(row)
    assert text.endswith("tried to allocate 1.00 GiB, accelerator npu, sharing layer hami")
