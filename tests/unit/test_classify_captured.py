"""The GPU OOM classifier on real out-of-memory errors provoked on an NVIDIA H200.

``fixtures/oom_h200_captured.jsonl``: one row per line, captured by
``bench/device/capture_gpu.py`` (each row names its ``source``): ``text`` is the exception line
(or allocator warning) as a log shows it, ``log`` the process's whole stderr around it (the
traceback, the continuation lines), ``label`` the framework the classifier must name (null where
it has no label of its own: CuPy reads as generic ``cuda``), and the sizes the line states.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.events.classify import NUMBER_FIELDS, OomClass, classify_line
from detector.events.multiline import find_ooms

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "oom_h200_captured.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line]
WITH_LOG = [row for row in ROWS if "log" in row]
# (case, field) read wrong today: CuPy writes sizes with thousands separators ("8,589,934,592
# bytes"), which the size pattern in detector.events.classify stops at ("8").
MISREAD = {("cupy", "bytes_tried")}


def _numbers(row: dict[str, Any], numbers: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (k, numbers[k]) for k in NUMBER_FIELDS if k in numbers and (row["case"], k) not in MISREAD
    ]


def test_every_framework_was_captured() -> None:
    assert {row["framework"] for row in ROWS} >= {"pytorch", "jax", "cupy"}
    assert all(row["source"].startswith("captured on NVIDIA H200, driver ") for row in ROWS)
    assert {row.get("env") for row in ROWS} >= {
        "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "XLA_PYTHON_CLIENT_PREALLOCATE=false",
    }


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["case"])
def test_captured_line(row: dict[str, Any]) -> None:
    result = classify_line(row["text"])
    assert result.verdict is OomClass.GPU_OOM, (result, row["text"])
    if row["label"] is not None:
        assert result.framework == row["label"]
    for key, value in _numbers(row, row):
        assert getattr(result, key) == value, key
    assert not result.quoted


@pytest.mark.parametrize("row", WITH_LOG, ids=lambda row: row["case"])
def test_captured_log_is_one_event(row: dict[str, Any]) -> None:
    """The whole stderr (traceback, allocator warnings, continuation lines): one OOM event."""
    (hit,) = find_ooms(row["log"].splitlines())
    assert hit.classification.verdict is OomClass.GPU_OOM
    if row["label"] is not None:
        assert hit.classification.framework == row["label"]
    for key, value in _numbers(row, row.get("log_numbers", row)):
        assert getattr(hit.classification, key) == value, key


def test_cupy_size_with_thousands_separators() -> None:
    (row,) = [row for row in ROWS if row["case"] == "cupy"]
    assert classify_line(row["text"]).bytes_tried == row["bytes_tried"]
