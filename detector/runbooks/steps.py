"""What the incident store keeps about each containment step: its state, record and approval.

Pure data. ``StepRecord`` is stored as JSON in ``RunbookStep.result``; the step machine
(:mod:`detector.runbooks.transitions`) moves it forward, and the reports read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class StepState(StrEnum):
    """Where one step is in its life (see :mod:`detector.runbooks.transitions`)."""

    PLANNED = "planned"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    APPLYING = "applying"  # staggered restarts in progress
    VERIFYING = "verifying"
    VERIFIED = "verified"
    ESCALATED = "escalated"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    DENIED = "denied"
    EXPIRED = "expired"
    NOT_NEEDED = "not_needed"
    LIFTING = "lifting"
    LIFTED = "lifted"
    WITHDRAWN = "withdrawn"  # its precondition no longer held before it acted


class ApprovalStatus(StrEnum):
    """The state of one step's approval; only ``pending`` may change."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"  # the step stopped waiting: its precondition no longer holds


@dataclass(frozen=True, slots=True)
class Approval:
    """A stored approval decision of one step, as the step machine reads it."""

    status: str
    by: str | None = None
    via: str | None = None
    reason: str = ""
    event_at: float | None = None  # the event time the detector had reached at the decision


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What happened to one step so far (times in Unix seconds, event time).

    ``outcome`` decides the next step's turn: ``failed`` (its turn), ``passed`` or
    ``not_needed`` (not needed). ``since`` is the time of the last move. ``params`` and
    ``plan`` are what the first apply used and changed (``Plan.as_record()``: a rollback or a
    removal reverts it); ``current`` is the plan record of the latest change (a lift's);
    ``baseline`` the evidence's ``Health`` at the first apply; ``restarts`` the pods restarted
    so far ({pod, at}); ``in_place`` whether the change is in force; ``blocked`` the code of
    the rail that holds the step (kill_switch, cap, cooldown); ``intent`` the plan of the
    first live apply as committed before the actuator was called (write-ahead: its
    ``before`` is the target as it was before the incident touched it, whatever a crash
    between the call and its record left there).
    """

    state: str = StepState.PLANNED.value
    outcome: str | None = None
    since: float | None = None
    reason: str = ""
    mode: str | None = None  # dry_run | live, fixed by the first actuator call
    approval: dict[str, Any] | None = None
    expires_at: float | None = None
    params: dict[str, str] | None = None
    plan: dict[str, Any] | None = None
    current: dict[str, Any] | None = None
    applied_at: float | None = None
    deadline_at: float | None = None
    baseline: dict[str, Any] | None = None
    verification: dict[str, Any] | None = None
    restarts: tuple[dict[str, Any], ...] = ()
    in_place: bool = False
    lift_level: int = 0
    lift_at: float | None = None
    blocked: str | None = None
    intent: dict[str, Any] | None = None

    def as_record(self) -> dict[str, Any]:
        """Return the record as JSON-ready data."""
        data = asdict(self)
        data["restarts"] = list(self.restarts)
        return data

    @classmethod
    def from_record(cls, data: Mapping[str, Any] | None) -> StepRecord:
        """Rebuild a record from ``as_record`` data (None, or no ``state``: a fresh record)."""
        if not data or "state" not in data:
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["restarts"] = tuple(known.get("restarts") or ())
        return cls(**known)
