"""Through the CLI: the bundled cascade with its pods in a StatefulSet is the same incident
(issue 24: "no signal lost silently").

``examples/cascade`` is a vLLM Deployment ``vllm-llama`` behind ingress-nginx (upstream
``llm-vllm-llama-8000``). Rewritten here as a StatefulSet (``as_statefulset``: pods
``<name>-0..3``, the owner a StatefulSet, a StatefulSet pod's labels; the upstream unchanged),
its load-balancer lines were a separate "Deployment": the incident had no ``lb_errors``, a
"failing upstream" verdict contradicted it, and the 429 step was sized from an ``unknown``
budget. Without the access log at all, the 429 step is not sized and acts on nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CASCADE = REPO / "examples" / "cascade"
DETECTOR = Path(sys.executable).with_name("detector")
RS_HASH = "t4pz2q9s6"  # the Deployment's ReplicaSet vllm-llama-t4pz2q9s6
POD = re.compile(rf"vllm-llama-{RS_HASH}-[a-z0-9]{{5}}")


def as_statefulset(src: Path, dst: Path, name: str) -> dict[str, str]:
    """Rewrite every file of ``src`` into ``dst`` with the pods in StatefulSet ``name``; return
    old pod -> new pod (``<name>-<n>`` in order of first appearance)."""
    texts = {f.name: f.read_text(encoding="utf-8") for f in sorted(src.glob("*.jsonl"))}
    pods: dict[str, str] = {}
    for text in texts.values():
        for m in POD.finditer(text):
            pods.setdefault(m[0], f"{name}-{len(pods)}")
    owner = f'"kind":"ReplicaSet","name":"vllm-llama-{RS_HASH}"'
    label = f'"pod-template-hash":"{RS_HASH}"'
    for file, text in texts.items():
        lines = []
        for line in text.splitlines():
            for old, new in pods.items():
                line = line.replace(old, new)
            line = line.replace(owner, f'"kind":"StatefulSet","name":"{name}"')
            if label in line:
                pod = next(p for p in pods.values() if f'"{p}"' in line)
                line = line.replace(label, f'"statefulset.kubernetes.io/pod-name":"{pod}"')
            assert RS_HASH not in line, line[:200]
            lines.append(line)
        (dst / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return pods


def replay(folder: Path, *args: str) -> dict[str, Any]:
    cmd = [str(DETECTOR), "replay", "--json", "--db", "sqlite://", *args, str(folder)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def step(incident: dict[str, Any], action: str) -> dict[str, Any]:
    (found,) = [s for s in incident["steps"] if s["action"] == action]
    return found


def stages(incident: dict[str, Any]) -> list[str]:
    return [t["message"].split(":")[0] for t in incident["timeline"] if t["kind"] == "stage"]


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    (incident,) = replay(CASCADE)["incidents"]
    return incident


@pytest.mark.parametrize(
    ("name", "mapping"),
    [
        ("vllm-llama", None),  # the Service, the upstream and the StatefulSet share the name
        ("llama-serve", "llm-vllm-llama-8000: {namespace: llm, workload: llama-serve}"),
    ],
    ids=["same-name", "renamed-with-workloads-file"],
)
def test_a_statefulset_cascade_is_the_deployments_incident(
    tmp_path: Path, deployment: dict[str, Any], name: str, mapping: str | None
) -> None:
    pods = as_statefulset(CASCADE, tmp_path, name)
    assert sorted(pods.values()) == [f"{name}-{n}" for n in range(4)]
    args: list[str] = []
    if mapping is not None:
        workloads = tmp_path / "workloads.yaml"
        workloads.write_text(f"upstreams:\n  {mapping}\n", encoding="utf-8")
        args = ["--workloads", str(workloads)]
    doc = replay(tmp_path, *args)
    (incident,) = doc["incidents"]
    opened_at = deployment["key"].split("@")[1]
    assert incident["key"] == f"llm/{name}@{opened_at}"
    assert (incident["workload"], incident["workload_kind"]) == (f"llm/{name}", "StatefulSet")
    assert stages(incident) == stages(deployment)
    assert incident["pods"] == [pods[p] for p in deployment["pods"]]
    assert incident["signals"] == deployment["signals"]
    assert "lb_errors" in incident["signals"]
    assert [c["signal"] for c in incident["coverage"] if c["seen"]] == [
        "gpu_oom", "crash_loop", "lb_errors", "gpu_memory"
    ]  # fmt: skip
    assert not [v for v in doc["verdicts"] if "failing upstream" in v["reason"]]
    budget = step(incident, "enable_rate_limit")["params"]["aggregate_budget_rps"]
    assert budget == step(deployment, "enable_rate_limit")["params"]["aggregate_budget_rps"]
    assert budget != "unknown" and float(budget) > 0


def test_without_the_access_log_no_step_acts_on_an_unknown_budget(tmp_path: Path) -> None:
    for file in ("container-logs.jsonl", "k8s-events.jsonl", "gpu-metrics.jsonl"):
        shutil.copy(CASCADE / file, tmp_path / file)
    (incident,) = replay(tmp_path)["incidents"]
    shed = step(incident, "enable_rate_limit")
    assert shed["params"]["aggregate_budget_rps"] == "unknown"
    assert "no load-balancer line of the workload" in shed["params"]["lacks"]
    moves = [
        (t["detail"]["step"], t["detail"]["event"], t["detail"]["reason"])
        for t in incident["timeline"]
        if t["kind"] == "step" and t.get("detail")
    ]
    shed_moves = [(event, reason) for s, event, reason in moves if s == "enable_rate_limit"]
    (only,) = shed_moves  # never approved, asked for, applied or lifted: passed over
    assert only[0] == "not_needed" and only[1].startswith("not sized, nothing applied")
    assert shed["state"] == "not_needed"
    lb = next(c for c in incident["coverage"] if c["signal"] == "lb_errors")
    assert (lb["seen"], lb["reason"]) == (False, "no lines")  # the coverage names it
    # the turn went on: the restarts were asked for
    assert ("stagger_restarts", "approval_requested") in [(s, e) for s, e, _ in moves]
