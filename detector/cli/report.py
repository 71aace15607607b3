"""Print the read model's document as the readable console report.

Every value of the document is printed through ``_t``: control and bidi characters shown as
escapes (``detector.textsafe.printable``), then rich markup escaped.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape

from detector.report.document import CORE_SIGNALS, ReplayResult, past_expiry, to_document
from detector.textsafe import printable

KIND_LABELS = {"gpu_oom": "GPU OOM", "gpu_memory": "GPU memory", "lb_response": "load-balancer"}
UNKNOWN_FORMAT_HINT = (
    "lines in no known format; a plain-text log of one pod (kubectl logs) needs "
    "--namespace NS --pod POD (detector dead-letters --reason unknown_format shows them)"
)


def render_report(result: ReplayResult, console: Console) -> None:
    """Print a readable report of each incident and verdict."""
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
        render_incident(inc, console)
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


def render_incident(inc: dict[str, Any], console: Console) -> None:
    """Print one incident of the report (also ``detector show``), every input string escaped."""
    console.rule(
        f"incident #{_t(inc['id'])} {_t(inc['pattern'])} {_t(inc['workload'], one_line=True)}"
    )
    stage, opened = _t(inc["stage"]), _t(inc["opened_at"])
    console.print(f"stage: [bold red]{stage}[/bold red]   opened: {opened}")
    console.print("victims in order: " + _t(" -> ".join(inc["pods"]) or "none yet", one_line=True))
    marks = [f"{_t(k)} {'yes' if k in inc['signals'] else 'no'}" for k in CORE_SIGNALS]
    console.print("signals: " + ", ".join(marks))
    console.print("[bold]containment runbook[/bold]")
    for s in inc["steps"]:
        console.print(
            f"  {_t(s['position'])}. [bold]{_t(s['action'])}[/bold] "
            + _t(f"[{s['status']}, approval {s['approval']}] {s['title']}")
        )
        for key, value in s["params"].items():
            if key not in ("namespace", "workload", "workload_kind"):
                text = value if isinstance(value, str) else json.dumps(value)
                console.print(f"     {_t(key)}: {_t(text)}", soft_wrap=True)
        _render_outcome(s, console)
    console.print("[bold]questions[/bold]")
    for q in inc["questions"]:
        console.print(f"? {_t(q['question'])}")
        if q["answer"]:
            where = f"  [dim](evidence: {_t(q['evidence'])})[/dim]" if q["evidence"] else ""
            console.print(f"  {_t(q['answer'])}{where}", soft_wrap=True)
        else:
            console.print(f"  [yellow]unanswered[/yellow] - check: {_t(q['to_check'])}")
    console.print("[bold]timeline[/bold]")
    day = _day(inc["opened_at"])
    for t in inc["timeline"]:
        line = f"  {_when(t['time'], day)} {_t(t['kind']):<8} {_t(t['message'])}"
        console.print(line, soft_wrap=True)


def _render_outcome(s: dict[str, Any], console: Console) -> None:
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
