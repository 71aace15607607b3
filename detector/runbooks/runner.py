"""Run the step machine for one incident: read its conditions, act, record every transition.

The adapter side of :mod:`detector.runbooks.transitions`: the conditions come from the store
(approvals, arming, kill switch, the workload's recent actions) and the incident's evidence;
each move that acts goes through the actuator registered for the step's action, for real only
when the process is not in dry-run, the workload is armed and an actuator is registered;
otherwise through a ``DryRunActuator`` (or the registered one with ``dry_run=True``), which
records the exact change it would make. Every transition is stored: the step's record, its
approval, the action history and a timeline entry with the actor, status, reason and diff.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

from sqlalchemy.orm import Session

from detector.actuators.base import (
    ActionResult,
    Actuator,
    ActuatorError,
    Change,
    Operation,
    Plan,
    Reason,
    Status,
)
from detector.capacity.numbers import coerce_int
from detector.correlate.context import IncidentContext
from detector.incidents import service
from detector.incidents.models import Incident
from detector.runbooks import approvals
from detector.runbooks import service as run_service
from detector.runbooks.bindings.base import StepActuator
from detector.runbooks.definition import Action, Runbook
from detector.runbooks.health import health
from detector.runbooks.models import RunbookRun, RunbookStep, StepApproval
from detector.runbooks.planner import PlannedStep, plan, planned_step
from detector.runbooks.steps import Approval, StepRecord, StepState
from detector.runbooks.transitions import (
    ACTUATOR_MOVES,
    REVERT_MOVES,
    Conditions,
    Move,
    Transition,
    next_transition,
    settle,
)

log = logging.getLogger(__name__)

MAX_MOVES = 64  # moves of one incident per call: a bound, far above what a tick needs
HOUR_S = 3600.0
_DONE = frozenset(
    {
        StepState.NOT_NEEDED,
        StepState.DENIED,
        StepState.EXPIRED,
        StepState.FAILED,
        StepState.ROLLED_BACK,
        StepState.LIFTED,
        StepState.WITHDRAWN,
    }
)


def dry_run_change(action: Action, params: Mapping[str, str]) -> tuple[str, str | None, str | None]:
    """Return (target, content before, content after) that a step would change, as text.

    Quarantine: the gateway's admission rule (nginx ``client_max_body_size``; before: none).
    Ceiling: the container args or env of the workload (before: the ceilings in force, from
    the engine's startup lines). Rate limit: the ingress annotations (before: none). Restart:
    the Eviction the API server would get for the ``pod`` param (an LWS: its group's leader;
    an Argo Rollout: its ``spec.restartAt`` patch instead; before: none).
    """
    p = params
    if action is Action.QUARANTINE_REQUESTS:
        target = f"gateway admission rule of {p.get('namespace')}/{p.get('ingress')}"
        size = coerce_int(p.get("max_body_bytes"))
        after = f"client_max_body_size {size // 1024}k; # 413 over it\n" if size else None
        return target, None, after  # no size: no request class, nothing to change
    if action is Action.LOWER_BATCH_CEILING:
        where = f"{p.get('workload_kind')}/{p.get('namespace')}/{p.get('workload')}"
        target = f"{where} container {p.get('set_via', 'args')}"
        before = p.get("current_settings")
        return target, _lines(before) if before else None, _lines(p.get("settings", ""))
    if action is Action.ENABLE_RATE_LIMIT:
        target = f"Ingress/{p.get('namespace')}/{p.get('ingress')} annotations"
        prefix = "nginx.ingress.kubernetes.io"
        after = (
            f'{prefix}/limit-connections: "{p.get("limit_connections")}"\n'
            f'{prefix}/limit-rps: "{p.get("limit_rps")}"\n'
        )
        return target, None, after
    pod, namespace = p.get("pod", "?"), p.get("namespace")
    if p.get("workload_kind") == "Rollout":  # Argo restarts the pods itself, one at a time
        target = f"PATCH /apis/argoproj.io/v1alpha1/namespaces/{namespace}/rollouts/"
        body: dict[str, object] = {"spec": {"restartAt": f"<now, for pod {pod}>"}}
        return target + str(p.get("workload")), None, json.dumps(body, sort_keys=True) + "\n"
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace}}  # fmt: skip
    target = f"POST /api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    if p.get("workload_kind") == "LeaderWorkerSet":  # a group restarts as one unit
        target += f" (the leader of {pod}'s group)"
    return target, None, json.dumps(body, sort_keys=True) + "\n"


def _lines(text: str) -> str:
    """Return ``--a=1 --b=2`` / ``A=1 B=2`` as one setting per line."""
    return "".join(f"{word}\n" for word in text.split(" ") if word)


def preview_diff(action: Action, params: Mapping[str, str]) -> str:
    """Return the diff a step would make from nothing applied yet (every pod, for restarts)."""
    pods: list[str | None] = [None]
    if action is Action.STAGGER_RESTARTS:
        try:
            pods = [str(p) for p in json.loads(params.get("pods") or "[]")]
        except ValueError:
            pods = []
    diffs = []
    for pod in pods:
        target, before, after = dry_run_change(action, {**params, "pod": pod or ""})
        diffs.append(Change(target, before, after).diff)
    return "".join(diffs)


class DryRunActuator(Actuator):
    """Record the change a step would make, as text; it never touches any system.

    ``current`` is the content the detector believes is in place (the after of its last
    recorded change), so a lift or a removal shows its diff against what was applied.
    """

    action: ClassVar[str] = "dry_run"

    def __init__(self, current: Mapping[str, str | None] | None = None) -> None:
        self._content: dict[str, str | None] = dict(current or {})

    @property
    def target(self) -> str:
        """Return ``dry-run``."""
        return "dry-run"

    def plan_step(self, step: PlannedStep) -> Plan:
        """Return the plan of ``dry_run_change(step)`` against the believed content."""
        target, before, after = dry_run_change(step.action, step.params)
        self._content.setdefault(target, before)
        change = Change(target, self._content[target], after)
        return Plan(step.action.value, target, (change,), f"{step.step_id} (dry-run actuator)")

    def read(self, target: str) -> str | None:
        """Return the believed content of ``target``."""
        return self._content.get(target)

    def write(self, target: str, content: str | None) -> None:
        """Change the believed content only (called only with ``dry_run=False``)."""
        self._content[target] = content

    def validate(self) -> None:
        """Nothing to validate."""

    def activate(self) -> None:
        """Nothing to activate."""


@dataclass
class Containment:
    """What the runner needs besides the store and the runbook.

    ``dry_run``: the process-wide switch (nothing acts for real while it is True);
    ``actuators``: the registry, by action (``Action`` value); ``armed_workloads`` and
    ``kill_switch``: the settings' (the stored switches are read too).
    """

    dry_run: bool = True
    actuators: Mapping[str, StepActuator] = field(default_factory=dict)
    armed_workloads: frozenset[str] = frozenset()
    kill_switch: bool = False
    gateway: str | None = None  # the configured 429 gateway (planning says what it enforces)


def stored_plan(runbook: Runbook, run: RunbookRun) -> list[PlannedStep]:
    """Return the run's steps as planned steps: params from the store, policy from the runbook."""
    steps = []
    for row in run.steps:
        if 1 <= row.position <= len(runbook.steps):
            params = {str(k): str(v) for k, v in (row.params or {}).items()}
            steps.append(planned_step(runbook, row.position, params, row.status, row.title))
    return steps


def records_of(run: RunbookRun) -> dict[int, StepRecord]:
    """Return the stored engine record of each step of ``run``, by position."""
    return {row.position: StepRecord.from_record(row.result) for row in run.steps}


def settled(run: RunbookRun, runbook: Runbook, stage: str = "resolved") -> bool:
    """Return True when no step of ``run`` can move again (a cheap check before a tick).

    A verified step can still escalate while the incident (at ``stage``) is not resolved: a
    cascade may resume after it.
    """
    for pos, rec in records_of(run).items():
        state = StepState(rec.state)
        lift = pos <= len(runbook.steps) and runbook.steps[pos - 1].lift is not None
        ended = state in (StepState.VERIFIED, StepState.ESCALATED) and not (lift and rec.in_place)
        if state is StepState.VERIFIED and stage != "resolved":
            ended = False
        if state not in _DONE and not ended:
            return False
    return bool(run.steps)


def advance(
    *,
    session: Session,
    incident: Incident,
    run: RunbookRun,
    runbook: Runbook,
    ctx: IncidentContext,
    now: float,
    containment: Containment,
) -> int:
    """Make every move of the incident's steps due at ``now``; return how many were made."""
    steps = stored_plan(runbook, run)
    rows = {row.position: row for row in run.steps}
    stored = records_of(run)
    records = {step.step_id: stored[step.position] for step in steps}
    current = _current(runbook, ctx, records, containment)
    made = 0
    for _ in range(MAX_MOVES):
        cond = _conditions(session, incident, runbook, ctx, now, containment, current)
        t = next_transition(steps, records, cond)
        if t is None:
            break
        if not _claim_approval(session, incident, t, cond, now):
            continue  # decided meanwhile: the next round reads the decision
        row = rows[t.step.position]
        if t.move in ACTUATOR_MOVES:
            t = act(t, containment, _write_ahead(session, row, t, containment, now))
        elif t.move in _ENDS_UNAPPLIED and t.record.intent is not None and not t.record.plan:
            t = _undo_intent(t, containment)
        if t.replan is not None:
            run_service.set_step_params(session=session, step=row, params=t.replan, time=now)
            steps = [
                replace(s, params=dict(t.replan)) if s.step_id == t.step.step_id else s
                for s in steps
            ]
        _store(session, incident, row, t, now)
        records[t.step.step_id] = t.record
        made += 1
    return made


# moves that end a step without an apply on record: an intent left by a crash is undone
_ENDS_UNAPPLIED = frozenset(
    {Move.REFUSED, Move.WITHDRAWN, Move.NOT_NEEDED, Move.EXPIRED, Move.DENIED}
)
_READS_NOW = frozenset(
    {StepState.PLANNED, StepState.AWAITING_APPROVAL, StepState.APPROVED, StepState.APPLYING}
)


def _current(
    runbook: Runbook, ctx: IncidentContext, records: Mapping[str, StepRecord], c: Containment
) -> dict[str, PlannedStep]:
    """Plan the steps from the evidence of now, when a step still to act will read it (an
    applied quarantine too: it follows the request class, ``transitions._resize``)."""
    if not any(_reads_now(runbook.step(sid).action, rec) for sid, rec in records.items()):
        return {}
    return {s.step_id: s for s in plan(runbook, ctx, dry_run=c.dry_run, gateway=c.gateway)}


def _reads_now(action: Action, rec: StepRecord) -> bool:
    state = StepState(rec.state)
    return state in _READS_NOW or (
        action is Action.QUARANTINE_REQUESTS and state in (StepState.VERIFYING, StepState.VERIFIED)
    )


_PENDING_MOVES = {Move.EXPIRED: "expired", Move.WITHDRAWN: "withdrawn"}


def _claim_approval(
    session: Session, incident: Incident, t: Transition, cond: Conditions, now: float
) -> bool:
    """Move the step's pending approval row along with an expiry or a withdrawal.

    Returns False when a person decided meanwhile (the row was no longer pending): the move
    must not happen, the next round reads the decision.
    """
    pending = cond.approvals.get(t.step.step_id)
    if pending is None or pending.status != "pending":
        return True
    step_id = t.step.step_id
    if t.move in _PENDING_MOVES:
        status = _PENDING_MOVES[t.move]
        return approvals.close_pending(
            session=session, incident=incident, step_id=step_id, status=status, time=now,
            reason=t.reason,
        )  # fmt: skip
    if t.move is Move.REREQUEST:
        return approvals.rerequest(
            session=session, incident=incident, step_id=step_id, time=now,
            expires_at=t.record.expires_at, digest=(t.record.approval or {}).get("digest"),
        )  # fmt: skip
    return True


def _conditions(
    session: Session,
    incident: Incident,
    runbook: Runbook,
    ctx: IncidentContext,
    now: float,
    c: Containment,
    current: Mapping[str, PlannedStep],
) -> Conditions:
    armed = approvals.is_armed(
        session=session,
        namespace=incident.namespace,
        workload=incident.workload,
        armed_workloads=c.armed_workloads,
    )
    live = armed and not c.dry_run
    rows = approvals.approvals_of(session=session, incident=incident)
    count = approvals.actions_between(
        session=session,
        namespace=incident.namespace,
        workload=incident.workload,
        live=live,
        since=now - HOUR_S,
        until=now,
    )
    return Conditions(
        now=now,
        health=health(ctx),
        live=live,
        actuated=frozenset(c.actuators),
        kill_switch=approvals.kill_switch_on(session=session, setting=c.kill_switch),
        approvals={k: _approval(r) for k, r in rows.items()},
        actions_last_hour=count,
        max_actions_per_hour=runbook.max_actions_per_hour,
        last_apply_at=approvals.last_applies(
            session=session, incident=incident, live=live, until=now
        ),
        current=current,
        dry_run_why=_dry_run_why(incident, armed, c.dry_run),
    )


def _dry_run_why(incident: Incident, armed: bool, dry_run: bool) -> str:
    """Return why nothing of the incident acts for real ("" when it may)."""
    if dry_run:
        return "the detector runs with DETECTOR_DRY_RUN=true"
    if not armed:
        where = f"{incident.namespace}/{incident.workload}"
        return f"{where} is not armed (detector arm {where})"
    return ""


def _approval(row: StepApproval) -> Approval:
    at = row.decided_event_at
    event_at = at.timestamp() if at is not None else None
    return Approval(row.status, row.decided_by, row.via, row.reason, event_at)


def _write_ahead(
    session: Session, row: RunbookStep, t: Transition, c: Containment, now: float
) -> Plan | None:
    """Commit the plan of a step's first live apply before its actuator is called; return it.

    The plan's ``before`` is what a removal or rollback restores. Read after a crash that
    came between the actuator's call and the record of its result, the target already holds
    the change: the plan is then read anew for its ``after`` and keeps the ``before`` of the
    intent committed the first time (``_keep_before``), so the apply finds nothing left to
    do and the undo still restores the target as it was. None for every other move (lifts,
    resizes and restarts are not undone from their own plan) and when planning fails (``act``
    plans again and records the refusal).
    """
    actuator = c.actuators.get(t.step.action.value)
    if t.move is not Move.APPLY or not t.live or actuator is None or t.record.plan is not None:
        return None
    stored = StepRecord.from_record(row.result)
    try:
        plan = actuator.plan_step(replace(t.step, params=dict(t.params or {})))
        if stored.intent is not None:
            plan = _keep_before(plan, Plan.from_record(stored.intent))
    except ActuatorError:
        return None
    intent = replace(stored, intent=plan.as_record()).as_record()
    run_service.set_step_state(session=session, step=row, status=row.status, result=intent,
                               time=now)  # fmt: skip
    session.commit()  # the undo is on disk before anything changes
    return plan


def _undo_intent(t: Transition, c: Containment) -> Transition:
    """Put back a target that an apply cut short by a crash may have changed, once its step
    moves on without the apply on record (refused, withdrawn, not needed, expired): the
    intent's ``before`` is written where the target differs from it (nothing otherwise), and
    the timeline line says which. The intent is dropped once the target is as before."""
    actuator = c.actuators.get(t.step.action.value)
    if actuator is None or t.record.intent is None:
        return t
    try:
        result = actuator.revert(Plan.from_record(t.record.intent), dry_run=False)
    except Exception as exc:  # the step runner's boundary, as in ``act``
        log.exception("undoing an intent failed step=%s", t.step.step_id)
        result = _failed(t, t.step.action.value, Reason.ERROR, f"{type(exc).__name__}: {exc}")
    if result.status is Status.UNCHANGED:
        note = "the target was as before the incident"
    elif result.ok:
        note = "an apply cut short by a restart was undone: the target is as before the incident"
    else:
        note = f"undoing an apply cut short by a restart failed ({result.error}): check the target"
    record = t.record if not result.ok else replace(t.record, intent=None)
    return replace(t, record=record, reason=f"{t.reason}; {note}", diff=result.diff)


def _keep_before(plan: Plan, intent: Plan) -> Plan:
    """Return ``plan`` with each target's ``before`` taken from ``intent``; a target only the
    intent names is planned back to its ``before`` (the new plan no longer changes it)."""
    before = {c.target: c.before for c in intent.changes}
    changes = [Change(c.target, before.get(c.target, c.before), c.after) for c in plan.changes]
    named = {c.target for c in plan.changes}
    changes += [
        Change(c.target, c.before, c.before) for c in intent.changes if c.target not in named
    ]
    return replace(plan, changes=tuple(changes))


def act(t: Transition, c: Containment, prepared: Plan | None = None) -> Transition:
    """Perform an acting move through its actuator; never raises (the step runner's boundary).

    ``prepared``: the apply's plan as ``_write_ahead`` committed it (None: planned here)."""
    action = t.step.action.value
    actuator = c.actuators.get(action) or DryRunActuator(_believed(t.record))
    dry_run = not t.live
    plan: Plan | None = None
    try:
        if t.move in REVERT_MOVES:
            plan = Plan.from_record(t.record.plan or {})
            result = actuator.revert(plan, dry_run=dry_run)
        else:
            plan = prepared or actuator.plan_step(replace(t.step, params=dict(t.params or {})))
            result = actuator.apply(plan, dry_run=dry_run)
    except ActuatorError as exc:  # refused, or the target is gone: an outcome, not a bug
        if t.move is Move.RESTART and exc.reason is Reason.NOT_FOUND:
            # the pod is gone: its controller replaced it since it was planned (a rollout, a
            # person); there is nothing left to restart, and the next pod's turn comes
            result = ActionResult(action, "actuator", Operation.APPLY, Status.UNCHANGED)
        else:
            log.warning("actuator refused step=%s move=%s: %s", t.step.step_id, t.move.value, exc)
            result = _failed(t, action, exc.reason, str(exc))
    except Exception as exc:  # the background step runner's boundary: one step, not the stream
        log.exception("actuator failed step=%s move=%s", t.step.step_id, t.move.value)
        result = _failed(t, action, Reason.ERROR, f"{type(exc).__name__}: {exc}")
    return settle(t, result, plan.as_record() if plan is not None else None)


def _failed(t: Transition, action: str, reason: Reason, error: str) -> ActionResult:
    """Return the failed result of a move whose actuator raised (nothing was changed)."""
    operation = Operation.REVERT if t.move in REVERT_MOVES else Operation.APPLY
    return ActionResult(action, "actuator", operation, Status.FAILED, reason=reason,
                        error=error[:500], restored=False)  # fmt: skip


def _believed(rec: StepRecord) -> dict[str, str | None]:
    """Return target -> content after the step's latest recorded change (dry-run simulation)."""
    changes = (rec.current or {}).get("changes") or []
    return {str(c["target"]): c.get("after") for c in changes}


def step_status(planned_status: str, rec: StepRecord) -> str:
    """Return the status column of a step: ``dry_run`` while only recorded, else its state."""
    if rec.mode == "live":
        return rec.state
    if rec.mode == "dry_run" or planned_status == "dry_run":
        return "dry_run"
    return rec.state


def _store(
    session: Session, incident: Incident, row: RunbookStep, t: Transition, now: float
) -> None:
    """Store the step's record and approval, the action history and the timeline entry."""
    rec, step = t.record, t.step
    status = step_status(row.status, rec)
    run_service.set_step_state(
        session=session, step=row, status=status, result=rec.as_record(), time=now
    )
    if t.move in (Move.AUTO_APPROVE, Move.REQUEST_APPROVAL):
        group = step.approval.removeprefix("approver:")
        approvals.request(
            session=session,
            incident=incident,
            step_id=step.step_id,
            position=step.position,
            policy=step.policy,
            group=group,
            time=now,
            expires_at=rec.expires_at,
            digest=(rec.approval or {}).get("digest"),
        )
    if t.move in ACTUATOR_MOVES:
        ok = rec.state != StepState.FAILED.value
        approvals.record_action(
            session=session,
            incident=incident,
            step_id=step.step_id,
            move=t.move.value,
            live=t.live,
            status="ok" if ok else "failed",
            time=now,
            dedupe_key=f"{incident.id}:{t.dedupe}",
        )
    service.add_timeline_entry(
        session=session,
        incident=incident,
        time=now,
        kind="step",
        message=t.message[:1000],
        dedupe_key=t.dedupe,
        detail=t.detail(),
    )
