"""Reads and writes of runbook runs and their steps; nothing else (no flows, no policy).

Like ``detector.incidents.service``: keyword-only ``session``, flushes but never commits (the
caller owns the transaction), idempotent inserts on each table's unique key, times in Unix
seconds, database failures raised as ``StoreError``. Approvals, controls and the action
history are in ``detector.runbooks.approvals``.
"""

from __future__ import annotations

import functools
import time as _clock
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Select, bindparam, select
from sqlalchemy.orm import Session

from detector.db import clean_json, get_or_insert, store_errors, to_datetime
from detector.incidents.models import Incident
from detector.runbooks.models import RunbookRun, RunbookStep, RunMode


@store_errors
def get_or_create_run(
    *,
    session: Session,
    incident: Incident,
    runbook: str,
    version: str,
    mode: str,
    time: float | None = None,
) -> RunbookRun:
    """Return the incident's run of ``runbook``, creating it (status ``planned``) when new.

    ``time`` (Unix seconds) stamps ``created_at``; the wall clock when omitted.
    """
    values = {
        "incident_id": incident.id,
        "runbook": runbook,
        "version": version,
        "mode": RunMode(mode).value,
        "status": "planned",
        "created_at": to_datetime(_clock.time() if time is None else time),
    }
    run, inserted = get_or_insert(session, RunbookRun, values, ["incident_id", "runbook"])
    if inserted:
        session.expire(incident, ["runs"])
    return run


@store_errors
def set_run_status(*, session: Session, run: RunbookRun, status: str) -> bool:
    """Set the status of ``run``; return False when unchanged."""
    if run.status == status:
        return False
    run.status = status
    session.flush()
    return True


@store_errors
def upsert_step(
    *,
    session: Session,
    run: RunbookRun,
    position: int,
    action: str,
    title: str,
    status: str,
    params: Mapping[str, Any],
    approval: str,
    result: Mapping[str, Any] | None = None,
    time: float | None = None,
) -> RunbookStep:
    """Create or update the step of ``run`` at ``position`` with these values.

    ``status`` is ``dry_run`` while the step is only recorded, else its ``StepState`` value. A
    plain upsert: whether a status may change is the caller's policy. ``time`` (Unix seconds)
    stamps ``updated_at``; the wall clock when omitted.
    """
    fields: dict[str, Any] = {
        "action": action,
        "title": title,
        "status": status,
        "params": clean_json(dict(params)),
        "approval": approval,
        "result": clean_json(dict(result)) if result is not None else None,
    }
    now = to_datetime(_clock.time() if time is None else time)
    values = {"run_id": run.id, "position": position, "updated_at": now, **fields}
    step, inserted = get_or_insert(session, RunbookStep, values, ["run_id", "position"])
    if inserted:
        session.expire(run, ["steps"])
    elif any(getattr(step, name) != value for name, value in fields.items()):
        for name, value in fields.items():
            setattr(step, name, value)
        step.updated_at = now
        session.flush()
    return step


@store_errors
def set_step_state(
    *,
    session: Session,
    step: RunbookStep,
    status: str,
    result: Mapping[str, Any],
    time: float,
) -> None:
    """Store the step machine's ``result`` record and ``status`` of a step; ``time`` stamps it."""
    step.status = status
    step.result = clean_json(dict(result))
    step.updated_at = to_datetime(time)
    session.flush()


@store_errors
def run_of(*, session: Session, incident: Incident, runbook: str) -> RunbookRun | None:
    """Return the incident's run of ``runbook``, or None before it was planned."""
    params = {"incident_id": incident.id, "runbook": runbook}
    return session.scalars(_run_of_statement(), params).one_or_none()


@functools.cache
def _run_of_statement() -> Select[RunbookRun]:
    """Return ``run_of``'s SELECT, built once: containment asks it for every decision."""
    return select(RunbookRun).where(
        RunbookRun.incident_id == bindparam("incident_id"),
        RunbookRun.runbook == bindparam("runbook"),
    )


@store_errors
def set_step_params(
    *, session: Session, step: RunbookStep, params: Mapping[str, Any], time: float
) -> None:
    """Store the params a step acts with now (a re-requested or narrowed plan)."""
    step.params = clean_json(dict(params))
    step.updated_at = to_datetime(time)
    session.flush()
