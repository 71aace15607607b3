"""GPU OOM events in log streams and multi-line records: wraps joined, repeats merged, copies
dropped, continuation numbers read; checked on every multi-line file of the shared corpus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.events.classify import OomClass
from detector.events.multiline import (
    DEDUP_WINDOW_LINES,
    MAX_BLOCK_WINDOW_CHARS,
    MAX_LINE_CHARS,
    OomHit,
    classify_long_line,
    classify_record,
    find_ooms,
    record_findings,
)

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
NO_CORPUS = pytest.mark.skipif(
    not CORPUS.is_dir(), reason=f"shared corpus not found at {CORPUS} (checkout without shared/)"
)
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def _index(folder: str) -> list[dict[str, Any]]:
    path = CORPUS / folder / "INDEX_multiline.jsonl"
    if not path.is_file():
        return []
    return [json.loads(row) for row in path.read_text(encoding="utf-8").splitlines() if row]


MULTI = [(folder, row) for folder in ("gpu_oom", "lookalikes") for row in _index(folder)]


def _lines(folder: str, name: str) -> list[str]:
    return (CORPUS / folder / name).read_text(encoding="utf-8").splitlines()


def _public(source_suffix: str) -> list[str]:
    """Return the texts of oom_public.jsonl rows whose source ends with ``source_suffix``."""
    rows = (FIXTURES / "oom_public.jsonl").read_text(encoding="utf-8").splitlines()
    return [row["text"] for row in map(json.loads, rows) if row["source"].endswith(source_suffix)]


@NO_CORPUS
@pytest.mark.parametrize("folder,sample", MULTI, ids=[f"{f}/{r['file']}" for f, r in MULTI])
def test_corpus_streams(folder: str, sample: dict[str, Any]) -> None:
    hits = list(find_ooms(_lines(folder, sample["file"])))
    gpu = [hit for hit in hits if hit.classification.verdict is OomClass.GPU_OOM]
    if sample["expect"] == "gpu_oom":
        assert len(gpu) == 1, hits  # each sample is one OOM event, however many lines
    else:
        assert hits == [], hits


@NO_CORPUS
@pytest.mark.parametrize("folder,sample", MULTI, ids=[f"{f}/{r['file']}" for f, r in MULTI])
def test_corpus_files_as_one_record(folder: str, sample: dict[str, Any]) -> None:
    """The whole file as ONE record (a shipper's multiline record) decides as its lines do."""
    text = "\n".join(_lines(folder, sample["file"]))
    verdicts = [hit.classification.verdict for hit in record_findings(text)]
    assert (OomClass.GPU_OOM in verdicts) is (sample["expect"] == "gpu_oom"), verdicts
    if sample["expect"].startswith("engine_dead"):
        assert OomClass.ENGINE_DEAD in verdicts


@NO_CORPUS
def test_mid_word_wrap_is_one_event_with_the_whole_message() -> None:
    (hit,) = find_ooms(_lines("gpu_oom", "002_startup_kv_cache_insufficient.log"))
    assert hit.line_no == 1
    assert "(4.26 GiB KV cache is needed, which is larger than the available" in hit.text
    assert hit.classification.framework == "vllm"


@NO_CORPUS
def test_the_oom_line_not_the_traceback_source_line() -> None:
    (hit,) = find_ooms(_lines("gpu_oom", "001_startup_kv_cache_no_memory.log"))
    assert hit.line_no == 2  # line 1 is the `raise ValueError(...)` source line


@NO_CORPUS
def test_a_relogged_copy_is_dropped() -> None:
    # ollama: the runner's cudaMalloc failure, then the server re-logs it 5 lines later.
    (hit,) = find_ooms(_lines("gpu_oom", "013_ggml_cudamalloc_failed.log"))
    assert (hit.line_no, hit.classification.bytes_tried) == (1, round(24289.03 * MiB))


def test_a_table_cell_wrapped_across_lines_is_joined() -> None:
    # Triton's model table: the arena failure continues on the next line
    # (https://github.com/triton-inference-server/server/issues/5661); neither line alone is one.
    lines = [
        "| dolly_v1_6b_onnx | 1       | UNAVAILABLE: Internal: onnx runtime error 6: Exception "
        "during initialization: /workspace/onnxruntime/onnxruntime/core/framework/bfc_arena.cc"
        ":368 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Str"
        "eam*, bool, onnxruntime::WaitNotificationFn) ",
        "Failed to allocate memory for requested buffer of size 268435456 |",
        "I0419 14:01:47.068125 1 server.cc:284] Waiting for in-flight requests to complete.",
    ]
    (hit,) = find_ooms(lines)
    assert (hit.line_no, hit.classification.framework) == (1, "onnxruntime")
    assert hit.classification.bytes_tried == 268435456


def test_continuation_lines_fill_in_the_numbers() -> None:
    # PyTorch cudaMallocAsync report over several lines
    # (https://github.com/EvilBT/ComfyUI_SLK_joy_caption_two/issues/28).
    lines = [
        "Allocation on device 0 would exceed allowed memory. (out of memory)",
        "Currently allocated : 15.16 GiB",
        "Requested : 512.00 KiB",
        "Device limit : 15.99 GiB",
        "Free (according to CUDA): 0 bytes",
        "PyTorch limit (set by user-supplied memory fraction)",
        ": 17179869184.00 GiB",
    ]
    (hit,) = find_ooms(lines)
    verdict = hit.classification
    assert (hit.line_no, verdict.framework, verdict.gpu_index) == (1, "pytorch", 0)
    assert (verdict.bytes_tried, verdict.capacity_bytes, verdict.free_bytes) == (
        512 * KiB,
        round(15.99 * GiB),
        0,
    )


def test_trtllm_executor_sizes_on_the_following_lines() -> None:
    # https://github.com/NVIDIA/TensorRT-LLM/issues/5872
    lines = [
        "[07/08/2025-19:47:15] [TRT-LLM] [RANK 1] [E] Failed to initialize executor on rank 1: "
        "Executor creation failed due to insufficient GPU memory.",
        "",
        "The following component could not be created: KV cache",
        "Total GPU memory (GiB): 140.06",
        "Free GPU memory before component creation attempt (GiB): 108.86",
    ]
    (hit,) = find_ooms(lines)
    assert hit.classification.framework == "tensorrt_llm"
    assert (hit.classification.capacity_bytes, hit.classification.free_bytes) == (
        round(140.06 * GiB),
        round(108.86 * GiB),
    )


def test_the_engine_relogging_the_worker_oom_is_one_event() -> None:
    # vLLM V0 (https://github.com/vllm-project/vllm/issues/15039): the worker's OOM, a few
    # traceback lines, then MQEngineDeadError quoting the same OOM; the gap lines are filler.
    relog, worker = _public("vllm-project/vllm/issues/15039")
    frames = ['  File "/usr/lib/python3/site-packages/vllm/worker.py", line 1, in f'] * 8
    hits = list(find_ooms([worker, *frames, relog]))
    assert [(hit.line_no, hit.classification.bytes_tried) for hit in hits] == [(1, 128 * MiB)]


def test_oom_on_two_gpus_is_two_events() -> None:
    line = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU {}; 79.14 GiB total"
    hits = list(find_ooms([line.format(0), line.format(1)]))
    assert [hit.classification.gpu_index for hit in hits] == [0, 1]


def test_the_same_oom_much_later_is_a_new_event() -> None:
    line = "RuntimeError: CUDA error: out of memory"
    gap = ["INFO: serving"] * (DEDUP_WINDOW_LINES + 5)
    assert [hit.line_no for hit in find_ooms([line, *gap, line])] == [1, DEDUP_WINDOW_LINES + 7]


def test_ambiguous_lines_form_an_ambiguous_event() -> None:
    line = "ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape"
    (hit,) = find_ooms(["INFO start", line])
    assert hit.classification.verdict is OomClass.AMBIGUOUS


def test_a_hint_or_raise_line_in_the_record_does_not_veto_the_oom() -> None:
    record = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/app/server.py", line 10, in generate',
            '    raise RuntimeError("CUDA out of memory")',
            "WARNING: lower max_num_seqs to avoid OOM",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
            "total capacity of 79.25 GiB of which 1.50 GiB is free.",
        ]
    )
    (hit,) = record_findings(record)
    assert (hit.line_no, hit.classification.gpu_index) == (5, 3)
    assert hit.classification.bytes_tried == 2 * GiB


def test_an_oom_at_the_end_of_a_100_kb_traceback() -> None:
    frame = '  File "/usr/local/lib/python3.12/site-packages/torch/nn/modules/module.py", line 1'
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.71 GiB. GPU 0 has a"
    record = "\n".join(["Traceback (most recent call last):"] + [frame] * 1200 + [oom])
    assert len(record) > 100_000
    (hit,) = record_findings(record)
    assert (hit.text, hit.classification.bytes_tried) == (oom, round(1.71 * GiB))


def test_a_giant_record_is_scanned_on_its_head_and_tail() -> None:
    oom = "RuntimeError: CUDA error: out of memory"
    filler = "x" * 99 + "\n"
    middle = filler * (3 * MAX_BLOCK_WINDOW_CHARS // 100)
    assert record_findings(oom + "\n" + middle)[0].line_no == 1
    assert record_findings(middle + oom)[0].classification.verdict is OomClass.GPU_OOM
    assert record_findings(filler * 700 + oom + "\n" + middle + filler * 700) == []


def test_a_giant_line_is_classified_on_its_head_and_tail() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"
    assert classify_long_line("x " * MAX_LINE_CHARS + oom).bytes_tried == 20 * MiB
    assert classify_long_line(oom + " x" * MAX_LINE_CHARS).verdict is OomClass.GPU_OOM
    assert classify_long_line("x" * MAX_LINE_CHARS + oom + "x" * MAX_LINE_CHARS).reason == ""


def test_classify_record_reports_a_lookalike_reason() -> None:
    hit = classify_record("INFO start\njava.lang.OutOfMemoryError: Java heap space")
    assert (hit.line_no, hit.classification.reason) == (2, "host_ram")
    assert classify_record("") == OomHit(1, "", classify_long_line(""))


@pytest.mark.parametrize(
    "lines",
    [
        [],
        [""],
        ["\x00\xff" * 100],
        ["x" * 10 * MAX_LINE_CHARS, "y" * 10 * MAX_LINE_CHARS],
        ["CUDA out of mem" + "o" * 70, "ry", "e" * 80],
    ],
)
def test_odd_streams_never_raise(lines: list[str]) -> None:
    for hit in find_ooms(lines):
        assert hit.line_no >= 1
