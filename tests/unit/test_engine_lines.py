"""Serving-engine config and pressure lines (vLLM, TGI, SGLang) from public bug reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.events.engine_lines import MAX_ARGS_CHARS, parse_engine_line
from detector.events.model import SignalKind

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "engine_lines.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line]


def test_fixture_rows_name_their_source() -> None:
    assert len(ROWS) >= 20
    assert all(row["source"].startswith("https://") for row in ROWS)


@pytest.mark.parametrize(
    "row", ROWS, ids=[f"{i}-{r['source'].rsplit('/', 3)[-3]}" for i, r in enumerate(ROWS)]
)
def test_real_lines(row: dict[str, Any]) -> None:
    parsed = parse_engine_line(row["text"])
    if row["kind"] is None:
        assert parsed is None
        return
    assert parsed is not None, row["text"]
    kind, attrs = parsed
    assert kind == SignalKind(row["kind"])
    assert attrs == pytest.approx(row["attrs"])


def test_non_literal_dict_falls_back_to_scalar_items() -> None:
    line = (
        "(APIServer pid=5) INFO 03-02 11:00:22 [utils.py:253] non-default args: {'model_tag': "
        "'unsloth/Qwen2.5-32B-Instruct', 'lora_modules': [LoRAModulePath(name='a', path='b', "
        "base_model_name=None)], 'max_model_len': 8192, 'max_num_seqs': 4}"
    )
    assert parse_engine_line(line) == (
        SignalKind.ENGINE_CONFIG,
        {"engine": "vllm", "max_num_seqs": 4, "max_model_len": 8192, "paged_attention": True},
    )


def test_oversized_or_hostile_dict_is_not_evaluated() -> None:
    padding = ", ".join(f"'k{i}': {i}" for i in range(MAX_ARGS_CHARS // 8))
    big = "non-default args: {" + padding + ", 'max_num_seqs': 64}"
    assert parse_engine_line(big) == (
        SignalKind.ENGINE_CONFIG,
        {"engine": "vllm", "max_num_seqs": 64, "paged_attention": True},
    )
    assert parse_engine_line("non-default args: " + "{" * 5000) is None
    assert parse_engine_line("non-default args: {'max_model_len': 1e999}") is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        'INFO:     10.0.0.1:40192 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "ValueError: No available memory for the cache blocks.",
        "Try increasing `gpu_memory_utilization` when initializing the engine.",
        'Args { model_id: "x", revision: None }',
    ],
)
def test_lines_without_engine_numbers(text: str) -> None:
    assert parse_engine_line(text) is None
