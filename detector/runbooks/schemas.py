"""Pydantic "out" models of runbook runs, steps and approvals, read from the ORM rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from detector.incidents.schemas import Out


class ApprovalOut(Out):
    """The approval of one step: ``pending``, ``approved``, ``denied`` or ``expired``."""

    step_id: str
    position: int
    policy: str
    approver_group: str | None
    status: str
    requested_at: datetime
    expires_at: datetime | None
    decided_at: datetime | None
    decided_by: str | None
    via: str | None
    reason: str
    plan_digest: str | None = None
    decided_event_at: datetime | None = None


class StepOut(Out):
    """One runbook step and its state."""

    position: int
    action: str
    title: str
    status: str
    params: dict[str, Any]
    approval: str
    result: dict[str, Any] | None
    updated_at: datetime


class RunOut(Out):
    """One runbook run with its steps in order."""

    id: int
    runbook: str
    version: str
    mode: str
    status: str
    created_at: datetime
    steps: list[StepOut]
