"""End to end through the CLI: `detector replay --json examples/` on the bundled recordings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DETECTOR = Path(sys.executable).with_name("detector")


def replay_json(db_url: str, *paths: Path) -> dict[str, Any]:
    cmd = [str(DETECTOR), "replay", "--json", "--db", db_url, *map(str, paths)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("e2e") / "demo.db"
    return replay_json(f"sqlite:///{db}", EXAMPLES)


def test_exactly_one_cascade_incident_for_the_positive_recording(demo: dict[str, Any]) -> None:
    incidents = demo["incidents"]
    assert len(incidents) == 1
    inc = incidents[0]
    assert inc["pattern"] == "gpu_oom_cascade"
    assert inc["workload"] == "llm/vllm-llama"
    assert inc["stage"] in ("cascading", "contained", "resolved")
    assert any(t["message"].startswith("stage -> cascading") for t in inc["timeline"])
    assert sorted(inc["signals"]) == ["crash_loop", "gpu_memory", "gpu_oom", "lb_errors"]


def test_victims_are_listed_in_order_of_failure(demo: dict[str, Any]) -> None:
    inc = demo["incidents"][0]
    pods = inc["pods"]
    assert len(pods) >= 4 and len(set(pods)) == len(pods)
    assert all(p.startswith("vllm-llama-") for p in pods)
    victim_lines = [t for t in inc["timeline"] if t["message"].startswith("victim #")]
    assert [t["message"].split("pod ")[1].split()[0] for t in victim_lines] == pods
    times = [t["time"] for t in victim_lines]
    assert times == sorted(times)


def test_four_containment_steps_are_planned_in_dry_run(demo: dict[str, Any]) -> None:
    steps = demo["incidents"][0]["steps"]
    assert [s["action"] for s in steps] == [
        "quarantine_requests",
        "lower_batch_ceiling",
        "enable_rate_limit",
        "stagger_restarts",
    ]
    assert all(s["status"] == "dry_run" for s in steps)
    assert {s["params"]["mechanism"] for s in steps} == {"load"}  # no request class stands out
    restart = steps[3]["params"]
    assert restart  # rendered from the incident, not empty


def test_questions_are_answered_from_the_evidence(demo: dict[str, Any]) -> None:
    questions = demo["incidents"][0]["questions"]
    assert len(questions) == 3
    for q in questions:
        assert q["answer"] or q["to_check"], q
    answered = [q for q in questions if q["answer"]]
    assert answered and all(q["evidence"] for q in answered)


def test_negatives_yield_only_verdicts(demo: dict[str, Any]) -> None:
    by_workload = {v["workload"]: v for v in demo["verdicts"]}
    assert "batch/embedder" in by_workload
    assert "shop/reranker" in by_workload
    assert "host-RAM" in by_workload["batch/embedder"]["reason"]
    assert "no GPU OOM" in by_workload["shop/reranker"]["reason"]
    assert {i["workload"] for i in demo["incidents"]} == {"llm/vllm-llama"}


def test_counts_add_up(demo: dict[str, Any]) -> None:
    ev = demo["events"]
    assert ev["read"] == ev["parsed"] + ev["rejected"]
    assert ev["parsed"] > 1000


def test_replaying_twice_creates_no_duplicates(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'twice.db'}"
    first = replay_json(url, EXAMPLES / "cascade")
    second = replay_json(url, EXAMPLES / "cascade")
    assert [i["id"] for i in first["incidents"]] == [i["id"] for i in second["incidents"]]
    assert len(first["incidents"][0]["timeline"]) == len(second["incidents"][0]["timeline"])


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    cmd = [str(DETECTOR), "replay", "--db", f"sqlite:///{tmp_path / 'x.db'}", "/nonexistent"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "nonexistent" in proc.stderr


def test_replay_on_postgresql(postgres_url: str) -> None:
    doc = replay_json(postgres_url, EXAMPLES)
    assert len(doc["incidents"]) == 1
    assert len(doc["verdicts"]) >= 2


def test_a_second_replay_keeps_the_final_plan(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    first = replay_json(url, EXAMPLES / "cascade")
    second = replay_json(url, EXAMPLES / "cascade")
    assert second["incidents"][0]["steps"] == first["incidents"][0]["steps"]
    restart = second["incidents"][0]["steps"][3]
    assert restart["state"] == "withdrawn"
    assert restart["params"]["pods"] == []  # every pod came back before anyone approved


def test_an_invalid_setting_is_a_clear_error(tmp_path: Path) -> None:
    cmd = [str(DETECTOR), "replay", "--db", f"sqlite:///{tmp_path / 'x.db'}", str(EXAMPLES)]
    env = {**os.environ, "DETECTOR_CORRELATE__MEMORY_CEILING": "95"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert proc.returncode == 2
    assert "DETECTOR_CORRELATE__MEMORY_CEILING" in proc.stderr and "Traceback" not in proc.stderr


def test_the_readable_report_names_every_part(tmp_path: Path) -> None:
    cmd = [str(DETECTOR), "replay", "--db", f"sqlite:///{tmp_path / 'r.db'}", str(EXAMPLES)]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "1 incident(s)" in out and "2 verdict(s)" in out
    assert "victims in order: vllm-llama-" in out
    for action in ("lower_batch_ceiling", "enable_rate_limit", "stagger_restarts"):
        assert f"{action} [dry_run, approval" in out
    assert out.count("? ") >= 3 and "host-RAM OOM" in out


def test_a_plain_text_pod_log_is_read_with_the_identity_given(tmp_path: Path) -> None:
    corpus = REPO.parent / "shared" / "corpus" / "gpu_oom" / "001_startup_kv_cache_no_memory.log"
    if not corpus.exists():
        pytest.skip("../shared/corpus is not beside the checkout")
    cmd = [str(DETECTOR), "replay", "--json", "--db", f"sqlite:///{tmp_path / 't.db'}"]
    cmd += ["--namespace", "llm", "--pod", "vllm-0", "--workload", "StatefulSet/vllm", str(corpus)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["events"]["rejected"] == 0
    assert [(i["workload"], i["pods"]) for i in doc["incidents"]] == [("llm/vllm", ["vllm-0"])]
    without = subprocess.run([*cmd[:5], str(corpus)], capture_output=True, text=True, check=False)
    assert json.loads(without.stdout)["events"]["rejected"] > 0  # no identity: unknown format


def test_every_step_shows_its_change_approval_and_verification(demo: dict[str, Any]) -> None:
    """The dry-run replay shows, per step, its diff, approval and verification."""
    inc = demo["incidents"][0]
    quarantine, ceiling, rate, restart = inc["steps"]
    for step in inc["steps"]:
        assert step["approval_state"]["status"] in ("approved", "withdrawn", "not_requested")
        assert step["verification"]["result"] in ("passed", "failed", "not_run")
    # the bundled cascade's mechanism is load on vLLM: no request class, the KV cache paged
    for step in (quarantine, ceiling):
        assert (step["state"], step["mode"]) == ("not_needed", None)
        assert "not for this mechanism: load" in step["reason"]
    assert 'nginx.ingress.kubernetes.io/limit-rps: "' in rate["diff"]
    assert restart["diff"] == ""  # withdrawn: no pod left to evict
    # the cascade spread after the automatic step: verified failed, escalated to the next
    assert (rate["state"], rate["mode"], rate["policy"]) in (
        ("escalated", "dry_run", "auto"),
        ("lifting", "dry_run", "auto"),  # relaxed once the incident was contained
    )
    assert rate["approval_state"]["decided_by"] == "policy:auto"
    checks = {c["check"]: c for c in rate["verification"]["checks"]}
    assert rate["verification"]["result"] == "failed" and not checks["ooms_stop"]["ok"]
    # every pod came back while it waited: the restart step was withdrawn, nothing evicted
    assert (restart["state"], restart["policy"]) == ("withdrawn", "approval")
    assert restart["approval_state"]["status"] == "withdrawn"
    assert restart["approval_state"]["approver_group"] == "sre-oncall"
    assert restart["verification"]["result"] == "not_run"
    assert "no pod is still down" in restart["reason"]


def test_the_timeline_records_each_transition_with_actor_and_diff(demo: dict[str, Any]) -> None:
    inc = demo["incidents"][0]
    steps = [t for t in inc["timeline"] if t["kind"] == "step" and "detail" in t]
    details = [t["detail"] for t in steps]
    events = [(d["step"], d["event"]) for d in details]
    assert events[:9] == [
        ("quarantine_requests", "not_needed"),  # not for this mechanism (load)
        ("lower_batch_ceiling", "not_needed"),
        ("enable_rate_limit", "auto_approved"),
        ("enable_rate_limit", "applied"),
        ("enable_rate_limit", "escalated"),
        ("stagger_restarts", "approval_requested"),
        ("stagger_restarts", "approval_re_requested"),  # a pod came back: a smaller plan
        ("stagger_restarts", "approval_re_requested"),
        ("stagger_restarts", "approval_re_requested"),
    ]
    assert events[9] == ("stagger_restarts", "withdrawn")  # the last one came back
    assert set(events[10:]) <= {("enable_rate_limit", "lifted")}  # relaxed once contained
    for d in details:
        assert d["actor"] and d["reason"] and d["state"]
    applied = [d for d in details if d["event"] == "applied"]
    assert all(d["mode"] == "dry_run" and d["diff"] for d in applied)
    escalated = [d for d in details if d["event"] == "escalated"]
    assert all(d["verification"]["result"] == "failed" for d in escalated)
    asked = details[5]
    assert "restart vllm-llama-" in asked["reason"] and "one at a time" in asked["reason"]
    assert asked["approval"]["status"] == "pending"
    messages = [t["message"] for t in steps]
    assert "would be applied [dry-run: nothing changed; the detector runs with" in messages[3]


def test_a_dry_run_cascade_was_contained_by_its_pods_not_by_containment(
    demo: dict[str, Any],
) -> None:
    """Every step of the replay ran in dry-run: nothing changed the cluster, so ``contained``
    says the cascade stopped without containment (``detector.report.recovery``)."""
    inc = demo["incidents"][0]
    (contained,) = [t for t in inc["timeline"] if t["message"].startswith("stage -> contained")]
    assert contained["message"].endswith(
        "; the cascade stopped without containment (no step changed the cluster; dry-run)"
    )
    recovery = contained["detail"]
    assert recovery["recovered_by"] == "pods" and recovery["steps"] == []
    assert recovery["dry_run_steps"] == [{"position": 3, "step": "enable_rate_limit"}]
