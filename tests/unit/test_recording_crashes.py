"""The ``illegal-address`` recording: deterministic, no GPU OOM wording, VRAM at 96 %."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from detector.lab.recording import EXTRA_SCENARIOS, SCENARIOS, main, write_recording

GPU_OOM = re.compile(r"out of memory|OutOfMemoryError|cudaErrorMemoryAllocation", re.IGNORECASE)
H100_MIB = 81559


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    first = write_recording("illegal-address", tmp_path / "a", seed=3)
    second = write_recording("illegal-address", tmp_path / "b", seed=3)
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_it_is_written_on_request_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "illegal-address" in EXTRA_SCENARIOS and "illegal-address" not in SCENARIOS
    assert main(["--out", str(tmp_path), "--scenario", "illegal-address"]) == 0
    assert "records" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["illegal-address"]


def test_pods_die_of_illegal_address_with_vram_at_the_reservation(tmp_path: Path) -> None:
    paths = {p.name: p for p in write_recording("illegal-address", tmp_path)}
    logs = paths["container-logs.jsonl"].read_text(encoding="utf-8")
    assert not GPU_OOM.search(logs)
    records = [json.loads(line) for line in logs.splitlines()]
    died = {r["kubernetes"]["pod_name"] for r in records if "illegal memory access" in r["log"]}
    assert len(died) == 3  # two crash-loop, the third dies once, later
    assert "'gpu_memory_utilization': 0.9" in logs
    assert "vllm:kv_cache_usage_perc" not in paths["gpu-metrics.jsonl"].read_text()
    used = [
        json.loads(line)
        for line in paths["gpu-metrics.jsonl"].read_text().splitlines()
        if "DCGM_FI_DEV_FB_USED" in line
    ]
    top = max(float(s["value"]) for s in used) / H100_MIB
    assert 0.955 < top < 0.965
    events = paths["k8s-events.jsonl"].read_text()
    assert "BackOff" in events
