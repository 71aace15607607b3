"""Approvals, arming, the kill switch and the action history, in the incident store.

Database reads and writes only (keyword-only ``session``; flushes, never commits: the caller
owns the transaction), plus the approver policy they enforce:

- a step's approval is requested by the step machine (``request``); a person on the approver
  allow-list approves or denies it (``decide``, called by the one decide flow,
  ``detector.runbooks.flows.decide``) while it is pending; the step machine expires it
  (``expire``). A pending row changes by a conditional
  ``UPDATE ... WHERE status = 'pending'``, so of two racing decisions (or a
  decision and the expiry) exactly one wins; the other gets ``ApprovalError("conflict")``.
- a workload is armed (may act for real) by ``detector arm`` or the settings' list; a stored
  ``disarm`` wins over the list. The kill switch is on when the setting or the stored switch is.
- every actuator call is recorded (``record_action``) for the cap and cooldown rails.

Times are Unix seconds; the approver's decision is stamped with the wall clock (it happens
now), the step machine's moves with event time.
"""

from __future__ import annotations

import time as _clock
from collections.abc import Collection
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from detector.db import clean_text, insert_ignore, store_errors, to_datetime
from detector.errors import ApprovalError
from detector.incidents import service
from detector.incidents.models import Incident
from detector.runbooks.models import Control, RunbookRun, RunbookStep, StepAction, StepApproval
from detector.runbooks.steps import ApprovalStatus

KILL_SWITCH = "kill_switch"
ARMED = "armed"
GLOBAL_SCOPE = "*"
COUNTED_MOVES = ("applied", "restarted")  # the moves the hourly cap counts


def may_approve(name: str, approvers: Collection[str]) -> bool:
    """Return True when ``name`` is on the approver allow-list."""
    return bool(name) and name in approvers


def workload_scope(value: str) -> str:
    """Return ``namespace/workload`` checked; raise ApprovalError(``not_found``) otherwise."""
    namespace, _, workload = value.partition("/")
    if not namespace or not workload or "/" in workload:
        raise ApprovalError("not_found", f"{value!r} is not NAMESPACE/WORKLOAD")
    return f"{namespace}/{workload}"


@store_errors
def request(
    *,
    session: Session,
    incident: Incident,
    step_id: str,
    position: int,
    policy: str,
    group: str | None,
    time: float,
    expires_at: float | None,
    digest: str | None = None,
) -> StepApproval:
    """Record that a step needs approval (pending), or that policy ``auto`` approved it.

    ``digest`` names the plan asked for (``transitions.plan_digest``). Idempotent: an existing
    row for the step is returned unchanged.
    """
    auto = policy == "auto"
    values = {
        "incident_id": incident.id,
        "step_id": step_id,
        "position": position,
        "policy": policy,
        "approver_group": None if auto else group,
        "status": (ApprovalStatus.APPROVED if auto else ApprovalStatus.PENDING).value,
        "requested_at": to_datetime(time),
        "expires_at": None if expires_at is None else to_datetime(expires_at),
        "decided_at": to_datetime(time) if auto else None,
        "decided_by": "policy:auto" if auto else None,
        "via": "policy" if auto else None,
        "reason": "",
        "plan_digest": digest,
    }
    insert_ignore(session, StepApproval, values, ["incident_id", "step_id"])
    session.expire(incident, ["approvals"])
    row = _row(session, incident, step_id)
    assert row is not None  # inserted or already there
    return row


@store_errors
def approvals_of(*, session: Session, incident: Incident) -> dict[str, StepApproval]:
    """Return the incident's approvals by step id, read fresh from the database."""
    stmt = select(StepApproval).where(StepApproval.incident_id == incident.id)
    rows = session.scalars(stmt.execution_options(populate_existing=True))
    return {row.step_id: row for row in rows}


def _set_pending(session: Session, row: StepApproval, **values: Any) -> bool:
    """Update a pending row with ``values``; False when it was no longer pending.

    A conditional ``UPDATE ... WHERE status = 'pending'``: of two racing changes one wins.
    """
    if "reason" in values:
        values["reason"] = clean_text(values["reason"])
    stmt = (
        update(StepApproval)
        .where(StepApproval.id == row.id, StepApproval.status == ApprovalStatus.PENDING.value)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    won = session.execute(stmt).rowcount == 1  # type: ignore[attr-defined]
    session.refresh(row)
    return won


def _row(session: Session, incident: Incident, step_id: str) -> StepApproval | None:
    stmt = select(StepApproval).filter_by(incident_id=incident.id, step_id=step_id)
    return session.scalars(stmt).one_or_none()


@store_errors
def close_pending(
    *, session: Session, incident: Incident, step_id: str, status: str, time: float, reason: str
) -> bool:
    """Close the step's pending approval as ``expired`` or ``withdrawn`` by the step machine.

    Nothing is applied. Returns False when the row was not pending (a person decided first).
    """
    row = _row(session, incident, step_id)
    if row is None:
        return False
    status = ApprovalStatus(status).value
    at = to_datetime(time)
    return _set_pending(session, row, status=status, decided_at=at, via="engine", reason=reason)


@store_errors
def rerequest(
    *,
    session: Session,
    incident: Incident,
    step_id: str,
    time: float,
    expires_at: float | None,
    digest: str | None,
) -> bool:
    """Ask again for a changed plan: the pending row gets the new digest, time and expiry.

    A decision on the old plan (its digest) is refused from then on. False when the row was
    not pending (a person decided first: that decision is read next).
    """
    row = _row(session, incident, step_id)
    if row is None:
        return False
    values = {
        "requested_at": to_datetime(time),
        "expires_at": None if expires_at is None else to_datetime(expires_at),
        "plan_digest": digest,
    }
    return _set_pending(session, row, **values)


def find_incident(*, session: Session, ref: str) -> Incident:
    """Return the incident by key or numeric id; raise ApprovalError(``not_found``)."""
    incident = service.get_incident_by_key(session=session, key=ref)
    if incident is None and ref.isascii() and ref.isdigit():
        incident = service.get_incident(session=session, incident_id=int(ref))
    if incident is None:
        raise ApprovalError("not_found", f"no incident {ref!r}")
    return incident


def _find_step(session: Session, incident: Incident, ref: str) -> StepApproval:
    """Return the step's approval by step id or position; raise not_found or conflict."""
    for row in approvals_of(session=session, incident=incident).values():
        if ref in (row.step_id, str(row.position)):
            return row
    stmt = (
        select(RunbookStep.position, RunbookStep.action)
        .join(RunbookRun, RunbookRun.id == RunbookStep.run_id)
        .where(RunbookRun.incident_id == incident.id)
    )
    if any(ref in (str(pos), action) for pos, action in session.execute(stmt)):
        raise ApprovalError("conflict", f"step {ref!r} is not waiting for approval")
    raise ApprovalError("not_found", f"incident {incident.key!r} has no step {ref!r}")


@store_errors
def decide(
    *,
    session: Session,
    incident_ref: str,
    step_ref: str,
    approve: bool,
    approver: str,
    via: str,
    approvers: Collection[str],
    reason: str = "",
    time: float | None = None,
    plan: str | None = None,
) -> StepApproval:
    """Approve or deny a pending step as ``approver``; record it on the timeline.

    ``incident_ref`` is the incident key or id, ``step_ref`` the step id or its position;
    ``plan`` the digest of the plan the person saw (None: the plan pending now). A decision
    is a person's act in wall-clock time: ``time`` (Unix seconds, default the wall clock) is
    compared with the approval's expiry and stamps the decision; the event time the detector
    had reached (the incident's latest) is kept too, and the step moves at that event time.
    Raises ApprovalError: ``forbidden`` (not on ``approvers``), ``not_found``, ``conflict``
    (not pending: not requested yet, decided, expired or withdrawn; past its expiry; or the
    plan changed since ``plan``). A refused decision changes nothing.
    """
    if not may_approve(approver, approvers):
        raise ApprovalError("forbidden", f"{approver!r} is not on the approver allow-list")
    incident = find_incident(session=session, ref=incident_ref)
    row = _find_step(session, incident, step_ref)
    status = (ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED).value
    now = _clock.time() if time is None else time
    _check_decidable(row, now, plan)
    values = {"status": status, "decided_at": to_datetime(now), "decided_by": approver,
              "via": via, "reason": reason, "decided_event_at": incident.updated_at}  # fmt: skip
    if not _set_pending(session, row, **values):
        raise ApprovalError("conflict", f"step {row.step_id!r} is {row.status}, not pending")
    message = f"step {row.position} {row.step_id} {status} by {approver} via {via}" + (
        f": {reason}" if reason else ""
    )
    detail = {
        "step": row.step_id,
        "position": row.position,
        "event": status,
        "actor": approver,
        "via": via,
        "reason": reason,
        "plan": row.plan_digest,
        "event_time": incident.updated_at.isoformat(),
    }
    service.add_timeline_entry(
        session=session,
        incident=incident,
        time=now,
        kind="step",
        message=message[:1000],
        dedupe_key=f"approval:{row.step_id}",
        detail=detail,
    )
    return row


def _check_decidable(row: StepApproval, now: float, plan: str | None) -> None:
    """Raise ApprovalError(``conflict``) unless ``row`` may be decided at wall-clock ``now``."""
    step = f"step {row.position} {row.step_id}"
    if row.status == ApprovalStatus.WITHDRAWN.value:
        raise ApprovalError("conflict", f"{step} was withdrawn: {row.reason or 'not needed'}")
    if row.status != ApprovalStatus.PENDING.value:
        raise ApprovalError("conflict", f"{step} is {row.status}, not pending")
    if row.expires_at is not None and row.expires_at.timestamp() <= now:
        when = row.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        raise ApprovalError("conflict", f"{step} expired at {when}: nothing changed")
    if plan is not None and plan != row.plan_digest:
        raise ApprovalError(
            "conflict",
            f"{step}: the plan pending is {row.plan_digest}, not {plan} (the plan changed, or "
            "a mistyped digest): look again",
        )


@store_errors
def set_control(
    *, session: Session, scope: str, name: str, enabled: bool, by: str, reason: str = ""
) -> Control:
    """Set an operator switch (kill switch: scope ``*``; arming: ``namespace/workload``)."""
    now = to_datetime(_clock.time())
    row = session.get(Control, (scope, name))
    if row is None:
        values = {
            "scope": scope,
            "name": name,
            "enabled": enabled,
            "updated_at": now,
            "updated_by": by,
            "reason": clean_text(reason),
        }
        insert_ignore(session, Control, values, ["scope", "name"])
        row = session.get(Control, (scope, name))
        assert row is not None
    row.enabled, row.updated_at, row.updated_by, row.reason = enabled, now, by, clean_text(reason)
    session.flush()
    return row


@store_errors
def control(*, session: Session, scope: str, name: str) -> bool | None:
    """Return a stored switch (None when never set), read fresh."""
    stmt = select(Control.enabled).where(Control.scope == scope, Control.name == name)
    value = session.execute(stmt).scalar_one_or_none()
    return None if value is None else bool(value)


def is_armed(
    *, session: Session, namespace: str, workload: str, armed_workloads: Collection[str]
) -> bool:
    """Return whether the workload may act for real: the stored flag, else the settings list."""
    stored = control(session=session, scope=f"{namespace}/{workload}", name=ARMED)
    return f"{namespace}/{workload}" in armed_workloads if stored is None else stored


def kill_switch_on(*, session: Session, setting: bool = False) -> bool:
    """Return True when the kill switch is on, in the settings or in the store."""
    return setting or bool(control(session=session, scope=GLOBAL_SCOPE, name=KILL_SWITCH))


@store_errors
def record_action(
    *,
    session: Session,
    incident: Incident,
    step_id: str,
    move: str,
    live: bool,
    status: str,
    time: float,
    dedupe_key: str,
) -> bool:
    """Record one actuator call for the rails; False when ``dedupe_key`` was recorded."""
    values = {
        "incident_id": incident.id,
        "namespace": incident.namespace,
        "workload": incident.workload,
        "step_id": step_id,
        "move": move,
        "live": live,
        "status": status,
        "time": to_datetime(time),
        "dedupe_key": dedupe_key,
    }
    return insert_ignore(session, StepAction, values, ["dedupe_key"])


def _actions(namespace: str, workload: str, live: bool) -> Select[Any]:
    return select(StepAction).where(
        StepAction.namespace == namespace,
        StepAction.workload == workload,
        StepAction.live == live,
        StepAction.status != "failed",
    )


@store_errors
def actions_between(
    *, session: Session, namespace: str, workload: str, live: bool, since: float, until: float
) -> int:
    """Return how many applies and restarts the workload had in (since, until]."""
    sub = _actions(namespace, workload, live).where(
        StepAction.move.in_(COUNTED_MOVES),
        StepAction.time > to_datetime(since),
        StepAction.time <= to_datetime(until),
    )
    return int(session.scalar(select(func.count()).select_from(sub.subquery())) or 0)


@store_errors
def last_applies(
    *, session: Session, incident: Incident, live: bool, until: float
) -> dict[str, float]:
    """Return step id -> the latest apply on the incident's workload by other incidents."""
    sub = _actions(incident.namespace, incident.workload, live).where(
        StepAction.move == "applied",
        StepAction.incident_id != incident.id,
        StepAction.time <= to_datetime(until),
    )
    rows = session.scalars(sub)
    out: dict[str, float] = {}
    for row in rows:
        out[row.step_id] = max(out.get(row.step_id, 0.0), row.time.timestamp())
    return out
