"""End to end through the CLI: approve, deny, arm, disarm and the kill switch on a replayed store.

Each test replays the bundled cascade into its own SQLite store (dry-run): the third step,
staggered restarts with policy approval, waits for a person.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CASCADE = REPO / "examples" / "cascade"
DETECTOR = Path(sys.executable).with_name("detector")
APPROVERS = {"DETECTOR_CONTAINMENT__APPROVERS": '["alice", "bob"]'}


def detector(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "200", **env}
    return subprocess.run(
        [str(DETECTOR), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=full_env,
    )


def replay(url: str, **env: str) -> dict[str, Any]:
    proc = detector("replay", "--json", "--db", url, str(CASCADE), **env)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc["incidents"][0]


def test_approve_then_replay_restarts_one_pod_at_a_time(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    inc = replay(url)
    key = inc["key"]
    assert inc["steps"][2]["state"] == "awaiting_approval"
    for who, code, words in [
        ("mallory", 1, "not on the approver allow-list"),
        ("alice", 0, f"approved: step 3 stagger_restarts of {key} by alice"),
        ("bob", 1, "not pending"),
    ]:
        proc = detector(
            "approve",
            key,
            "stagger_restarts",
            "--as",
            who,
            "--db",
            url,
            "--reason",
            "crash-looping",
            **APPROVERS,
        )
        assert proc.returncode == code, proc.stderr
        assert words in proc.stdout + proc.stderr
    again = replay(url)  # the engine picks the approval up at the recorded event time
    restart = again["steps"][2]
    assert restart["approval_state"]["decided_by"] == "alice"
    assert restart["approval_state"]["via"] == "cli"
    assert restart["state"] in ("applying", "verifying") and restart["mode"] == "dry_run"
    details = [t["detail"] for t in again["timeline"] if t.get("detail")]
    restarts = [d for d in details if d["event"] == "restarted"]
    assert restarts and all('"kind": "Eviction"' in d["diff"] for d in restarts)
    assert len({d["diff"] for d in restarts}) == len(restarts)  # one pod each
    times = [
        t["time"] for t in again["timeline"] if t.get("detail", {}).get("event") == "restarted"
    ]
    assert times == sorted(times) and len(set(times)) == len(times)  # never two at once
    assert any(d["event"] == "approved" and d.get("via") == "cli" for d in details)
    assert replay(url)["timeline"] == again["timeline"]  # a third pass adds nothing


def test_deny_hands_over_and_refusals_exit_non_zero(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    key = replay(url)["key"]
    proc = detector("deny", key, "3", "--as", "bob", "--db", url, **APPROVERS)
    assert proc.returncode == 0 and "denied: step 3 stagger_restarts" in proc.stdout
    inc = replay(url)
    assert inc["steps"][2]["state"] == "denied"
    assert inc["steps"][2]["approval_state"]["status"] == "denied"
    cases = [
        (("approve", "llm/nope@1", "3", "--as", "alice"), APPROVERS, 2, "no incident"),
        (("approve", key, "reboot", "--as", "alice"), APPROVERS, 2, "has no step"),
        (("approve", key, "1", "--as", "alice"), APPROVERS, 1, "is approved, not pending"),
        (("approve", key, "3", "--as", "alice"), {}, 1, "no approvers configured"),
    ]
    for args, env, code, words in cases:
        proc = detector(*args, "--db", url, **env)
        assert proc.returncode == code, (args, proc.stdout, proc.stderr)
        assert words in proc.stderr, proc.stderr


def test_arm_and_disarm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    armed = detector("arm", "llm/vllm-llama", "--as", "ops", "--db", url)
    assert armed.returncode == 0 and "armed: llm/vllm-llama" in armed.stdout
    assert detector("arm", "vllm-llama", "--db", url).returncode == 2  # not NAMESPACE/WORKLOAD
    # armed, and the process not in dry-run, but no actuator registered: still only recorded
    inc = replay(url, DETECTOR_DRY_RUN="false")
    assert [s["mode"] for s in inc["steps"][:2]] == ["dry_run", "dry_run"]
    assert inc["steps"][0]["status"] == "dry_run"
    disarmed = detector("disarm", "llm/vllm-llama", "--db", url)
    assert disarmed.returncode == 0 and "dry-run only" in disarmed.stdout


def test_the_kill_switch_holds_every_step(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    on = detector("kill-switch", "on", "--as", "ops", "--reason", "drill", "--db", url)
    assert on.returncode == 0 and "kill switch on (the store)" in on.stdout
    inc = replay(url)
    ceiling = inc["steps"][0]
    assert ceiling["state"] == "approved" and ceiling["mode"] is None  # never acted
    blocked = [t for t in inc["timeline"] if t.get("detail", {}).get("event") == "blocked"]
    assert len(blocked) == 1 and "kill switch is on" in blocked[0]["message"]
    off = detector("kill-switch", "off", "--db", url)
    assert off.returncode == 0 and "kill switch off" in off.stdout
    assert detector("kill-switch", "status", "--db", url).stdout.strip() == "kill switch off"
    env = {"DETECTOR_CONTAINMENT__KILL_SWITCH": "true"}
    assert "the setting" in detector("kill-switch", "status", "--db", url, **env).stdout
    assert detector("kill-switch", "maybe", "--db", url).returncode == 2
    after = replay(url)  # released: the held step goes on
    assert after["steps"][0]["mode"] == "dry_run"


def test_serve_refuses_bad_settings(tmp_path: Path) -> None:
    env = {"DETECTOR_WEB__TOKENS": '{"alice": "short"}'}
    proc = detector("serve", "--db", f"sqlite:///{tmp_path / 's.db'}", **env)
    assert proc.returncode == 2 and "shorter than 16" in proc.stderr
