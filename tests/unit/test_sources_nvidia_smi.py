"""nvidia-smi ``--query-gpu ... --format=csv`` rows -> GPU_MEMORY."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import SignalKind, SourcePos
from detector.events.sources.nvidia_smi import signals_from_csv_line
from detector.events.sources.nvidia_smi_table import (
    is_nvidia_smi_table,
    signals_from_nvidia_smi_table,
)
from detector.events.sources.timeparse import parse_iso8601

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "gpu_metrics"
SRC = SourcePos("nvidia-smi.csv", 1)
SCRAPE = 1734429601.0
MIB = 1024 * 1024
UUID = "GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e"


def _rows() -> list[dict[str, Any]]:
    path = FIXTURES / "sources_nvidia_smi.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["text"][:30])
def test_real_rows(row: dict[str, Any]) -> None:
    signals = parse_record(row["text"], SRC, default_time=SCRAPE)
    if row["expect"] == []:
        assert signals == []
        return
    (sig,) = signals
    assert sig.kind is SignalKind.GPU_MEMORY and sig.time == SCRAPE
    assert {k: sig.attrs[k] for k in row["expect"]} == row["expect"]
    assert sig.attrs["metric"] == "nvidia_smi"
    assert (sig.pod, sig.namespace, sig.node) == (None, None, None)  # unattributed


def _corpus_rows() -> list[dict[str, Any]]:
    path = CORPUS / "nvidia_smi_query_csv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


_EXPECT_USED = {"vram_low": 0.05, "vram_partial": 0.6}  # the highest used/total ratio per label


@pytest.mark.parametrize("row", _corpus_rows(), ids=lambda r: r["expect"])
def test_corpus_rows(row: dict[str, Any]) -> None:
    """Every line of every corpus sample parses; memory signals match the sample's label."""
    signals = [
        s for line in row["text"].splitlines() for s in parse_record(line, SRC, default_time=SCRAPE)
    ]
    if row["expect"] == "vram_unknown":
        assert signals == []
        return
    assert signals and all(s.kind is SignalKind.GPU_MEMORY for s in signals)
    ratios = [s.attrs["used_bytes"] / s.attrs["total_bytes"] for s in signals]
    assert max(ratios) <= _EXPECT_USED[row["expect"]]


@pytest.mark.parametrize(
    ("line", "attrs", "time"),
    [
        (
            f"2024/05/01 10:00:00.123, 0, {UUID}, 79000 MiB, 81920 MiB",
            {"gpu": "0", "uuid": UUID, "used_bytes": 79000 * MIB, "total_bytes": 81920 * MIB},
            "2024-05-01T10:00:00.123Z",
        ),
        (  # ,noheader,nounits
            f"2024/05/01 10:00:00.123, 3, {UUID}, 79000, 81920",
            {"gpu": "3", "uuid": UUID, "used_bytes": 79000 * MIB, "total_bytes": 81920 * MIB},
            "2024-05-01T10:00:00.123Z",
        ),
        (  # nounits without the uuid column
            "2024/05/01 10:00:00.123, 1, 79000, 81920",
            {"gpu": "1", "uuid": None, "used_bytes": 79000 * MIB},
            "2024-05-01T10:00:00.123Z",
        ),
        (  # nounits, time and memory only
            "2024/05/01 10:00:00.123, 79000, 81920",
            {"gpu": None, "used_bytes": 79000 * MIB, "total_bytes": 81920 * MIB},
            "2024-05-01T10:00:00.123Z",
        ),
        (  # a MIG device UUID
            "0, MIG-GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e/1/0, 9000 MiB, 40192 MiB",
            {"gpu": "0", "uuid": "MIG-GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e/1/0"},
            None,
        ),
        (  # memory.total, memory.free, memory.used
            "2024/05/01 10:00:00, 0, 81920 MiB, 2920 MiB, 79000 MiB",
            {"used_bytes": 79000 * MIB, "free_bytes": 2920 * MIB, "total_bytes": 81920 * MIB},
            "2024-05-01T10:00:00Z",
        ),
    ],
)
def test_documented_queries(line: str, attrs: dict[str, Any], time: str | None) -> None:
    (sig,) = parse_record(line, SRC, default_time=SCRAPE)
    assert {k: sig.attrs[k] for k in attrs} == attrs
    assert sig.time == (parse_iso8601(time) if time else SCRAPE)


def test_header_variants_give_no_signal() -> None:
    for header in (
        "timestamp, index, uuid, memory.used [MiB], memory.total [MiB]",
        "memory.used [MiB], memory.total [MiB], memory.free [MiB]",
        "index, name",
    ):
        assert parse_record(header, SRC) == []


def test_a_prepended_host_name_is_the_node() -> None:
    (sig,) = parse_record("gpu-node-1, 0, 103 MiB, 16303 MiB", SRC, default_time=SCRAPE)
    assert sig.node == "gpu-node-1" and sig.attrs["gpu"] == "0" and sig.pod is None
    (sig,) = parse_record(f"gpu-node-1.example, 2024/05/01 10:00:00, 0, {UUID}, 1 MiB, 2 MiB", SRC)
    assert sig.node == "gpu-node-1.example" and sig.attrs["gpu"] == "0"


@pytest.mark.parametrize(
    ("line", "default", "reason"),
    [
        ("0, 79000 MiB", SCRAPE, "unknown_format"),  # used, free or total?
        ("0, 100 MiB, 200 MiB, 300 MiB", SCRAPE, "unknown_format"),  # largest not first
        ("0, 1 MiB, 2 MiB, 3 MiB, 4 MiB", SCRAPE, "unknown_format"),
        ("0, 79000 MiB, 81920 MiB", None, "missing_timestamp"),
        ("2024/13/45 10:00:00.123, 0, 1 MiB, 2 MiB", SCRAPE, "bad_timestamp"),
    ],
)
def test_rejects(line: str, default: float | None, reason: str) -> None:
    with pytest.raises(ParseError) as err:
        signals_from_csv_line(line, SRC, default_time=default)
    assert err.value.reason == reason


@pytest.mark.parametrize(
    "line",
    [
        "hello, world",
        "0, 1, 2",  # no unit, no uuid, no timestamp: not recognisably nvidia-smi
        "Loaded weights in 3.2 s, 14.2 GiB",
        "| N/A   53C    P0    47W / 250W |  31566MiB / 32768MiB |     10%      Default |",
        "no comma",
    ],
)
def test_not_nvidia_smi(line: str) -> None:
    assert signals_from_csv_line(line, SRC, default_time=SCRAPE) is None


def test_table_and_query_output_are_not_rows() -> None:
    """The human tables and ``-q`` output are not per-line records: rejected, never GPU memory."""
    for name in ("nvidia_smi_table_v100_near_full_535.txt", "nvidia_smi_q_fb_memory_usage.txt"):
        path = CORPUS / name
        if not path.exists():
            pytest.skip("corpus not found")
        for line in path.read_text().splitlines():
            if line.strip():
                with pytest.raises(ParseError):
                    parse_record(line, SRC, default_time=SCRAPE)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            ["0", "1", "79000 MiB", "81920 MiB", "2 MiB", "[N/A]", UUID, "2024/05/01 10:00:00.1",
             "2024/99/99 99:99:99", "gpu-node-1", "NVIDIA A100", "12 %", "", "81920", "x y"]
        ) | st.text(max_size=12),
        max_size=8,
    ),
    st.sampled_from([None, SCRAPE]),
)  # fmt: skip
def test_any_row(fields: list[str], default: float | None) -> None:
    try:
        signals = signals_from_csv_line(", ".join(fields), SRC, default_time=default)
    except ParseError as exc:
        assert exc.reason in ("unknown_format", "missing_timestamp", "bad_timestamp")
        return
    for sig in signals or []:
        assert 0 <= sig.attrs["used_bytes"] <= sig.attrs["total_bytes"]


# Real output of nvidia-smi 580.159.04 on an NVIDIA H200 (143771 MiB), 2026-11-29, captured by
# bench/device/capture_gpu.py: idle, and while a torch process held 100 GiB.
H200_UUID = "GPU-b3f3a64e-498b-373b-e74c-8126d3a663b4"


@pytest.mark.parametrize(
    ("name", "used_mib", "rows"),
    [
        ("nvidia_smi_h200_query_loop_idle.csv", 0, 4),  # -lms 500: the header once, then rows
        ("nvidia_smi_h200_query_holding.csv", 102927, 1),
    ],
)
def test_h200_query_output(name: str, used_mib: int, rows: int) -> None:
    lines = (FIXTURES / name).read_text().splitlines()
    assert parse_record(lines[0], SRC) == []  # the header
    signals = [s for line in lines[1:] for s in parse_record(line, SRC)]
    assert len(signals) == rows
    for sig in signals:
        assert sig.attrs == {
            "used_bytes": used_mib * MIB,
            "total_bytes": 143771 * MIB,
            "gpu": "0",
            "uuid": H200_UUID,
            "metric": "nvidia_smi",
        }
        assert sig.time > parse_iso8601("2026-11-29T19:07:00Z")
    assert [s.time for s in signals] == sorted(s.time for s in signals)


@pytest.mark.parametrize(
    ("name", "used_mib", "time"),
    [
        ("nvidia_smi_h200_table_idle.txt", 0, "2026-11-29T19:07:24Z"),
        ("nvidia_smi_h200_table_holding.txt", 102927, "2026-11-29T19:07:31Z"),
    ],
)
def test_h200_table(name: str, used_mib: int, time: str) -> None:
    text = (FIXTURES / name).read_text()
    assert is_nvidia_smi_table(text)
    (sig,) = signals_from_nvidia_smi_table(text, SRC)
    assert sig.kind is SignalKind.GPU_MEMORY and sig.time == parse_iso8601(time)
    assert (sig.attrs["used_bytes"], sig.attrs["total_bytes"]) == (used_mib * MIB, 143771 * MIB)
    assert str(sig.attrs["gpu"]) == "0"  # an int from the table, a string from the CSV query
    (same,) = parse_record(text, SRC)  # the whole table as one record, through the pipeline
    assert same.attrs == sig.attrs
