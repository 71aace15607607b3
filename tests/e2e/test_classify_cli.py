"""End to end through the CLI: `detector classify` on lines, streams and labelled corpora."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus"
PUBLIC = REPO / "tests" / "unit" / "fixtures" / "oom_public.jsonl"
DETECTOR = Path(sys.executable).with_name("detector")
NO_CORPUS = pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus not found")

OOM = (  # vllm-project/vllm#26863
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 232.00 MiB. GPU 0 has a total "
    "capacity of 23.57 GiB of which 154.25 MiB is free."
)


def run(*args: str, stdin: bytes = b"") -> tuple[int, str]:
    """Run ``detector classify ARGS`` and return its exit code and standard output."""
    cmd = [str(DETECTOR), "classify", *args]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=120, check=False)
    return proc.returncode, proc.stdout.decode("utf-8")


def rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_stdin_lines_json_and_malformed_input() -> None:
    stdin = b"\n".join(
        [
            OOM.encode(),
            json.dumps({"id": "r1", "text": "INFO ready", "extra": "x" * 100}).encode(),
            b'{"text": "unterminated',
            b"caf\xe9 CUDA out of memory",
            b"bin\x00ary",
            b'{"no_text": 1}',
            b"x" * 100_000 + OOM.encode(),
            b"HIP error: hipErrorOutOfMemory",
        ]
    )
    code, out = run("-", stdin=stdin)
    got = rows(out)
    assert code == 0 and [row["line"] for row in got] == list(range(1, 9))
    first = got[0]
    assert (first["gpu_oom"], first["verdict"], first["framework"]) == (True, "gpu_oom", "pytorch")
    assert (first["bytes_tried"], first["gpu_index"], first["file"]) == (232 << 20, 0, "-")
    assert got[1] == {
        "file": "-",
        "line": 2,
        "id": "r1",
        "gpu_oom": False,
        "verdict": "not_gpu_oom",
        "framework": None,
        "reason": "",
        "bytes_tried": None,
        "capacity_bytes": None,
        "free_bytes": None,
        "gpu_index": None,
    }
    assert [("error" in row) for row in got] == [False, False, True, True, True, True, False, False]
    assert got[2]["gpu_oom"] is None and got[2]["error"].startswith("malformed JSON")
    assert "UTF-8" in got[3]["error"] and "binary" in got[4]["error"]
    assert got[6]["gpu_oom"] is True  # the OOM sits past the first 16 KiB of a huge line
    assert got[7]["framework"] == "rocm"


def test_ambiguous_and_quoted_lines(tmp_path: Path) -> None:
    path = tmp_path / "lines.log"
    path.write_text(
        "ResourceExhaustedError: OOM when allocating tensor with shape[100,4096,32]\n"
        'gateway: upstream body {"error": "CUDA out of memory. Tried to allocate 2.00 GiB"}\n',
        encoding="utf-8",
    )
    code, out = run(str(path))
    ambiguous, quoted = rows(out)
    assert code == 0 and ambiguous["gpu_oom"] == "ambiguous"
    assert (quoted["gpu_oom"], quoted["quoted"], quoted["bytes_tried"]) == (True, True, 2 << 30)


@NO_CORPUS
def test_multiline_reports_each_oom_event_once() -> None:
    files = [
        CORPUS / "gpu_oom" / "002_startup_kv_cache_insufficient.log",
        CORPUS / "gpu_oom" / "001_startup_kv_cache_no_memory.log",
        *sorted((CORPUS / "lookalikes").glob("*.log")),
    ]
    code, out = run("--multiline", *map(str, files))
    got = rows(out)
    assert code == 0
    assert [(Path(row["file"]).name[:3], row["line"]) for row in got] == [("002", 1), ("001", 2)]
    assert "KV cache is needed" in got[0]["excerpt"]


@NO_CORPUS
def test_report_on_the_corpus_and_public_fixtures() -> None:
    corpus = [CORPUS / "gpu_oom" / "gpu_oom_single_line.jsonl"]
    corpus.append(CORPUS / "lookalikes" / "lookalikes_single_line.jsonl")
    for paths in (corpus, [PUBLIC]):
        code, out = run("--report", *map(str, paths))
        doc = json.loads(out)
        assert code == 0 and doc["rows"] > 30 and doc["errors"] == 0
        assert (doc["gpu_oom"]["precision"], doc["gpu_oom"]["recall"]) == (1.0, 1.0)
        assert doc["mismatches"] == [] and set(doc["confusion"]) >= {"gpu_oom", "not_gpu_oom"}


def test_report_counts_disagreements(tmp_path: Path) -> None:
    path = tmp_path / "labelled.jsonl"
    labelled = [
        {"text": OOM, "expect": "gpu_oom"},
        {"text": "INFO ready", "expect": "gpu_oom"},
        {"text": "vllm-1 exited with code 137", "expect": "not_gpu_oom"},
        {"text": "RuntimeError: CUDA error: out of memory", "expect": "not_gpu_oom"},
        {"text": "Error: ShardCannotStart", "expect": "engine_dead_after_gpu_oom"},
        {"text": "no label"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in labelled) + "{bad\n")
    code, out = run("--report", str(path))
    doc = json.loads(out)
    assert code == 0 and (doc["rows"], doc["unlabelled"], doc["errors"]) == (5, 1, 1)
    assert doc["gpu_oom"] == {
        "precision": 0.5,
        "recall": 0.5,
        "recall_with_ambiguous": 0.5,
        "tp": 1,
        "fp": 1,
        "fn": 1,
        "tn": 2,
    }
    assert doc["label_agreement"] == 0.6
    assert [m["line"] for m in doc["mismatches"]] == [2, 4]


def test_a_missing_file_exits_2() -> None:
    code, _ = run("/nonexistent/file.log")
    assert code == 2
