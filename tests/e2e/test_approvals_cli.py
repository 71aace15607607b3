"""End to end through the CLI: approve, deny, arm, disarm and the kill switch on a replayed store.

Each test replays the bundled cascade into its own SQLite store (dry-run): the third step,
staggered restarts with policy approval, waits for a person.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from recordings import AWAITING_S, awaiting_in_2025, awaiting_now, cascade

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


def replay(url: str, recording: Path = CASCADE, **env: str) -> dict[str, Any]:
    proc = detector("replay", "--json", "--db", url, str(recording), **env)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc["incidents"][0]


def test_approve_then_replay_restarts_one_pod_at_a_time(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    start = time.time() - AWAITING_S - 30.0  # event time near the wall clock
    inc = replay(url, cascade(tmp_path / "cut", start=start, until_s=AWAITING_S))
    key = inc["key"]
    assert inc["steps"][3]["state"] == "awaiting_approval"
    for who, code, words in [
        ("mallory", 1, "not on the approver allow-list"),
        ("alice", 0, f"approved: step 4 stagger_restarts of {key} by alice (dry-run:"),
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
    # the rest of the recording: the approval is picked up at the event time it was given,
    # and only pods still down are restarted (the others came back on their own meanwhile)
    full = cascade(tmp_path / "full", start=start)
    again = replay(url, full)
    restart = again["steps"][3]
    assert restart["approval_state"]["decided_by"] == "alice"
    assert restart["approval_state"]["via"] == "cli"
    assert restart["state"] in ("verifying", "verified") and restart["mode"] == "dry_run"
    details = [t["detail"] for t in again["timeline"] if t["kind"] == "step" and t.get("detail")]
    restarts = [d for d in details if d["event"] == "restarted"]
    assert restarts and all('"kind": "Eviction"' in d["diff"] for d in restarts)
    assert len({d["diff"] for d in restarts}) == len(restarts)  # one pod each
    times = [
        t["time"] for t in again["timeline"] if t.get("detail", {}).get("event") == "restarted"
    ]
    assert times == sorted(times) and len(set(times)) == len(times)  # never two at once
    assert any(d["event"] == "approved" and d.get("via") == "cli" for d in details)
    assert any(d["event"] == "withdrawn" and "recovered" in d["reason"] for d in details)
    assert replay(url, full)["timeline"] == again["timeline"]  # a third pass adds nothing


def test_a_decision_on_another_plan_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    inc = replay(url, awaiting_now(tmp_path / "cut"))
    digest = inc["steps"][3]["approval_state"]["plan"]
    expires = inc["steps"][3]["approval_state"]["expires_at"]
    listed = detector("incidents", "--db", url).stdout
    assert f"waiting: step 4 stagger_restarts until {expires} (plan {digest})" in listed
    args = ("approve", inc["key"], "4", "--as", "alice", "--db", url)
    stale = detector(*args, "--plan", "000000000000", **APPROVERS)
    assert stale.returncode == 1 and "the plan changed" in stale.stderr, stale.stderr
    fresh = detector(*args, "--plan", digest, **APPROVERS)
    assert fresh.returncode == 0, fresh.stderr


def test_a_late_approval_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    inc = replay(url, awaiting_in_2025(tmp_path / "cut"))  # its approval expired in 2025
    assert inc["steps"][3]["state"] == "awaiting_approval"
    before = detector("incidents", "--json", "--db", url).stdout
    assert "expired, no longer decidable" in detector("incidents", "--db", url).stdout
    proc = detector("approve", inc["key"], "4", "--as", "alice", "--db", url, **APPROVERS)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "expired at 2025-03-14" in proc.stderr
    assert detector("incidents", "--json", "--db", url).stdout == before


def test_deny_hands_over_and_refusals_exit_non_zero(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    recording = awaiting_now(tmp_path / "cut")
    key = replay(url, recording)["key"]
    proc = detector("deny", key, "4", "--as", "bob", "--db", url, **APPROVERS)
    assert proc.returncode == 0 and "denied: step 4 stagger_restarts" in proc.stdout
    inc = replay(url, recording)
    assert inc["steps"][3]["state"] == "denied"
    assert inc["steps"][3]["approval_state"]["status"] == "denied"
    cases = [
        (("approve", "llm/nope@1", "4", "--as", "alice"), APPROVERS, 2, "no incident"),
        (("approve", key, "reboot", "--as", "alice"), APPROVERS, 2, "has no step"),
        (("approve", key, "3", "--as", "alice"), APPROVERS, 1, "is approved, not pending"),
        (("approve", key, "4", "--as", "alice"), {}, 1, "no approvers configured"),
    ]
    for args, env, code, words in cases:
        proc = detector(*args, "--db", url, **env)
        assert proc.returncode == code, (args, proc.stdout, proc.stderr)
        assert words in proc.stderr, proc.stderr


def test_arm_and_disarm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    replay(url)  # the store knows llm/vllm-llama from its incident
    armed = detector("arm", "llm/vllm-llama", "--as", "ops", "--db", url)
    assert armed.returncode == 0 and "armed: llm/vllm-llama" in armed.stdout
    assert url in armed.stdout  # says which store it changed
    assert detector("arm", "vllm-llama", "--db", url).returncode == 2  # not NAMESPACE/WORKLOAD
    # armed, and the process not in dry-run, but no actuator registered: still only recorded
    inc = replay(url, DETECTOR_DRY_RUN="false")
    # the quarantine and the ceiling were passed over (the mechanism is load): the limit acted
    assert [s["mode"] for s in inc["steps"][:3]] == [None, None, "dry_run"]
    assert inc["steps"][2]["status"] == "dry_run"
    disarmed = detector("disarm", "llm/vllm-llama", "--db", url)
    assert disarmed.returncode == 0 and "dry-run only" in disarmed.stdout


def test_the_kill_switch_holds_every_step(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert detector("migrate", "--db", url).returncode == 0  # a store made before the detector
    on = detector("kill-switch", "on", "--as", "ops", "--reason", "drill", "--db", url)
    assert on.returncode == 0 and f"kill switch on (the store {url})" in on.stdout
    recording = awaiting_in_2025(tmp_path / "cut")  # still cascading at its end
    inc = replay(url, recording)
    limit = inc["steps"][2]  # the first step for the mechanism (load)
    assert limit["state"] == "approved" and limit["mode"] is None  # never acted
    blocked = [t for t in inc["timeline"] if t.get("detail", {}).get("event") == "blocked"]
    assert len(blocked) == 1 and "kill switch is on" in blocked[0]["message"]
    off = detector("kill-switch", "off", "--db", url)
    assert off.returncode == 0 and "kill switch off" in off.stdout
    status = detector("kill-switch", "status", "--db", url).stdout.splitlines()
    assert status[0] == f"kill switch off in {url}"
    env = {"DETECTOR_CONTAINMENT__KILL_SWITCH": "true"}
    assert "the setting" in detector("kill-switch", "status", "--db", url, **env).stdout
    assert detector("kill-switch", "maybe", "--db", url).returncode == 2
    after = replay(url, recording)  # released: the held step goes on
    assert after["steps"][2]["mode"] == "dry_run"


def test_serve_refuses_bad_settings(tmp_path: Path) -> None:
    env = {"DETECTOR_WEB__TOKENS": '{"alice": "short"}'}
    proc = detector("serve", "--db", f"sqlite:///{tmp_path / 's.db'}", **env)
    assert proc.returncode == 2 and "shorter than 16" in proc.stderr
    tokens = {"DETECTOR_WEB__TOKENS": '{"alice": "0123456789abcdef-long"}'}
    missing = detector("serve", "--db", f"sqlite:///{tmp_path / 'typo.db'}", **tokens)
    assert missing.returncode == 2 and "no incident store" in missing.stderr
    assert not (tmp_path / "typo.db").exists()


def test_controls_refuse_a_store_that_does_not_exist_and_create_none(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    url = f"sqlite:///{missing}"
    for args in [
        ("kill-switch", "on"),
        ("kill-switch", "status"),
        ("arm", "llm/vllm-llama", "--force"),
        ("disarm", "llm/vllm-llama"),
        ("approve", "llm/x@1", "3", "--as", "alice"),
        ("deny", "llm/x@1", "3", "--as", "alice"),
    ]:
        proc = detector(*args, "--db", url, **APPROVERS)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and f"no incident store at {url}" in proc.stderr
        assert proc.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_controls_refuse_a_store_not_migrated_to_head(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # some other SQLite file, or a store never migrated
        conn.execute("CREATE TABLE other (x INTEGER)")
    url = f"sqlite:///{path}"
    proc = detector("kill-switch", "on", "--db", url)
    assert proc.returncode == 2 and "is not migrated" in proc.stderr and url in proc.stderr
    pg = "postgresql+psycopg://ops:s3cret@127.0.0.1:1/none"  # nothing listens on port 1
    proc = detector("kill-switch", "on", "--db", pg)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "s3cret" not in proc.stderr and "ops:***@127.0.0.1:1/none" in proc.stderr


def test_arming_an_unknown_workload_needs_force(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    replay(url)
    typo = detector("arm", "llm/vllm-lama", "--db", url)
    assert typo.returncode == 2
    assert "llm/vllm-lama" in typo.stderr and "did you mean llm/vllm-llama?" in typo.stderr
    assert "--force" in typo.stderr
    forced = detector("arm", "llm/vllm-lama", "--force", "--as", "ops", "--db", url)
    assert forced.returncode == 0 and "armed: llm/vllm-lama" in forced.stdout


def test_each_change_is_kept_shown_by_status_and_noted_on_the_timeline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    key = replay(url)["key"]
    steps = [
        ("kill-switch", "on", "--as", "ops", "--reason", "drill"),
        ("arm", "llm/vllm-llama", "--as", "alice", "--reason", "canary done"),
        ("kill-switch", "off", "--as", "ops"),
    ]
    for args in steps:
        assert detector(*args, "--db", url).returncode == 0, args
    host = socket.gethostname()
    status = detector("kill-switch", "status", "--db", url)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"kill switch off in {url}"
    assert [line.split("  ", 2)[2] for line in lines[2:]] == [
        f"kill switch off by ops via cli from {host}",
        f"armed llm/vllm-llama by alice via cli from {host}: canary done",
        f"kill switch on by ops via cli from {host}: drill",
    ]
    stamps = [datetime.fromisoformat(line.split()[0]) for line in lines[2:]]
    assert stamps == sorted(stamps, reverse=True) and all(s.tzinfo for s in stamps)
    short = detector("kill-switch", "status", "--last", "1", "--db", url).stdout.splitlines()
    assert len(short) == 3 and "kill switch off by ops" in short[2]

    incidents = detector("incidents", "--json", "--db", url)
    (inc,) = [i for i in json.loads(incidents.stdout) if i["key"] == key]
    notes = [t for t in inc["timeline"] if (t.get("detail") or {}).get("event") == "control"]
    assert [(n["detail"]["control"], n["detail"]["enabled"]) for n in notes] == [
        ("kill_switch", True),
        ("armed", True),
        ("kill_switch", False),
    ]
    assert notes[0]["message"].startswith(f"kill switch on by ops via cli from {host} at 20")
    assert notes[0]["message"].endswith(": drill") and notes[0]["detail"]["host"] == host


def test_the_brakes_work_with_a_broken_unrelated_setting_and_leak_no_token(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert detector("migrate", "--db", url).returncode == 0
    secret = "S3cr3t-Tok-15ch"  # too short, so the settings are invalid
    broken = {
        "DETECTOR_CORRELATE__SUSTAIN_S": "30s",
        "DETECTOR_WEB__TOKENS": f'{{"a": "{secret}"}}',
    }
    on = detector("kill-switch", "on", "--reason", "emergency", "--db", url, **broken)
    assert on.returncode == 0 and "kill switch on" in on.stdout, on.stderr
    assert "warning: invalid DETECTOR_* setting" in on.stderr and secret not in on.stderr
    assert "DETECTOR_CORRELATE__SUSTAIN_S" in on.stderr and "DETECTOR_WEB__TOKENS" in on.stderr
    disarmed = detector("disarm", "llm/never-seen", "--db", url, **broken)  # no --force needed
    assert disarmed.returncode == 0 and "dry-run only" in disarmed.stdout, disarmed.stderr
    armed = detector("arm", "llm/never-seen", "--force", "--db", url, **broken)  # not a brake
    assert armed.returncode == 2 and secret not in armed.stderr
