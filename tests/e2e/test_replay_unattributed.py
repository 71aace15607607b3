"""Through the CLI: GPU OOMs that name no workload are reported, never dropped in silence.

The dump is ``kubectl logs --prefix`` output (``[pod/<pod>/<container>] ``) of two pods dying
of a real CUDA OOM (the H200 capture in ``tests/unit/fixtures/oom_h200_captured.jsonl``) 24 s
apart: without --namespace the pods cannot be tied to a workload.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "unit" / "fixtures" / "oom_h200_captured.jsonl"
DETECTOR = Path(sys.executable).with_name("detector")
PODS = ("vllm-7d9f8b6c5-abcde", "vllm-7d9f8b6c5-fghij")


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    case = json.loads(FIXTURE.read_text(encoding="utf-8").splitlines()[0])
    assert case["expect"] == "gpu_oom"
    oom = case["text"].splitlines()[0]
    path = tmp_path_factory.mktemp("dump") / "kubectl-logs-prefix.log"
    path.write_text(
        f"[pod/{PODS[0]}/vllm] 2026-11-29T10:00:01Z {oom}\n"
        f"[pod/{PODS[1]}/vllm] 2026-11-29T10:00:25Z {oom}\n",
        encoding="utf-8",
    )
    return path


def _replay(tmp_path: Path, dump: Path, *args: str) -> str:
    cmd = [str(DETECTOR), "replay", "--db", f"sqlite:///{tmp_path / 'x.db'}", *args, str(dump)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_text_report_warns_of_unattributed_gpu_ooms(tmp_path: Path, dump: Path) -> None:
    out = " ".join(_replay(tmp_path, dump).split())  # rich wraps long lines
    assert "0 incident(s)" in out
    assert "warning: 2 unattributed GPU OOM signal(s): no namespace" in out
    assert "pass --namespace NS" in out
    assert f"{dump}:1 (pod {PODS[0]})" in out
    assert f"{dump}:2 (pod {PODS[1]})" in out


def test_json_carries_the_reasons(tmp_path: Path, dump: Path) -> None:
    doc: dict[str, Any] = json.loads(_replay(tmp_path, dump, "--json"))
    events = doc["events"]
    assert events["unattributed"] == 2
    (reason,) = events["unattributed_by_reason"]
    assert (reason["kind"], reason["reason"], reason["count"]) == ("gpu_oom", "no namespace", 2)
    assert "--namespace" in reason["hint"]
    assert [e["pod"] for e in reason["examples"]] == list(PODS)
    assert [e["source"] for e in reason["examples"]] == [f"{dump}:1", f"{dump}:2"]


def test_with_namespace_the_ooms_open_an_incident(tmp_path: Path, dump: Path) -> None:
    doc: dict[str, Any] = json.loads(_replay(tmp_path, dump, "--json", "--namespace", "llm"))
    assert doc["events"]["unattributed"] == 0
    assert doc["events"]["unattributed_by_reason"] == []
    (incident,) = doc["incidents"]
    assert incident["workload"] == "llm/vllm"
    victims = [t["message"] for t in incident["timeline"] if t["message"].startswith("victim #")]
    assert [m.split("pod ")[1].split()[0] for m in victims] == list(PODS)


def test_pasted_get_pods_table_without_namespace_is_reported(tmp_path: Path) -> None:
    paste = tmp_path / "get-pods.txt"
    paste.write_text(
        "NAME                    READY   STATUS             RESTARTS      AGE\n"
        f"{PODS[0]}    0/1     CrashLoopBackOff   5 (30s ago)   10m\n",
        encoding="utf-8",
    )
    doc: dict[str, Any] = json.loads(_replay(tmp_path, paste, "--json"))
    (reason,) = doc["events"]["unattributed_by_reason"]
    assert (reason["kind"], reason["reason"], reason["count"]) == ("crash_loop", "no namespace", 1)
    assert "kubectl get pods -A" in reason["hint"]
    assert reason["examples"] == [{"source": f"{paste}:1", "pod": PODS[0]}]
