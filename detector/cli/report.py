"""Print the read model's document as the readable console report.

Every value of the document is printed through ``_t``: control and bidi characters shown as
escapes (``detector.textsafe.printable``), then rich markup escaped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape

from detector.config import DatabaseSettings
from detector.db import redact
from detector.report.coverage import coverage_text
from detector.report.document import (
    CORE_SIGNALS,
    ReplayResult,
    decidable,
    decision_commands,
    past_expiry,
    to_document,
)
from detector.textsafe import printable

KIND_LABELS = {"gpu_oom": "GPU OOM", "gpu_memory": "GPU memory", "lb_response": "load-balancer"}
UNKNOWN_FORMAT_HINT = (
    "lines in no known format; a plain-text log of one pod (kubectl logs) needs "
    "--namespace NS --pod POD (detector dead-letters --reason unknown_format shows them)"
)


def render_report(
    result: ReplayResult, console: Console, *, approvers: Sequence[str] = (), db: str = ""
) -> None:
    """Print a readable report of each incident and verdict.

    ``approvers`` (the configured allow-list) and ``db`` (the store's URL) make the commands
    that decide a step waiting for a person (``render_incident``).
    """
    doc = to_document(result)
    ev = doc["events"]
    console.print(
        f"[bold]records[/bold] read={_t(ev['read'])} parsed={_t(ev['parsed'])} "
        f"rejected={_t(ev['rejected'])} signals={_t(ev['signals'])}"
    )
    if ev["rejected_by_reason"]:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(ev["rejected_by_reason"].items()))
        console.print(f"  rejected by reason: {_t(reasons)} (kept as dead letters)")
        if "unknown_format" in ev["rejected_by_reason"]:
            console.print(
                f"  [yellow]hint:[/yellow] unknown_format: {UNKNOWN_FORMAT_HINT}", soft_wrap=True
            )
    _render_unattributed(ev, console)
    console.print(f"\n[bold]{len(doc['incidents'])} incident(s)[/bold]")
    for inc in doc["incidents"]:
        render_incident(inc, console, approvers=approvers, db=db)
    console.print(f"\n[bold]{len(doc['verdicts'])} verdict(s): not this pattern[/bold]")
    for v in doc["verdicts"]:
        console.print(f"- {_t(v['workload'], one_line=True)}: {_t(v['verdict'])}")
        console.print(f"  {_t(v['reason'])}", soft_wrap=True)


# Reasons that are expected, not a gap: a web server's own access lines (static files) name
# no upstream and no workload. They are noted, not warned about.
EXPECTED_REASONS = frozenset({"no upstream on the line"})
_NOTE, _WARNING = "[dim]note:[/dim]", "[yellow]warning:[/yellow]"


def _render_unattributed(ev: dict[str, Any], console: Console) -> None:
    """Warn of every signal that named no workload: kind, reason, a few examples, the fix."""
    if not ev["unattributed"]:
        return
    reasons = ev.get("unattributed_by_reason", [])
    expected = all(r["reason"] in EXPECTED_REASONS for r in reasons) and reasons
    head = _NOTE if expected else _WARNING
    console.print(
        f"  {head} {_t(ev['unattributed'])} signal(s) named no workload "
        "and were left out of correlation"
    )
    for r in reasons:
        label = KIND_LABELS.get(r["kind"], r["kind"])
        head = (
            "[dim]note:[/dim]" if r["reason"] in EXPECTED_REASONS else "[yellow]warning:[/yellow]"
        )
        console.print(
            f"  {head} {_t(r['count'])} unattributed {_t(label)} signal(s): {_t(r['reason'])}",
            soft_wrap=True,
        )
        console.print(f"    to tie them: {_t(r['hint'])}", soft_wrap=True)
        for e in r["examples"]:
            named = ", ".join(f"{k} {v}" for k, v in e.items() if k != "source")
            where = f"{e['source']} ({named})" if named else e["source"]
            console.print(f"    e.g. {_t(where, one_line=True)}", soft_wrap=True)


def render_incident(
    inc: dict[str, Any], console: Console, *, approvers: Sequence[str] = (), db: str = ""
) -> None:
    """Print one incident of the report (also ``detector show``), every input string escaped.

    Each step waiting for a person (``decidable``) ends with who may decide it now (the
    configured ``approvers``, or how to configure one) and the exact approve and deny commands
    (``db``: the store's URL, passed as ``--db`` when it is not the default).
    """
    console.rule(
        f"incident #{_t(inc['id'])} {_t(inc['pattern'])} {_t(inc['workload'], one_line=True)}"
    )
    console.print(f"key: {_t(inc['key'], one_line=True)}")
    stage, opened = _t(inc["stage"]), _t(inc["opened_at"])
    console.print(f"stage: [bold red]{stage}[/bold red]   opened: {opened}")
    console.print("victims in order: " + _t(" -> ".join(inc["pods"]) or "none yet", one_line=True))
    marks = [f"{_t(k)} {'yes' if k in inc['signals'] else 'no'}" for k in CORE_SIGNALS]
    console.print("signals: " + ", ".join(marks))
    _render_coverage(inc, console)
    _render_steps(inc, console, approvers=approvers, db=db)
    _render_questions(inc, console)
    console.print("[bold]timeline[/bold]")
    day = _day(inc["opened_at"])
    for t in inc["timeline"]:
        line = f"  {_when(t['time'], day)} {_t(t['kind']):<8} {_t(t['message'])}"
        console.print(line, soft_wrap=True)


def _render_coverage(inc: dict[str, Any], console: Console) -> None:
    """Print the coverage of the four signals: what was seen, and why each missing one is."""
    entries = inc.get("coverage", [])
    if not entries:
        return
    seen = ", ".join(f"{e['signal']} {e['count']}" for e in entries if e["seen"])
    console.print(f"coverage (signals seen): {_t(seen or 'none')}")
    for entry in entries:
        if entry["seen"] and entry["evidence"]:
            continue
        head = _NOTE if entry["seen"] else _WARNING
        console.print(f"  {head} {_t(coverage_text(entry))}", soft_wrap=True)
        if entry["hint"]:
            console.print(f"    to bring it in: {_t(entry['hint'])}", soft_wrap=True)


def _render_steps(
    inc: dict[str, Any], console: Console, *, approvers: Sequence[str], db: str
) -> None:
    """Print the containment runbook's steps; no empty heading while none is planned."""
    if not inc["steps"]:
        if inc["stage"] == "suspected":
            console.print(f"[bold]containment runbook[/bold]: none yet, {NOT_PLANNED_YET}")
        return
    early = " (planned early: predictive containment)" if inc["stage"] == "suspected" else ""
    console.print(f"[bold]containment runbook[/bold]{early}")
    for s in inc["steps"]:
        console.print(
            f"  {_t(s['position'])}. [bold]{_t(s['action'])}[/bold] "
            + _t(f"[{s['status']}, approval {s['approval']}] {s['title']}")
        )
        for key, value in s["params"].items():
            if key not in ("namespace", "workload", "workload_kind"):
                text = value if isinstance(value, str) else json.dumps(value)
                console.print(f"     {_t(key)}: {_t(text)}", soft_wrap=True)
        waiting = decision_lines(inc["key"], s, approvers=approvers, db=db) if decidable(s) else []
        _render_outcome(s, console, waiting)
    if inc["stage"] == "suspected":
        console.print(f"  the other steps: {NOT_PLANNED_YET}", soft_wrap=True)


def _render_questions(inc: dict[str, Any], console: Console) -> None:
    """Print the on-call questions and their answers; nothing when there are none."""
    if not inc["questions"]:
        return
    console.print("[bold]questions[/bold]")
    for q in inc["questions"]:
        console.print(f"? {_t(q['question'])}")
        if q["answer"]:
            where = f"  [dim](evidence: {_t(q['evidence'])})[/dim]" if q["evidence"] else ""
            console.print(f"  {_t(q['answer'])}{where}", soft_wrap=True)
        else:
            console.print(f"  [yellow]unanswered[/yellow] - check: {_t(q['to_check'])}")


NOT_PLANNED_YET = "planned when the incident turns cascading"
APPROVERS_SETTING = "DETECTOR_CONTAINMENT__APPROVERS"


def who_may_decide(approvers: Sequence[str], group: str | None = None) -> str:
    """Say who may decide a step now: the configured allow-list, or how to configure one.

    The runbook's approver group (``approver:sre-oncall``) is a label: a decision is checked
    against the allow-list ``DETECTOR_CONTAINMENT__APPROVERS`` alone
    (``runbooks.approvals.may_approve``).
    """
    label = f"the runbook's group {group} is only a label" if group else ""
    if not approvers:
        named = f" ({label})" if label else ""
        return (
            f"waiting for a person, but no approver is configured{named}: "
            f"set {APPROVERS_SETTING}='[\"name\"]' where detector approve/deny "
            "and detector serve run, then:"
        )
    named = f"; {label}" if label else ""
    return (
        f"waiting for a person; may decide now: {', '.join(approvers)} ({APPROVERS_SETTING}{named})"
    )


def decision_lines(
    key: str, step: dict[str, Any], *, approvers: Sequence[str], db: str = ""
) -> list[str]:
    """Return the lines that say who may decide a waiting step and the commands to do it."""
    approve, deny = decision_commands(key, step, db=store_option(db))
    who = who_may_decide(approvers, step["approval_state"].get("approver_group"))
    return [who, f"  approve: {approve}", f"  deny:    {deny}"]


def store_option(url: str) -> str:
    """Return the store's URL for ``--db`` (password hidden), or "" for the default store."""
    return "" if not url or url == DatabaseSettings().url else redact(url)


def _render_outcome(s: dict[str, Any], console: Console, waiting: list[str]) -> None:
    """Print what became of a step; ``waiting``: who may decide it and how, before its diff."""
    approval = s["approval_state"]
    who = f" by {approval['decided_by']}" if approval.get("decided_by") else ""
    check = s["verification"]
    status = approval["status"]
    if (when := past_expiry(approval)) is not None:
        status = f"pending, past its expiry ({when:%Y-%m-%d %H:%M:%S} UTC): no longer decidable"
    plan = f" (plan {approval['plan']})" if approval.get("plan") and status == "pending" else ""
    line = (
        f"state {s['state']} ({s['mode'] or 'not acted'}); approval {status}{plan}{who}; "
        f"verification {check['result']}"
    )
    console.print(f"     [bold]{_t(line)}[/bold]", soft_wrap=True)
    if s["reason"]:
        console.print(f"     {_t(s['reason'])}", soft_wrap=True)
    for line in waiting:
        console.print(f"     [bold]{_t(line, one_line=True)}[/bold]", soft_wrap=True)
    for row in s["diff"].splitlines():
        console.print(f"     [dim]{_t(row)}[/dim]", soft_wrap=True, highlight=False)


def _t(value: Any, *, one_line: bool = False) -> str:
    """Return a document value as console text: controls shown as escapes, markup escaped.

    ``one_line`` escapes newlines too, for names (workloads, pods) that must not break a line.
    """
    text = value if isinstance(value, str) else str(value)
    return escape(printable(text, one_line=one_line))


def _day(value: str | None) -> str:
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d") if value else ""


def _when(value: str | None, day: str) -> str:
    """Return HH:MM:SS UTC, with the date in front when it is not the incident's first day
    (a person's decision stamped with the wall clock, long after a recorded incident)."""
    if not value:
        return "--:--:--"
    moment = datetime.fromisoformat(value).astimezone(UTC)
    clock = moment.strftime("%H:%M:%S")
    return clock if moment.strftime("%Y-%m-%d") == day else f"{moment:%Y-%m-%d} {clock} UTC"
