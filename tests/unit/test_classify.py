"""The GPU OOM classifier against the shared corpus, public bug-report lines and number tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.events.classify import (
    Classification,
    OomClass,
    classify_line,
    line_numbers,
    parse_size,
)

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
NO_CORPUS = pytest.mark.skipif(
    not CORPUS.is_dir(), reason=f"shared corpus not found at {CORPUS} (checkout without shared/)"
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
ENGINE_DEAD_LABELS = (
    "engine_dead_after_gpu_oom",
    "engine_dead_not_oom",
    "engine_dead_cause_unknown",
)
HOST_OOM_CATEGORIES = ("linux_oom_killer", "k8s_container_oomkilled")


def allowed_verdicts(expect: str) -> set[OomClass]:
    """Map a corpus ``expect`` label to the verdicts that satisfy it."""
    if expect == "gpu_oom":
        return {OomClass.GPU_OOM}
    if expect in ENGINE_DEAD_LABELS:
        return {OomClass.ENGINE_DEAD}
    if expect == "ambiguous":
        return {OomClass.AMBIGUOUS}
    if expect == "not_gpu_oom":
        return set(OomClass) - {OomClass.GPU_OOM}
    raise AssertionError(f"unknown expect label {expect!r}")


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file; an absent file reads as no rows (the test then skips)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


SINGLE_LINE = load_jsonl(CORPUS / "gpu_oom" / "gpu_oom_single_line.jsonl") + load_jsonl(
    CORPUS / "lookalikes" / "lookalikes_single_line.jsonl"
)
MULTI_LINE = [
    (folder, row)
    for folder in ("gpu_oom", "lookalikes")
    for row in load_jsonl(CORPUS / folder / "INDEX_multiline.jsonl")
]
PUBLIC = load_jsonl(FIXTURES / "oom_public.jsonl")


@NO_CORPUS
@pytest.mark.parametrize("sample", SINGLE_LINE, ids=lambda s: s["source"].rsplit("/", 3)[-3])
def test_corpus_single_line(sample: dict[str, Any]) -> None:
    result = classify_line(sample["text"])
    assert result.verdict in allowed_verdicts(sample["expect"]), (result, sample["text"])


@NO_CORPUS
@pytest.mark.parametrize(
    "folder,sample", MULTI_LINE, ids=[f"{f}/{r['file']}" for f, r in MULTI_LINE]
)
def test_corpus_multi_line(folder: str, sample: dict[str, Any]) -> None:
    lines = (CORPUS / folder / sample["file"]).read_text(encoding="utf-8").splitlines()
    verdicts = [classify_line(line).verdict for line in lines]
    if sample["expect"] == "gpu_oom":
        assert OomClass.GPU_OOM in verdicts, sample["file"]
    else:
        assert OomClass.GPU_OOM not in verdicts, sample["file"]
    if sample["expect"] in ENGINE_DEAD_LABELS:
        assert OomClass.ENGINE_DEAD in verdicts, sample["file"]
    if sample.get("category", "").startswith(HOST_OOM_CATEGORIES):
        assert OomClass.HOST_OOM in verdicts, sample["file"]


def test_public_fixture_is_large_enough() -> None:
    assert len(PUBLIC) >= 10
    assert all(row["source"].startswith("https://") for row in PUBLIC)


@pytest.mark.parametrize("sample", PUBLIC, ids=lambda s: s["source"].rsplit("/", 3)[-3])
def test_public_lines(sample: dict[str, Any]) -> None:
    result = classify_line(sample["text"])
    assert result.verdict in allowed_verdicts(sample["expect"]), (result, sample["text"])
    if "verdict" in sample:
        assert result.verdict == OomClass(sample["verdict"])
    for key in ("bytes_tried", "capacity_bytes", "free_bytes", "gpu_index"):
        if key in sample:
            assert getattr(result, key) == sample[key], key
    assert result.quoted is sample.get("quoted", False)


# Real lines (shared corpus, with their sources there) and the numbers they carry.
NUMBERS = [
    (  # PyTorch <= 1.4, KiB units, old parenthesised stats
        "RuntimeError: CUDA out of memory. Tried to allocate 1024.00 KiB (GPU 0; 11.17 GiB total "
        "capacity; 10.90 GiB already allocated; 576.00 KiB free; 30.96 MiB cached)",
        "pytorch",
        1024 * KiB,
        round(11.17 * GiB),
        576 * KiB,
        0,
    ),
    (  # PyTorch 2.1, "capacty" typo and "0 bytes is free"
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a "
        "total capacty of 6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is "
        "allocated by PyTorch, and 2.30 GiB is reserved by PyTorch but unallocated.",
        "pytorch",
        round(1.70 * GiB),
        6 * GiB,
        0,
        0,
    ),
    (  # PyTorch 2.5+, "this process has ... memory in use"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 232.00 MiB. GPU 0 has a "
        "total capacity of 23.57 GiB of which 154.25 MiB is free. Including non-PyTorch "
        "memory, this process has 23.40 GiB memory in use.",
        "pytorch",
        232 * MiB,
        round(23.57 * GiB),
        round(154.25 * MiB),
        0,
    ),
    (  # cudaMallocAsync backend, flattened
        "OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory) "
        "Currently allocated : 12.20 GiB Requested : 1.88 GiB Device limit : 16.00 GiB Free "
        "(according to CUDA): 0 bytes PyTorch limit (set by user-supplied memory fraction) : "
        "17179869184.00 GiB",
        "pytorch",
        round(1.88 * GiB),
        16 * GiB,
        0,
        0,
    ),
    (  # vLLM V1 start-up free-memory check (free/total in one parenthesis)
        "ValueError: Free memory on device cuda:0 (36.75/121.63 GiB) on startup is less than",
        "vllm",
        None,
        round(121.63 * GiB),
        round(36.75 * GiB),
        0,
    ),
    (  # TensorFlow stream executor: exact bytes in parentheses win over "2.96G"
        "E tensorflow/stream_executor/cuda/cuda_driver.cc:828] failed to allocate 2.96G "
        "(3179741184 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        "tensorflow",
        3179741184,
        None,
        None,
        None,
    ),
    (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for "
        "2.99GiB (3206250496B) on device ordinal 0",
        "jax",
        3206250496,
        None,
        None,
        0,
    ),
    (
        "node-b:3063028:3066152 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc "
        "6291456 bytes",
        "nccl",
        6291456,
        None,
        None,
        None,
    ),
    (
        "/onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:368 void* "
        "onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, "
        "onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of "
        "size 15728896",
        "onnxruntime",
        15728896,
        None,
        None,
        None,
    ),
    (
        "2018-06-08 17:26:00.908130: W tensorflow/core/framework/op_kernel.cc:1202] "
        "OP_REQUIRES failed at tile_ops.cc:123 : Resource exhausted: OOM when allocating tensor "
        "with shape[16,1,892800,8,4,2,2] and type float on "
        "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        "tensorflow",
        None,
        None,
        None,
        0,
    ),
    (
        "cuDNN failure 2: CUDNN_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=WORKSTATION-01 ; "
        "expr=finder(calgo, algoPerf)",
        "cudnn",
        None,
        None,
        None,
        0,
    ),
    (
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cublas",
        None,
        None,
        None,
        None,
    ),
]


@pytest.mark.parametrize(
    "text,framework,tried,capacity,free,gpu", NUMBERS, ids=[row[1] for row in NUMBERS]
)
def test_extracted_numbers(
    text: str,
    framework: str,
    tried: int | None,
    capacity: int | None,
    free: int | None,
    gpu: int | None,
) -> None:
    result = classify_line(text)
    assert result == Classification(
        OomClass.GPU_OOM, framework, tried, capacity, free, gpu, reason=result.reason
    )


@pytest.mark.parametrize(
    "number,unit,expected",
    [
        ("0", "bytes", 0),
        ("15728896", None, 15728896),
        ("1024.00", "KiB", 1 << 20),
        ("20.00", "MiB", 20 * MiB),
        ("79.14", "GiB", round(79.14 * GiB)),
        ("2.96", "G", round(2.96 * GiB)),
        ("8.23", "GB", round(8.23 * GiB)),
        ("1", "TiB", 1 << 40),
        ("4547406516732812544", None, 4547406516732812544),  # beyond float precision
    ],
)
def test_parse_size(number: str, unit: str | None, expected: int) -> None:
    assert parse_size(number, unit) == expected


@pytest.mark.parametrize(
    "text,verdict,reason",
    [
        ("If you run out of memory, try reducing max_model_len", OomClass.NOT_GPU_OOM, "hint"),
        ("WARNING: lower max_num_seqs to avoid OOM", OomClass.NOT_GPU_OOM, "hint"),
        ("If you encounter CUDA out of memory, try to set --tile", OomClass.NOT_GPU_OOM, "hint"),
        (  # a traceback's source line repeats the exception that follows it
            'vllm-1  | ERROR 11-18 18:07:28 engine.py:366]     raise ValueError("No available '
            'memory for the cache blocks. "',
            OomClass.NOT_GPU_OOM,
            "traceback_source",
        ),
        ("Error when running model: CUDA out of memory", OomClass.GPU_OOM, "pytorch_oom"),
        (
            "grpc StatusCode.RESOURCE_EXHAUSTED: Received message larger than max",
            OomClass.NOT_GPU_OOM,
            "",
        ),
        ("java.lang.OutOfMemoryError: Java heap space", OomClass.NOT_GPU_OOM, "host_ram"),
        ("vllm-1 exited with code 137", OomClass.HOST_OOM, "exit_137"),
        ("tgi-0   0/1   OOMKilled   3   2m", OomClass.HOST_OOM, "oom_killed"),
        ("", OomClass.NOT_GPU_OOM, ""),
        ("\x00\xff" * 5000, OomClass.NOT_GPU_OOM, ""),
    ],
)
def test_wording_rules(text: str, verdict: OomClass, reason: str) -> None:
    result = classify_line(text)
    assert (result.verdict, result.reason) == (verdict, reason)


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "vllm-1  | ",
        "(VllmWorker rank=0 pid=123) ERROR 05-20 10:00:00 [engine.py:123] ",
        "2024-05-20T10:00:00.123456789Z stderr F ",
        "E0520 10:00:00.123456       1 worker.go:42] ",
    ],
)
def test_prefixes_do_not_change_the_verdict(prefix: str) -> None:
    line = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 3; 79.14 GiB total"
    result = classify_line(prefix + line)
    assert (result.verdict, result.bytes_tried, result.gpu_index) == (OomClass.GPU_OOM, 20 * MiB, 3)


@pytest.mark.parametrize(
    "line",
    [
        # vLLM's request logger echoes the prompt (format of vllm/entrypoints/logger.py)
        "INFO 03-14 09:01:02 [logger.py:43] Received request chatcmpl-9f2: prompt: '<|user|>"
        "Why do I get torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB?', "
        "params: SamplingParams(n=1, temperature=0.7), prompt_token_ids: None",
        'DEBUG request body: {"model": "llama", "messages": [{"role": "user", '
        '"content": "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB"}]}',
    ],
)
def test_a_prompt_that_quotes_an_oom_is_not_an_oom(line: str) -> None:
    assert classify_line(line).verdict is OomClass.NOT_GPU_OOM


@pytest.mark.parametrize(
    "line,quoted",
    [
        (  # openai-python's APIStatusError text, "Error code: {status} - {body}", carrying a
            # vLLM ErrorResponse (object/message/type/param/code) as another service logs it;
            # constructed from the formats of openai/_exceptions.py and vllm's protocol.py
            "openai.InternalServerError: Error code: 500 - {'object': 'error', 'message': 'CUDA "
            "out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.25 GiB "
            "of which 1.02 GiB is free.', 'type': 'InternalServerError', 'param': None, 'code': "
            "500}",
            True,
        ),
        (  # a gateway logging the upstream's JSON error body
            'upstream error status=500 body={"object":"error","message":"CUDA out of memory. '
            'Tried to allocate 512.00 MiB","type":"InternalServerError","code":500}',
            True,
        ),
        (  # the engine's own JSON log record (TGI --json-output layout): not second-hand
            '{"timestamp":"2024-05-01T10:00:00.000Z","level":"ERROR","fields":{"message":"Shard '
            "0 failed: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 "
            'GiB"},"target":"text_generation_launcher"}',
            False,
        ),
        ("RuntimeError: CUDA error: out of memory", False),
    ],
)
def test_an_error_body_quoting_an_oom_is_a_quoted_oom(line: str, quoted: bool) -> None:
    result = classify_line(line)
    assert (result.verdict, result.quoted) == (OomClass.GPU_OOM, quoted)


def test_a_prompt_quoting_an_error_body_is_still_a_prompt() -> None:
    line = (
        'DEBUG request body: {"model": "llama", "messages": [{"role": "user", "content": '
        '"why {\\"error\\": \\"CUDA out of memory. Tried to allocate 2.00 GiB\\"}?"}]}'
    )
    assert classify_line(line).reason == "request_payload"


@pytest.mark.parametrize(
    "text,numbers",
    [
        ("Requested : 512.00 KiB", {"bytes_tried": 512 * KiB}),
        ("Device limit : 15.99 GiB", {"capacity_bytes": round(15.99 * GiB)}),
        ("Free (according to CUDA): 0 bytes", {"free_bytes": 0}),
        ("Total GPU memory (GiB): 140.06", {"capacity_bytes": round(140.06 * GiB)}),
        ("Currently allocated : 15.16 GiB", {}),
        ("", {}),
    ],
)
def test_line_numbers(text: str, numbers: dict[str, int]) -> None:
    assert line_numbers(text) == numbers
