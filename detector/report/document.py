"""The incident document: what ``replay --json`` and ``incidents --json`` print, built from
the read model's ``IncidentOut`` (its JSON dump) and a replay's counts.

Step parameters are typed here: the runbook renders every parameter as text, so a value that
is JSON (a number, a list, an object) is given as that value (``"13"`` -> 13, ``"[\"a\"]"``
-> ``["a"]``); identity parameters (names of Kubernetes objects) and other text stay text.
"""

from __future__ import annotations

import json
import math
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from detector.correlate.unattributed import UnattributedReason
from detector.incidents.schemas import VerdictOut
from detector.report.coverage import coverage_document
from detector.report.schemas import IncidentOut
from detector.runbooks.definition import Action
from detector.runbooks.runner import preview_diff
from detector.runbooks.steps import StepRecord

TEXT_PARAMS = frozenset(
    {"namespace", "workload", "workload_kind", "ingress", "upstream", "pod", "engine", "container"}
)


@dataclass
class EventCounts:
    """How many records were read, parsed and rejected (by reason), and the signals that
    named no workload (by kind and reason, with the hint that would tie them)."""

    read: int = 0
    parsed: int = 0
    rejected: int = 0
    signals: int = 0
    unattributed: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)
    unattributed_by_reason: list[UnattributedReason] = field(default_factory=list)


@dataclass
class ReplayResult:
    """What one replay found and stored."""

    events: EventCounts
    incidents: list[IncidentOut]
    verdicts: list[VerdictOut]


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
            "unattributed_by_reason": [
                {
                    "kind": r.kind,
                    "reason": r.reason,
                    "hint": r.hint,
                    "count": r.count,
                    "examples": [dict(e) for e in r.examples],
                }
                for r in ev.unattributed_by_reason
            ],
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
        "coverage": coverage_document(inc.get("coverage"), kinds),
        "steps": [
            {
                "position": s["position"],
                "action": s["action"],
                "title": s["title"],
                "status": s["status"],
                "approval": s["approval"],
                "params": typed_params(s["params"]),
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
    """Return what the step machine did with a step: state, policy, approval, diff, verification.

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
    extra = {"plan": row.get("plan_digest"), "decided_event_at": row.get("decided_event_at")}
    return (
        {k: row[k] for k in keys}
        | ({"reason": row["reason"]} if row["reason"] else {})
        | {k: v for k, v in extra.items() if v}
    )


def typed_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Return step ``params`` with JSON numbers, lists and objects decoded (see module doc)."""
    return {key: _typed(key, value) for key, value in params.items()}


def _typed(key: str, value: Any) -> Any:
    if not isinstance(value, str) or key in TEXT_PARAMS:
        return value
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    if isinstance(decoded, bool) or not isinstance(decoded, int | float | list | dict):
        return value
    if isinstance(decoded, float) and not math.isfinite(decoded):
        return value
    return decoded


def past_expiry(approval: Mapping[str, Any], now: datetime | None = None) -> datetime | None:
    """Return when a pending ``approval_state`` expired by the wall clock, else None.

    Such an approval can no longer be decided (``runbooks.approvals.decide`` refuses it).
    """
    expires = approval.get("expires_at")
    if approval.get("status") != "pending" or not expires:
        return None
    when = datetime.fromisoformat(expires).astimezone(UTC)
    return when if when <= (now or datetime.now(UTC)) else None


def decidable(step: Mapping[str, Any], now: datetime | None = None) -> bool:
    """Return True when a step of the document waits for a person's decision now.

    Awaiting approval, its approval pending and not past its expiry by the wall clock
    (``past_expiry``): what Slack's buttons and the web page's forms are offered for.
    """
    approval = step["approval_state"]
    return (
        step["state"] == "awaiting_approval"
        and approval.get("status") == "pending"
        and past_expiry(approval, now) is None
    )


def decision_commands(key: str, step: Mapping[str, Any], *, db: str = "") -> tuple[str, str]:
    """Return the CLI commands that approve and deny a ``decidable`` step: (approve, deny).

    ``NAME`` (and ``WHY`` for deny) are for the person to fill in; the step's plan digest is
    passed so that a plan that changed since is refused. Values are shell-quoted (the key
    holds input text); ``db`` adds ``--db URL`` (a store other than the default).
    """
    position = str(step["position"])
    args = [shlex.quote(key), position, "--as", "NAME"]
    if plan := step["approval_state"].get("plan"):
        args += ["--plan", shlex.quote(str(plan))]
    if db:
        args += ["--db", shlex.quote(db)]
    tail = " ".join(args)
    return f"detector approve {tail}", f"detector deny {tail} --reason WHY"
