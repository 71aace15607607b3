"""The console report's next-action lines and sections (``detector.cli.report``), from documents.

A step waiting for a person gets who may decide it now and the exact commands, with every
input string quoted for the shell and escaped for the terminal; a section with nothing to show
is not printed.
"""

from __future__ import annotations

import io
import shlex
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console

from detector.cli.report import render_incident, store_option
from detector.report.document import decision_commands

HOSTILE_KEY = "llm/v[bold]x\x1b[2J$(reboot)@1"


def _step(position: int, action: str, *, waiting: bool = False) -> dict[str, Any]:
    expires = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    approval = (
        {
            "status": "pending",
            "approver_group": "sre-oncall",
            "plan": "abc123",
            "expires_at": expires,
        }
        if waiting
        else {"status": "approved", "decided_by": "policy:auto"}
    )
    return {
        "position": position,
        "action": action,
        "title": action,
        "status": "dry_run",
        "approval": "approver:sre-oncall" if waiting else "auto",
        "params": {},
        "state": "awaiting_approval" if waiting else "verifying",
        "policy": "approval" if waiting else "auto",
        "mode": None if waiting else "dry_run",
        "approval_state": approval,
        "diff": "--- a\n+++ b",
        "verification": {"result": "not_run"},
        "reason": "",
    }


def _incident(stage: str, steps: list[dict[str, Any]], key: str = "llm/vllm@1") -> dict[str, Any]:
    return {
        "id": 1,
        "key": key,
        "pattern": "gpu_oom_cascade",
        "workload": "llm/vllm",
        "workload_kind": "Deployment",
        "stage": stage,
        "opened_at": "2025-03-14T09:03:37+00:00",
        "pods": ["vllm-a"],
        "signals": ["gpu_oom"],
        "steps": steps,
        "questions": [],
        "timeline": [],
    }


def _render(inc: dict[str, Any], **kwargs: Any) -> str:
    buf = io.StringIO()
    render_incident(inc, Console(file=buf, width=300, color_system=None), **kwargs)
    return buf.getvalue()


def test_a_predictive_plan_at_suspected_says_the_rest_comes_later() -> None:
    out = _render(_incident("suspected", [_step(1, "enable_rate_limit")]))
    assert "containment runbook (planned early: predictive containment)" in out
    assert "the other steps: planned when the incident turns cascading" in out
    assert "questions" not in out  # none: no heading


def test_a_cascading_incident_without_steps_prints_no_runbook_line() -> None:
    assert "containment runbook" not in _render(_incident("cascading", []))


def test_a_waiting_step_names_the_approvers_and_the_commands() -> None:
    inc = _incident("cascading", [_step(1, "lower_batch_ceiling"), _step(3, "x", waiting=True)])
    out = _render(inc, approvers=["alice"], db="sqlite:////tmp/s.db")
    assert "key: llm/vllm@1\n" in out
    assert "may decide now: alice (DETECTOR_CONTAINMENT__APPROVERS;" in out
    db = "--db sqlite:////tmp/s.db"
    assert f"approve: detector approve llm/vllm@1 3 --as NAME --plan abc123 {db}\n" in out
    assert f"deny:    detector deny llm/vllm@1 3 --as NAME --plan abc123 {db} --reason WHY" in out
    assert out.count("detector approve") == 1  # only the step that waits
    none = _render(inc)
    assert (
        """no approver is configured (the runbook's group sre-oncall is only a label): """ in none
    )
    assert """set DETECTOR_CONTAINMENT__APPROVERS='["name"]'""" in none


def test_a_hostile_key_is_quoted_for_the_shell_and_escaped_for_the_terminal() -> None:
    step = _step(3, "x", waiting=True)
    approve, _ = decision_commands(HOSTILE_KEY, step)
    assert shlex.split(approve)[2] == HOSTILE_KEY  # one argument, nothing expanded
    out = _render(_incident("cascading", [step], key=HOSTILE_KEY), approvers=["a"])
    assert "\x1b" not in out and "\\x1b[2J" in out
    assert "[bold]" in out  # shown as text, not taken as markup


def test_the_default_store_needs_no_db_option() -> None:
    assert store_option("sqlite:///detector.db") == ""
    assert store_option("postgresql+psycopg://u:secret@h/db") == "postgresql+psycopg://u:***@h/db"
