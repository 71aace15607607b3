"""Print the read model's document as the readable console report (rich markup escaped)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape

from detector.report.document import CORE_SIGNALS, ReplayResult, to_document


def render_report(result: ReplayResult, console: Console) -> None:
    """Print a readable report of each incident and verdict."""
    doc = to_document(result)
    ev = doc["events"]
    console.print(
        f"[bold]records[/bold] read={ev['read']} parsed={ev['parsed']} "
        f"rejected={ev['rejected']} signals={ev['signals']}"
    )
    if ev["rejected_by_reason"]:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(ev["rejected_by_reason"].items()))
        console.print(f"  rejected by reason: {escape(reasons)} (kept as dead letters)")
    console.print(f"\n[bold]{len(doc['incidents'])} incident(s)[/bold]")
    for inc in doc["incidents"]:
        _render_incident(inc, console)
    console.print(f"\n[bold]{len(doc['verdicts'])} verdict(s): not this pattern[/bold]")
    for v in doc["verdicts"]:
        console.print(f"- {escape(v['workload'])}: {escape(v['verdict'])}")
        console.print(f"  {escape(v['reason'])}", soft_wrap=True)


def _render_incident(inc: dict[str, Any], console: Console) -> None:
    console.rule(f"incident #{inc['id']} {inc['pattern']} {escape(inc['workload'])}")
    console.print(f"stage: [bold red]{inc['stage']}[/bold red]   opened: {inc['opened_at']}")
    console.print("victims in order: " + escape(" -> ".join(inc["pods"]) or "none yet"))
    marks = [f"{k} {'yes' if k in inc['signals'] else 'no'}" for k in CORE_SIGNALS]
    console.print("signals: " + ", ".join(marks))
    console.print("[bold]containment runbook[/bold]")
    for s in inc["steps"]:
        console.print(
            f"  {s['position']}. [bold]{s['action']}[/bold] "
            + escape(f"[{s['status']}, approval {s['approval']}] {s['title']}")
        )
        for key, value in s["params"].items():
            if key not in ("namespace", "workload", "workload_kind"):
                text = value if isinstance(value, str) else json.dumps(value)
                console.print(f"     {key}: {escape(text)}", soft_wrap=True)
        _render_outcome(s, console)
    console.print("[bold]questions[/bold]")
    for q in inc["questions"]:
        console.print(f"? {escape(q['question'])}")
        if q["answer"]:
            where = (
                f"  [dim](evidence: {escape(str(q['evidence']))})[/dim]" if q["evidence"] else ""
            )
            console.print(f"  {escape(q['answer'])}{where}", soft_wrap=True)
        else:
            console.print(f"  [yellow]unanswered[/yellow] - check: {escape(q['to_check'])}")
    console.print("[bold]timeline[/bold]")
    for t in inc["timeline"]:
        line = f"  {_hhmmss(t['time'])} {t['kind']:<8} {escape(t['message'])}"
        console.print(line, soft_wrap=True)


def _render_outcome(s: dict[str, Any], console: Console) -> None:
    approval = s["approval_state"]
    who = f" by {approval['decided_by']}" if approval.get("decided_by") else ""
    check = s["verification"]
    line = (
        f"state {s['state']} ({s['mode'] or 'not acted'}); approval {approval['status']}{who}; "
        f"verification {check['result']}"
    )
    console.print(f"     [bold]{escape(line)}[/bold]", soft_wrap=True)
    if s["reason"]:
        console.print(f"     {escape(s['reason'])}", soft_wrap=True)
    for row in s["diff"].splitlines():
        console.print(f"     [dim]{escape(row)}[/dim]", soft_wrap=True, highlight=False)


def _hhmmss(value: str | None) -> str:
    if not value:
        return "--:--:--"
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%H:%M:%S")
