"""One container log line -> Signals: identity, attrs, truncation and the cheap pre-filter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from detector.events.classify import OomClass, classify_line
from detector.events.container_log import START_FAILED_REASONS, signals_from_log_line
from detector.events.crash_causes import crash_cause
from detector.events.engine_lines import parse_engine_line
from detector.events.model import MAX_TEXT_CHARS, LogLine, SignalKind, SourcePos

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SOURCE = SourcePos("containers.log", 7)
MiB, GiB = 1 << 20, 1 << 30

OOM_LINE = (  # vllm-project/vllm#26863
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 232.00 MiB. GPU 0 has a total "
    "capacity of 23.57 GiB of which 154.25 MiB is free. Including non-PyTorch memory, this process "
    "has 23.40 GiB memory in use."
)


def log_line(text: str) -> LogLine:
    """Build a LogLine with every identity field set."""
    return LogLine(
        time=1716200000.5,
        text=text,
        namespace="llm",
        pod="vllm-7d9f8b6c5d-x2k4q",
        container="vllm",
        node="gpu-node-3",
        cluster="prod-eu",
        labels={"app": "vllm"},
        owner=("ReplicaSet", "vllm-7d9f8b6c5d"),
        stream="stderr",
    )


def test_gpu_oom_signal_carries_identity_and_numbers() -> None:
    (signal,) = signals_from_log_line(log_line(OOM_LINE), SOURCE)
    assert signal.kind is SignalKind.GPU_OOM
    assert (signal.time, signal.source, signal.text) == (1716200000.5, SOURCE, OOM_LINE)
    assert (signal.namespace, signal.pod, signal.container) == (
        "llm",
        "vllm-7d9f8b6c5d-x2k4q",
        "vllm",
    )
    assert (signal.node, signal.cluster, signal.labels) == (
        "gpu-node-3",
        "prod-eu",
        {"app": "vllm"},
    )
    assert signal.owner == ("ReplicaSet", "vllm-7d9f8b6c5d")
    assert signal.attrs == {
        "framework": "pytorch",
        "bytes_tried": 232 * MiB,
        "capacity_bytes": round(23.57 * GiB),
        "free_bytes": round(154.25 * MiB),
        "gpu_index": 0,
    }


@pytest.mark.parametrize(
    "text,kind,attrs",
    [
        (  # vllm-project/vllm#12233
            "ERROR 01-22 00:13:32 client.py:282] RuntimeError('Engine process (pid 77) died.')",
            SignalKind.ENGINE_DEAD,
            {"framework": "vllm"},
        ),
        (  # equinor/ert#7797
            "2024-04-29T14:55:41,678628+02:00 pool invoked oom-killer: gfp_mask=0x6200ca"
            "(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
            SignalKind.HOST_OOM,
            {"reason": "oom_killer"},
        ),
        (  # vectorch-ai/ScaleLLM#38
            "scalellm exited with code 137",
            SignalKind.HOST_OOM,
            {"reason": "exit_137", "exit_code": 137},
        ),
        (  # vllm-project/vllm#3094
            "INFO 02-28 21:48:18 metrics.py:161] Avg prompt throughput: 0.0 tokens/s, Avg "
            "generation throughput: 44.9 tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: "
            "3 reqs, GPU KV cache usage: 82.1%, CPU KV cache usage: 0.0%",
            SignalKind.ENGINE_PRESSURE,
            {
                "engine": "vllm",
                "requests_running": 2,
                "requests_swapped": 0,
                "requests_waiting": 3,
                "kv_cache_usage": 0.821,
            },
        ),
    ],
)
def test_one_signal_per_line(text: str, kind: SignalKind, attrs: dict[str, object]) -> None:
    (signal,) = signals_from_log_line(log_line(text), SOURCE)
    assert signal.kind is kind
    assert signal.attrs == pytest.approx(attrs)


@pytest.mark.parametrize(
    "text",
    [
        'INFO:     10.250.3.7:42662 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "INFO 02-05 01:20:00 engine.py:275] Added request "
        "chatcmpl-87294cc938af457f9628dd82be72189c.",
        "(VllmWorker rank=0 pid=123) INFO 05-20 10:00:00 [gpu_worker.py:1] Loading model weights",
        "",
    ],
)
def test_ordinary_lines_carry_nothing(text: str) -> None:
    assert signals_from_log_line(log_line(text), SOURCE) == []


def test_text_is_truncated_to_two_kib() -> None:
    long_line = OOM_LINE + " x" * 5000
    (signal,) = signals_from_log_line(log_line(long_line), SOURCE)
    assert len(signal.text) == MAX_TEXT_CHARS
    assert signal.attrs["bytes_tried"] == 232 * MiB


def _real_lines() -> list[str]:
    lines: list[str] = []
    for name in ("oom_public.jsonl", "engine_lines.jsonl"):
        rows = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
        lines += [json.loads(row)["text"] for row in rows if row]
    for path in sorted(CORPUS.glob("*/*.jsonl")) + sorted(CORPUS.glob("*/*.log")):
        for row in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if path.suffix == ".log":
                lines.append(row)
            elif row.startswith("{") and '"text"' in row:
                text = json.loads(row).get("text")
                lines += [text] if isinstance(text, str) else []
    return lines


def test_prefilter_never_drops_a_signal() -> None:
    """Every real line gives the same signals as the classifier and parser called directly."""
    kinds = {
        OomClass.GPU_OOM: SignalKind.GPU_OOM,
        OomClass.AMBIGUOUS: SignalKind.GPU_OOM,
        OomClass.ENGINE_DEAD: SignalKind.ENGINE_DEAD,
        OomClass.HOST_OOM: SignalKind.HOST_OOM,
    }
    for text in _real_lines():
        expected = [
            SignalKind.START_FAILED if v.reason in START_FAILED_REASONS else kinds[v.verdict]
            for v in [classify_line(text)]
            if v.verdict in kinds
        ]
        engine = parse_engine_line(text)
        expected += [engine[0]] if engine else []
        if not expected and any(crash_cause(part) for part in text.splitlines()):
            expected = [SignalKind.CRASH_CAUSE]  # a known non-memory crash cause, when no other
        got = [s.kind for s in signals_from_log_line(log_line(text), SOURCE)]
        assert got == expected, text


def _hostile_lines() -> list[str]:
    """Real lines with every number blown up or mangled, plus cut-off variants."""
    out: list[str] = []
    for text in _real_lines()[:200]:
        out.append(re.sub(r"\d+", "9" * 5000, text))
        out.append(re.sub(r"\d+(?:\.\d+)?", "1.2.3", text))
        out.append(re.sub(r"\d", "", text))
        out += [text[: len(text) // 2], text[len(text) // 2 :]]
    return out


def test_hostile_text_never_raises() -> None:
    for text in _hostile_lines():
        for signal in signals_from_log_line(log_line(text), SOURCE):
            assert len(signal.text) <= MAX_TEXT_CHARS


def _corpus_record(folder: str, name: str) -> str:
    """Return a multi-line corpus file as ONE record's text (a shipper's multiline record)."""
    return (CORPUS / folder / name).read_text(encoding="utf-8").rstrip("\n")


NO_CORPUS = pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus not found")


@NO_CORPUS
@pytest.mark.parametrize(
    "name,bytes_tried",
    [("001_startup_kv_cache_no_memory.log", None), ("021_tf_resource_exhausted.log", None)],
)
def test_a_multiline_record_is_classified_by_its_lines(name: str, bytes_tried: int | None) -> None:
    # 001: a `raise ...` source line, 021: a hint line; neither may veto the OOM line.
    signals = signals_from_log_line(log_line(_corpus_record("gpu_oom", name)), SOURCE)
    (oom,) = [s for s in signals if s.kind is SignalKind.GPU_OOM]
    assert oom.attrs.get("bytes_tried") == bytes_tried
    assert "\n" not in oom.text and "ambiguous" not in oom.attrs


@NO_CORPUS
@pytest.mark.parametrize("path", sorted(CORPUS.glob("lookalikes/*.log")), ids=lambda p: p.name)
def test_lookalike_records_give_no_gpu_oom(path: Path) -> None:
    text = path.read_text(encoding="utf-8").rstrip("\n")
    kinds = [s.kind for s in signals_from_log_line(log_line(text), SOURCE)]
    assert SignalKind.GPU_OOM not in kinds


def test_oom_on_the_last_line_of_a_100_kb_traceback() -> None:
    frame = '  File "/usr/local/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py", line 9'
    record = "\n".join(["Traceback (most recent call last):"] + [frame] * 1200 + [OOM_LINE])
    assert len(record) > 100_000
    (signal,) = signals_from_log_line(log_line(record), SOURCE)
    assert (signal.kind, signal.text, signal.attrs["bytes_tried"]) == (
        SignalKind.GPU_OOM,
        OOM_LINE,
        232 * MiB,
    )


def test_engine_death_and_its_oom_in_one_record() -> None:
    record = (
        "ERROR 07-08 09:27:29 async_llm_engine.py:52] Engine background task failed\n"
        "ERROR 07-08 09:27:29 async_llm_engine.py:52] Traceback (most recent call last):\n"
        f"ERROR 07-08 09:27:29 async_llm_engine.py:52] {OOM_LINE}"
    )
    kinds = [s.kind for s in signals_from_log_line(log_line(record), SOURCE)]
    assert kinds == [SignalKind.GPU_OOM, SignalKind.ENGINE_DEAD]


def test_oom_at_the_end_of_a_giant_single_line() -> None:
    (signal,) = signals_from_log_line(log_line("x " * 20000 + OOM_LINE), SOURCE)
    assert (signal.kind, signal.attrs["gpu_index"]) == (SignalKind.GPU_OOM, 0)


@pytest.mark.parametrize(
    "text,attrs",
    [
        (  # the line alone cannot tell the device (shared corpus, ambiguous)
            "ResourceExhaustedError (see above for traceback): OOM when allocating tensor with "
            "shape[100,4096,32]",
            {"framework": "tensorflow", "ambiguous": True},
        ),
        (  # DayBreak-u/chineseocr_lite#355: the arena of the CPU provider, likely (NCHWc node)
            "2021-07-08 01:27:55.7944269 [E:onnxruntime:, sequential_executor.cc:339 "
            "onnxruntime::SequentialExecutor::Execute] Non-zero status code returned while "
            "running Conv node. Name:'347_nchwc' Status Message: D:\\a\\_work\\1\\s\\"
            "onnxruntime\\core\\framework\\bfc_arena.cc:330 onnxruntime::BFCArena::"
            "AllocateRawInternal Failed to allocate memory for requested buffer of size 285081600",
            {"framework": "onnxruntime", "bytes_tried": 285081600, "ambiguous": True},
        ),
        (  # fzyzcjy/torch_memory_saver#99: the allocator retries
            "[torch_memory_saver.cpp] cuMemCreate CUDA_ERROR_OUT_OF_MEMORY (may not be an issue "
            "e.g. torch allocator will free cache and retry)",
            {"framework": "cuda", "ambiguous": True},
        ),
        (  # gladiaio/gladia#802: another service's HTTP 500 body, relayed
            '  "detail": "The following error occurred: CUDA out of memory. Tried to allocate '
            "20.00 GiB (GPU 0; 31.75 GiB total capacity; 13.38 GiB already allocated; 15.96 GiB "
            'free; 14.63 GiB reserved in total by PyTorch)"',
            {
                "framework": "pytorch",
                "bytes_tried": 20 * GiB,
                "capacity_bytes": round(31.75 * GiB),
                "free_bytes": round(15.96 * GiB),
                "gpu_index": 0,
                "ambiguous": True,
                "quoted": True,
            },
        ),
    ],
)
def test_ambiguous_and_quoted_ooms_are_marked(text: str, attrs: dict[str, object]) -> None:
    (signal,) = signals_from_log_line(log_line(text), SOURCE)
    assert (signal.kind, signal.attrs) == (SignalKind.GPU_OOM, attrs)
