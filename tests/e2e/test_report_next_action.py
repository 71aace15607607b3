"""End to end through the CLI: the reports say how to act on an incident (issue 16, item 2).

The console report (``replay``, ``show``) and ``detector incidents`` give the incident key, the
exact approve and deny commands of each step waiting for a person and who may run them now
(the configured approvers, or how to configure one); a suspected incident prints no empty
section; the rate-limit step's healthy figure says what it counts and agrees with its basis.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from recordings import awaiting_in_2025, awaiting_now, cascade
from test_approvals_cli import APPROVERS, detector, replay

from detector.lab.recording import DEATHS

NO_APPROVER = "no approver is configured (the runbook's group sre-oncall is only a label)"
SET_APPROVERS = """set DETECTOR_CONTAINMENT__APPROVERS='["name"]'"""


def _commands(text: str) -> dict[str, str]:
    """Return the ``approve:`` and ``deny:`` commands a report prints, by verb."""
    found = re.findall(r"^\s+(approve|deny): +(detector .+)$", text, flags=re.MULTILINE)
    return dict(found)


def test_the_report_gives_the_key_the_commands_and_who_may_run_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    recording = awaiting_now(tmp_path / "cut")
    inc = replay(url, recording)
    key, digest = inc["key"], inc["steps"][3]["approval_state"]["plan"]
    tail = f"{key} 4 --as NAME --plan {digest} --db {url}"
    approve, deny = f"detector approve {tail}", f"detector deny {tail} --reason WHY"

    report = detector("replay", "--db", url, str(recording), **APPROVERS)
    shown = detector("show", key, "--db", url, **APPROVERS)
    for proc in (report, shown):
        assert proc.returncode == 0, proc.stderr
        assert f"key: {key}\n" in proc.stdout
        assert "may decide now: alice, bob (DETECTOR_CONTAINMENT__APPROVERS;" in proc.stdout
        assert _commands(proc.stdout) == {"approve": approve, "deny": deny}
    # the step's lines come before its diff, where they are seen
    section = shown.stdout[shown.stdout.index("4. stagger_restarts") :]
    assert section.index("approve: detector") < section.index("--- /dev/null")

    # the command as printed works once NAME is filled in
    argv = shlex.split(approve.replace("NAME", "alice"))
    done = detector(*argv[1:], **APPROVERS)
    assert done.returncode == 0, done.stderr
    assert f"approved: step 4 stagger_restarts of {key} by alice" in done.stdout
    after = detector("show", key, "--db", url, **APPROVERS).stdout
    assert "approve:" not in after and "waiting for a person" not in after


def test_without_approvers_the_report_says_how_to_configure_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    recording = awaiting_now(tmp_path / "cut")
    key = replay(url, recording)["key"]
    for args in (("replay", "--db", url, str(recording)), ("show", key, "--db", url)):
        proc = detector(*args, DETECTOR_CONTAINMENT__APPROVERS="[]")
        assert proc.returncode == 0, proc.stderr
        assert f"waiting for a person, but {NO_APPROVER}: {SET_APPROVERS}" in proc.stdout
        assert "may decide now" not in proc.stdout
        assert set(_commands(proc.stdout)) == {"approve", "deny"}


def test_incidents_lists_each_waiting_step_with_its_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    inc = replay(url, awaiting_now(tmp_path / "cut"))
    key, approval = inc["key"], inc["steps"][3]["approval_state"]
    tail = f"{key} 4 --as NAME --plan {approval['plan']} --db {url}"

    listed = detector("incidents", "--db", url, **APPROVERS)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(f"{key}  cascading  llm/vllm-llama  victims=4")
    assert lines[1] == (
        f"  waiting: step 4 stagger_restarts until {approval['expires_at']} "
        f"(plan {approval['plan']})"
    )
    assert "may decide now: alice, bob" in lines[2]
    assert _commands(listed.stdout) == {
        "approve": f"detector approve {tail}",
        "deny": f"detector deny {tail} --reason WHY",
    }
    unset = detector("incidents", "--db", url, DETECTOR_CONTAINMENT__APPROVERS="[]")
    assert f"{NO_APPROVER}: {SET_APPROVERS}" in unset.stdout


def test_an_expired_step_offers_no_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    recording = awaiting_in_2025(tmp_path / "cut")
    key = replay(url, recording)["key"]
    listed = detector("incidents", "--db", url, **APPROVERS).stdout
    assert "expired, no longer decidable" in listed
    report = detector("show", key, "--db", url, **APPROVERS).stdout
    assert "no longer decidable" in report
    assert not _commands(listed) and not _commands(report)
    assert "waiting for a person" not in listed + report


def test_a_suspected_incident_prints_no_empty_runbook_heading(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    recording = cascade(tmp_path / "cut", until_s=DEATHS[0] + 10.0)  # one victim so far
    proc = detector("replay", "--db", url, str(recording))
    assert proc.returncode == 0, proc.stderr
    assert "stage: suspected" in proc.stdout
    lines = proc.stdout.splitlines()
    assert "containment runbook" not in lines  # a heading with nothing under it
    assert "containment runbook: none yet, planned when the incident turns cascading" in lines
    assert not _commands(proc.stdout)


def test_the_healthy_figures_say_what_they_count_and_agree(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = detector("replay", "--json", "--db", url, str(cascade(tmp_path / "full")))
    assert proc.returncode == 0, proc.stderr
    (inc,) = json.loads(proc.stdout)["incidents"]
    steps = {s["action"]: s["params"] for s in inc["steps"]}
    limit, restarts = steps["enable_rate_limit"], steps["stagger_restarts"]
    counted = re.fullmatch(
        r"(\d+) of (\d+) pods seen \(not dead of GPU OOM when planned\)",
        limit["healthy_replicas"],
    )
    assert counted, limit["healthy_replicas"]
    healthy, seen = counted.groups()
    assert f"(healthy {healthy}, at least the first one back) / seen {seen} " in limit["basis"]
    # the restart step names its list for what it holds: live pods at the memory ceiling
    assert "healthy_pods" not in restarts and isinstance(restarts["at_ceiling_pods"], list)
    assert (
        f"then {len(restarts['at_ceiling_pods'])} healthy pod(s) at the memory ceiling"
        in (restarts["order_basis"])
    )
