"""A person's say on an incident's lifecycle: acknowledge, resolve with a reason, snooze.

Each is a timeline entry (the audit: who, via which face, when, why, in ``detail``) written in
the caller's transaction by the one decide flow (``detector.runbooks.flows.decide``), after
the same allow-list check as an approval. ``detail["lifecycle"]`` names the act:

- ``acknowledged``: "I'm on it" (dedupe ``ack:<time>:<who>``; PagerDuty's acknowledge);
- ``resolved``: the incident is resolved now with the person's reason (a ``stage`` entry,
  ``stage:resolved:by:<time>``; PagerDuty's resolve). The detector keeps watching: a new
  victim, or a new ``cascading``, reopens it (``reopen``: a ``stage`` entry ``reopened``);
- ``snoozed``: Slack's thread holds its replies for N minutes (``snoozed_until``); the
  timeline keeps everything and the thread tells it when the snooze ends.

Each first holds the incident's row (``_hold``): decisions on one incident take turns, so
two people pressing Acknowledge at once record one acknowledgement. Refusals
(``ApprovalError``, nothing changed): ``forbidden`` (not on the allow-list),
``conflict`` (resolved already; acknowledged already since it last opened), ``invalid`` (no
reason to resolve, minutes out of 1..``MAX_SNOOZE_MIN``).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from detector.correlate.state import Stage
from detector.errors import ApprovalError
from detector.incidents import service
from detector.incidents.models import Incident, TimelineEntry

MAX_SNOOZE_MIN = 24 * 60
MAX_REASON_CHARS = 500


class Lifecycle(StrEnum):
    """What a lifecycle entry records (``detail["lifecycle"]``)."""

    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"
    SNOOZED = "snoozed"
    REOPENED = "reopened"


def check_allowed(actor: str, approvers: Collection[str]) -> None:
    """Refuse (``forbidden``) someone not on the approver allow-list."""
    if not approvers:
        raise ApprovalError("forbidden", "no approvers configured: set "
                            "DETECTOR_CONTAINMENT__APPROVERS")  # fmt: skip
    if not actor or actor not in approvers:
        raise ApprovalError("forbidden", f"{actor!r} is not on the approver allow-list")


def acknowledge(
    *, session: Session, incident: Incident, actor: str, via: str, time: float
) -> TimelineEntry:
    """Record that ``actor`` acknowledged the incident; raises ApprovalError(``conflict``)."""
    _hold(session, incident)
    _require_open(incident)
    found = latest(session, incident, Lifecycle.ACKNOWLEDGED)
    opened = latest(session, incident, Lifecycle.REOPENED)
    if found is not None and (opened is None or opened.id < found.id):
        raise ApprovalError("conflict", f"already acknowledged by {_by(found)}; nothing changed")
    message = f"acknowledged by {actor} via {via}"
    return _entry(session, incident, time, "note", message, f"ack:{int(time)}:{actor}",
                  Lifecycle.ACKNOWLEDGED, actor, via)  # fmt: skip


def resolve(
    *, session: Session, incident: Incident, actor: str, via: str, reason: str, time: float
) -> TimelineEntry:
    """Resolve the incident now with ``reason``; raises ApprovalError(``conflict``,
    ``invalid``)."""
    _hold(session, incident)
    _require_open(incident)
    why = " ".join(reason.split())[:MAX_REASON_CHARS]
    if not why:
        raise ApprovalError("invalid", "resolving needs a reason; nothing changed")
    previous = incident.stage
    service.set_stage(session=session, incident=incident, stage=Stage.RESOLVED.value, time=time)
    message = f"stage -> resolved: resolved by {actor} via {via}: {why}"
    return _entry(session, incident, time, "stage", message, f"stage:resolved:by:{int(time)}",
                  Lifecycle.RESOLVED, actor, via, reason=why,
                  previous_stage=previous)  # fmt: skip


def snooze(
    *, session: Session, incident: Incident, actor: str, via: str, minutes: int, time: float
) -> TimelineEntry:
    """Hold the incident's Slack replies for ``minutes``; raises ApprovalError(``conflict``,
    ``invalid``)."""
    _hold(session, incident)
    _require_open(incident)
    if not 1 <= minutes <= MAX_SNOOZE_MIN:
        raise ApprovalError("invalid", f"snooze for 1 to {MAX_SNOOZE_MIN} minutes; "
                            "nothing changed")  # fmt: skip
    until = datetime.fromtimestamp(time + minutes * 60, UTC)
    message = (f"notifications snoozed for {minutes} min by {actor} via {via} "
               f"(until {until:%H:%M} UTC)")  # fmt: skip
    return _entry(session, incident, time, "note", message, f"snooze:{int(time)}:{actor}",
                  Lifecycle.SNOOZED, actor, via, until=until.isoformat(),
                  minutes=minutes)  # fmt: skip


def snoozed_until(session: Session, incident: Incident) -> datetime | None:
    """Return when the incident's latest snooze ends (None: never snoozed)."""
    found = latest(session, incident, Lifecycle.SNOOZED)
    if found is None or not found.detail:
        return None
    return datetime.fromisoformat(str(found.detail["until"]))


def reopen(*, session: Session, incident: Incident, why: str, victims: int, time: float) -> bool:
    """Reopen an incident a person resolved (a new victim, a new ``cascading``); return True
    when it was. Its stage: ``cascading`` with two victims or more, else ``suspected``."""
    resolved = latest(session, incident, Lifecycle.RESOLVED)
    if resolved is None or not resolved_by_person(session, incident):
        return False  # open, or resolved by the detector itself
    stage = Stage.CASCADING if victims >= 2 else Stage.SUSPECTED
    service.set_stage(session=session, incident=incident, stage=stage.value, time=time)
    message = f"stage -> {stage.value}: reopened: {why} after {_by(resolved)} resolved it"
    _entry(session, incident, time, "stage", message, f"stage:{stage.value}:reopened:{int(time)}",
           Lifecycle.REOPENED, "detector", "detector")  # fmt: skip
    return True


def resolved_by_person(session: Session, incident: Incident) -> bool:
    """Return True when the incident is resolved and a person resolved it last."""
    if incident.resolved_at is None:
        return False
    last = session.scalars(
        select(TimelineEntry)
        .where(TimelineEntry.incident_id == incident.id, TimelineEntry.kind == "stage")
        .order_by(TimelineEntry.id.desc())
        .limit(1)
    ).first()
    return last is not None and (last.detail or {}).get("lifecycle") == Lifecycle.RESOLVED


def latest(session: Session, incident: Incident, act: Lifecycle) -> TimelineEntry | None:
    """Return the incident's latest lifecycle entry of ``act`` (by id), or None."""
    prefix = {
        Lifecycle.ACKNOWLEDGED: "ack:%",
        Lifecycle.RESOLVED: "stage:resolved:by:%",
        Lifecycle.SNOOZED: "snooze:%",
        Lifecycle.REOPENED: "stage:%:reopened:%",
    }[act]
    stmt = (
        select(TimelineEntry)
        .where(TimelineEntry.incident_id == incident.id, TimelineEntry.dedupe_key.like(prefix))
        .order_by(TimelineEntry.id.desc())
        .limit(1)
    )
    return session.scalars(stmt).first()


def _hold(session: Session, incident: Incident) -> None:
    """Take the incident's row for this transaction, then read it again: an UPDATE that
    changes nothing holds the row lock on PostgreSQL and the write lock on SQLite, so two
    people deciding at once take turns and the second sees what the first recorded."""
    session.execute(
        update(Incident)
        .where(Incident.id == incident.id)
        .values(updated_at=Incident.updated_at)
        .execution_options(synchronize_session=False)
    )
    session.refresh(incident)


def _require_open(incident: Incident) -> None:
    if incident.resolved_at is not None:
        raise ApprovalError("conflict", f"incident {incident.key!r} is resolved; nothing changed")


def _by(entry: TimelineEntry) -> str:
    detail = entry.detail or {}
    return f"{detail.get('by', '?')} via {detail.get('via', '?')}"


def _entry(
    session: Session,
    incident: Incident,
    time: float,
    kind: str,
    message: str,
    dedupe_key: str,
    act: Lifecycle,
    actor: str,
    via: str,
    **more: Any,
) -> TimelineEntry:
    detail = {"lifecycle": act.value, "by": actor, "via": via, **more}
    row = service.add_timeline_entry(session=session, incident=incident, time=time, kind=kind,
                                     message=message[:1000], dedupe_key=dedupe_key,
                                     detail=detail)  # fmt: skip
    if row is None:  # the same person, the same second: the first stands
        raise ApprovalError("conflict", "the same decision was just recorded; nothing changed")
    return row
