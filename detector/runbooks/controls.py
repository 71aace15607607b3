"""Operator controls with their history: who switched the kill switch or armed a workload.

Database reads and writes only (keyword-only ``session``; flushes, never commits), called by
the one decide flow (``detector.runbooks.flows.decide``):

- ``change`` sets the switch (``approvals.set_control``, the latest state the step machine
  reads), keeps the change in ``control_changes`` (who, when by the wall clock, why, from
  where) and adds a timeline entry to every open incident, and for arming to the incidents of
  that workload, so whoever reads an incident sees the switch that held or released it;
- ``history`` reads the changes back, latest first;
- ``known_workloads`` and ``close_workloads`` tell a mistyped ``namespace/workload`` from one
  the store has seen (an incident, a verdict or a step action).
"""

from __future__ import annotations

import difflib
import time as _clock
from dataclasses import dataclass
from datetime import UTC

from sqlalchemy import select, union
from sqlalchemy.orm import Session

from detector.correlate.state import Stage
from detector.db import clean_text, store_errors, to_datetime
from detector.incidents import service
from detector.incidents.models import Incident, TimelineKind, Verdict
from detector.runbooks import approvals
from detector.runbooks.models import ControlChange, StepAction

HISTORY_ROWS = 20  # kill-switch status shows this many changes by default
WORKLOAD_INCIDENTS = 50  # arming notes at most this many incidents of its workload (latest)


@dataclass(frozen=True, slots=True)
class ControlOrigin:
    """Who changes a control and from where: the actor, the face and the CLI's host."""

    by: str
    via: str
    host: str = ""
    reason: str = ""


def describe(scope: str, name: str, enabled: bool) -> str:
    """Return a control change in words: ``kill switch on``, ``armed llm/vllm-llama``."""
    if name == approvals.KILL_SWITCH:
        return f"kill switch {'on' if enabled else 'off'}"
    return f"{'armed' if enabled else 'disarmed'} {scope}"


@store_errors
def change(
    *,
    session: Session,
    scope: str,
    name: str,
    enabled: bool,
    origin: ControlOrigin,
    time: float | None = None,
) -> ControlChange:
    """Set a control, keep the change in the history and note it on the incidents it touches.

    ``time`` is Unix seconds (default: the wall clock, a person decides now). Returns the
    history row. Raises StoreError.
    """
    now = _clock.time() if time is None else time
    row = approvals.set_control(
        session=session, scope=scope, name=name, enabled=enabled, by=origin.by, reason=origin.reason
    )
    row.updated_at = to_datetime(now)
    entry = ControlChange(
        scope=scope,
        name=name,
        enabled=enabled,
        changed_at=to_datetime(now),
        changed_by=clean_text(origin.by)[:255],
        via=clean_text(origin.via)[:32],
        host=clean_text(origin.host)[:255],
        reason=clean_text(origin.reason),
    )
    session.add(entry)
    session.flush()
    for incident in _touched(session, scope, name):
        _note(session, incident, entry)
    return entry


def _touched(session: Session, scope: str, name: str) -> list[Incident]:
    """Return the open incidents, and for arming the latest incidents of its workload."""
    stmt = select(Incident).where(Incident.stage != Stage.RESOLVED.value).order_by(Incident.id)
    found = {row.id: row for row in session.scalars(stmt)}
    if name == approvals.ARMED:
        namespace, _, workload = scope.partition("/")
        latest = (
            select(Incident)
            .where(Incident.namespace == namespace, Incident.workload == workload)
            .order_by(Incident.opened_at.desc(), Incident.id.desc())
            .limit(WORKLOAD_INCIDENTS)
        )
        found |= {row.id: row for row in session.scalars(latest)}
    return [found[key] for key in sorted(found)]


def _note(session: Session, incident: Incident, entry: ControlChange) -> None:
    """Add the change to the incident's timeline: who switched what, when, why, from where."""
    message = f"{describe(entry.scope, entry.name, entry.enabled)} by {origin_text(entry)}"
    message += f" at {entry.changed_at.astimezone(UTC).isoformat(timespec='seconds')}"
    message += f": {entry.reason}" if entry.reason else ""
    detail = {
        "event": "control",
        "control": entry.name,
        "scope": entry.scope,
        "enabled": entry.enabled,
        "actor": entry.changed_by,
        "via": entry.via,
        "host": entry.host,
        "reason": entry.reason,
        "at": entry.changed_at.isoformat(),
    }
    service.add_timeline_entry(
        session=session,
        incident=incident,
        time=entry.changed_at.timestamp(),
        kind=TimelineKind.NOTE.value,
        message=message[:1000],
        dedupe_key=f"control:{entry.id}",
        detail=detail,
    )


def origin_text(entry: ControlChange) -> str:
    """Return ``who via face`` (``from host`` for the CLI) of a change."""
    return f"{entry.changed_by} via {entry.via}" + (f" from {entry.host}" if entry.host else "")


@store_errors
def history(*, session: Session, limit: int = HISTORY_ROWS) -> list[ControlChange]:
    """Return the latest ``limit`` control changes, latest first."""
    stmt = (
        select(ControlChange)
        .order_by(ControlChange.changed_at.desc(), ControlChange.id.desc())
        .limit(limit)
    )
    return list(session.scalars(stmt))


@store_errors
def is_known(*, session: Session, scope: str) -> bool:
    """Return True when the store has an incident, a verdict or a step action of ``scope``."""
    namespace, _, workload = scope.partition("/")
    for model in (Incident, Verdict, StepAction):
        stmt = select(model.id).filter_by(namespace=namespace, workload=workload).limit(1)
        if session.scalar(stmt) is not None:
            return True
    return False


@store_errors
def known_workloads(*, session: Session) -> set[str]:
    """Return every ``namespace/workload`` with an incident, a verdict or a step action."""
    stmt = union(
        select(Incident.namespace, Incident.workload),
        select(Verdict.namespace, Verdict.workload),
        select(StepAction.namespace, StepAction.workload),
    )
    return {f"{namespace}/{workload}" for namespace, workload in session.execute(stmt)}


def close_workloads(value: str, known: set[str], n: int = 3) -> list[str]:
    """Return up to ``n`` known workloads that look like ``value`` (difflib, best first)."""
    return difflib.get_close_matches(value, sorted(known), n=n, cutoff=0.6)
