"""One container log line -> Signals: identity, attrs, truncation and the cheap pre-filter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from detector.events.classify import OomClass, classify_line
from detector.events.container_log import MAX_TEXT_CHARS, signals_from_log_line
from detector.events.engine_lines import parse_engine_line
from detector.events.model import LogLine, SignalKind, SourcePos

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
    kinds = {OomClass.GPU_OOM, OomClass.ENGINE_DEAD, OomClass.HOST_OOM}
    for text in _real_lines():
        expected = [SignalKind(v.verdict) for v in [classify_line(text)] if v.verdict in kinds]
        engine = parse_engine_line(text)
        expected += [engine[0]] if engine else []
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
