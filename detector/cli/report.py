"""Turn a replay result into the JSON document and the readable console report."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape

from detector.pipeline import ReplayResult
from detector.runbooks.definition import Action
from detector.runbooks.runner import preview_diff
from detector.runbooks.steps import StepRecord

CORE_SIGNALS = ("gpu_oom", "crash_loop", "lb_errors", "gpu_memory")


def to_document(result: ReplayResult) -> dict[str, Any]:
    """Build the ``--json`` document: ``events``, ``incidents``, ``verdicts``."""
    ev = result.events
    return {
        "events": {
            "read": ev.read,
            "parsed": ev.parsed,
            "rejected": ev.rejected,
            "signals": ev.signals,
            "unattributed": ev.unattributed,
            "rejected_by_reason": dict(ev.rejected_by_reason),
        },
        "incidents": [incident_document(i.model_dump(mode="json")) for i in result.incidents],
        "verdicts": [
            {
                "workload": f"{v.namespace}/{v.workload}",
                "verdict": v.verdict,
                "reason": v.reason,
                "time": v.time.isoformat() if v.time else None,
            }
            for v in result.verdicts
        ],
    }


def incident_document(inc: dict[str, Any]) -> dict[str, Any]:
    """Map one ``IncidentOut`` JSON dump to its entry of the ``incidents`` list."""
    kinds = {e["kind"] for e in inc["evidence"]}
    sources = {e["id"]: e["source"] for e in inc["evidence"]}
    steps = [s for run in inc["runs"] for s in run["steps"]]
    approvals = {a["position"]: a for a in inc.get("approvals", [])}
    return {
        "id": inc["id"],
        "key": inc["key"],
        "pattern": inc["pattern"],
        "workload": f"{inc['namespace']}/{inc['workload']}",
        "workload_kind": inc["workload_kind"],
        "stage": inc["stage"],
        "opened_at": inc["opened_at"],
        "pods": [v["pod"] for v in sorted(inc["victims"], key=lambda v: v["position"])],
        "signals": [k for k in CORE_SIGNALS if k in kinds],
        "steps": [
            {
                "position": s["position"],
                "action": s["action"],
                "title": s["title"],
                "status": s["status"],
                "approval": s["approval"],
                "params": s["params"],
                **step_outcome(s, approvals.get(s["position"])),
            }
            for s in sorted(steps, key=lambda s: s["position"])
        ],
        "questions": [
            {
                "question": q["question"],
                "answer": q["answer"],
                "evidence": sources.get(q["evidence_id"]),
                "to_check": q["to_check"],
            }
            for q in inc["questions"]
        ],
        "timeline": [
            {"time": t["time"], "kind": t["kind"], "message": t["message"]}
            | ({"detail": t["detail"]} if t.get("detail") else {})
            for t in inc["timeline"]
        ],
    }


def step_outcome(step: dict[str, Any], approval: dict[str, Any] | None) -> dict[str, Any]:
    """Return what the step engine did with a step: state, policy, approval, diff, verification.

    ``diff`` is the change applied (its first apply; for staggered restarts every eviction),
    or the change it would make while it has not acted; ``verification`` is its result
    (``passed``/``failed`` with the checks) or ``pending`` / ``not_run``.
    """
    rec = StepRecord.from_record(step.get("result"))
    applied = rec.plan or {}
    try:
        action = Action(step["action"])
        diff = applied.get("diff") if action is not Action.STAGGER_RESTARTS else None
        diff = diff if diff is not None else preview_diff(action, step["params"])
    except ValueError:
        diff = ""
    verifying = rec.state in ("verifying", "applying")
    return {
        "state": rec.state,
        "policy": "auto" if step["approval"] == "auto" else "approval",
        "mode": rec.mode,
        "approval_state": _approval_state(approval),
        "diff": diff,
        "verification": rec.verification
        or {"result": "pending" if verifying else "not_run", "deadline_at": rec.deadline_at},
        "reason": rec.reason,
    }


def _approval_state(row: dict[str, Any] | None) -> dict[str, Any]:
    if row is None:
        return {"status": "not_requested"}
    keys = ("status", "policy", "approver_group", "decided_by", "via", "decided_at", "expires_at")
    return {k: row[k] for k in keys} | ({"reason": row["reason"]} if row["reason"] else {})


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
                console.print(f"     {key}: {escape(str(value))}", soft_wrap=True)
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
