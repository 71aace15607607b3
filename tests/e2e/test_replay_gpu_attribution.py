"""Through the CLI: gpu-sample lines naming their pod, and --namespace/--pod on plain input.

The OOMs are the real H200 CUDA OOM (``tests/unit/fixtures/oom_h200_captured.jsonl``) in
``kubectl logs --prefix`` output of two pods 24 s apart; the GPU lines are what
``detector gpu-sample --node h200-1 --namespace llm --pod <pod>`` prints (``csv_line``, the
code behind it) for the H200's GPU, full (141,000 of 143,771 MiB) around the first OOM; the
plain nvidia-smi CSV is the real capture ``tests/unit/fixtures/nvidia_smi_h200_query_holding.csv``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from detector.events.sources.timeparse import parse_iso8601
from detector.gpu.nvml import GpuReading
from detector.gpu.sample import csv_line

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "unit" / "fixtures"
DETECTOR = Path(sys.executable).with_name("detector")
PODS = ("vllm-7d9f8b6c5-abcde", "vllm-7d9f8b6c5-fghij")
MIB = 1 << 20


def _oom() -> str:
    case = json.loads((FIXTURES / "oom_h200_captured.jsonl").read_text().splitlines()[0])
    assert case["expect"] == "gpu_oom"
    return str(case["text"].splitlines()[0])


def _full_h200() -> GpuReading:
    raw = json.loads((FIXTURES / "nvml_h200_readings.json").read_text())["holding"]["reading"]
    reading = GpuReading(**{**raw, "processes": ()})
    return dataclasses.replace(reading, used_bytes=141_000 * MIB)


def _replay(tmp_path: Path, *args: str) -> dict[str, Any]:
    db = f"sqlite:///{tmp_path / 'x.db'}"
    cmd = [str(DETECTOR), "replay", "--json", "--db", db, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    path = tmp_path / "kubectl-logs-prefix.log"
    path.write_text(
        f"[pod/{PODS[0]}/vllm] 2026-11-29T10:00:01Z {_oom()}\n"
        f"[pod/{PODS[1]}/vllm] 2026-11-29T10:00:25Z {_oom()}\n",
        encoding="utf-8",
    )
    return path


def test_gpu_sample_lines_of_the_oom_pod_join_its_incident(tmp_path: Path, logs: Path) -> None:
    start = parse_iso8601("2026-11-29T09:59:50Z")
    samples = tmp_path / "gpu-metrics.csv"
    samples.write_text(
        "".join(
            csv_line(_full_h200(), start + 5 * i, "h200-1", ("llm", PODS[0])) + "\n"
            for i in range(10)
        ),
        encoding="utf-8",
    )
    doc = _replay(tmp_path, "--namespace", "llm", str(logs), str(samples))
    assert doc["events"]["unattributed"] == 0
    (incident,) = doc["incidents"]
    assert incident["workload"] == "llm/vllm"
    assert set(incident["signals"]) == {"gpu_oom", "gpu_memory"}
    messages = [t["message"] for t in incident["timeline"]]
    assert f"gpu_memory: GPU memory at 98% in pod {PODS[0]}" in messages


def test_without_the_pod_fields_the_same_lines_stay_unattributed(
    tmp_path: Path, logs: Path
) -> None:
    start = parse_iso8601("2026-11-29T09:59:50Z")
    samples = tmp_path / "gpu-metrics.csv"
    samples.write_text(
        "".join(csv_line(_full_h200(), start + 5 * i, "h200-1") + "\n" for i in range(10)),
        encoding="utf-8",
    )
    doc = _replay(tmp_path, "--namespace", "llm", str(logs), str(samples))
    kinds = {r["kind"]: r["count"] for r in doc["events"]["unattributed_by_reason"]}
    assert kinds == {"gpu_memory": 10}
    (incident,) = doc["incidents"]
    assert incident["signals"] == ["gpu_oom"]


def test_replay_pod_attributes_plain_nvidia_smi_csv(tmp_path: Path) -> None:
    csv = tmp_path / "nvidia-smi.csv"
    csv.write_text((FIXTURES / "nvidia_smi_h200_query_holding.csv").read_text())
    bare = _replay(tmp_path, str(csv))
    assert bare["events"]["unattributed"] > 0
    doc = _replay(tmp_path, "--namespace", "llm", "--pod", PODS[0], str(csv))
    assert doc["events"]["unattributed"] == 0


def test_replay_namespace_names_a_pasted_get_pods_table(tmp_path: Path) -> None:
    paste = tmp_path / "get-pods.txt"
    paste.write_text(
        "NAME                    READY   STATUS             RESTARTS      AGE\n"
        f"{PODS[0]}    0/1     CrashLoopBackOff   5 (30s ago)   10m\n",
        encoding="utf-8",
    )
    assert _replay(tmp_path, str(paste))["events"]["unattributed"] == 1
    doc = _replay(tmp_path, "--namespace", "llm", str(paste))
    assert doc["events"]["unattributed"] == 0
    assert doc["events"]["unattributed_by_reason"] == []
