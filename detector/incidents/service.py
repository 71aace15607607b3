"""Reads and writes of the incident store; nothing else (no flows, no network, no policy).

Every function takes the session as the keyword-only ``session`` and flushes but never
commits: the caller owns the transaction (Kafka offsets are committed after it). Writes are
idempotent: each insert is ``INSERT ... ON CONFLICT DO NOTHING`` on the table's unique key
(SQLite and PostgreSQL), followed by a read of the row, so a re-delivered record or a re-run
of the same input finds the existing row instead of creating a second one, even when two
sessions race. Times come in as Unix seconds (floats, UTC) from the pure core.

Database failures are raised as ``detector.errors.StoreError`` (the session must then be
rolled back); an unknown stage, evidence kind or timeline kind is a programming error and
raises ``ValueError``.
"""

from __future__ import annotations

import functools
import time as _clock
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session

from detector.correlate.state import Stage
from detector.db import (
    MAX_ID,
    clean_json,
    clean_text,
    get_or_insert,
    insert_ignore,
    store_errors,
    to_datetime,
)
from detector.events.model import SourcePos
from detector.incidents.models import (
    FILE_PARTITION,
    RAW_LIMIT_BYTES,
    DeadLetter,
    Evidence,
    EvidenceKind,
    Incident,
    IncidentPod,
    Question,
    TimelineEntry,
    TimelineKind,
    Verdict,
)

DETAIL_LIMIT_CHARS = 4096  # dead-letter detail is truncated to this length


def _source(source: SourcePos) -> dict[str, Any]:
    """Return the three source columns of a record position (files: partition -1)."""
    partition = FILE_PARTITION if source.partition is None else source.partition
    return {
        "source_origin": source.origin,
        "source_partition": partition,
        "source_position": source.position,
    }


def _touch(incident: Incident, time: float) -> None:
    """Move ``updated_at`` forward to ``time`` (never backward: records arrive late)."""
    when = to_datetime(time)
    if when > incident.updated_at:
        incident.updated_at = when


@store_errors
def get_or_create_incident(
    *,
    session: Session,
    key: str,
    namespace: str,
    workload: str,
    workload_kind: str,
    cluster: str | None,
    stage: str,
    opened_at: float,
) -> Incident:
    """Return the incident with ``key``, creating it when new (an existing one is unchanged)."""
    opened = to_datetime(opened_at)
    values = {
        "key": key,
        "pattern": "gpu_oom_cascade",
        "cluster": cluster,
        "namespace": namespace,
        "workload": workload,
        "workload_kind": workload_kind,
        "stage": Stage(stage).value,
        "opened_at": opened,
        "updated_at": opened,
        "resolved_at": opened if stage == Stage.RESOLVED else None,
    }
    return get_or_insert(session, Incident, values, ["key"])[0]


@store_errors
def set_stage(*, session: Session, incident: Incident, stage: str, time: float) -> bool:
    """Move ``incident`` to ``stage`` at ``time``; return False when it was already there.

    Entering ``resolved`` sets ``resolved_at``; leaving it clears it.
    """
    new = Stage(stage).value
    if incident.stage == new:
        return False
    incident.stage = new
    incident.resolved_at = to_datetime(time) if new == Stage.RESOLVED else None
    _touch(incident, time)
    session.flush()
    return True


@store_errors
def add_victim(*, session: Session, incident: Incident, pod: str, time: float) -> bool:
    """Append ``pod`` to the incident's victims (position = next); False when already there."""
    if session.get(IncidentPod, (incident.id, pod)) is not None:
        return False
    last = session.scalar(
        select(func.coalesce(func.max(IncidentPod.position), 0)).where(
            IncidentPod.incident_id == incident.id
        )
    )
    values = {
        "incident_id": incident.id,
        "pod": pod,
        "position": int(last or 0) + 1,
        "first_oom_at": to_datetime(time),
    }
    if not insert_ignore(session, IncidentPod, values, ["incident_id", "pod"]):
        return False
    session.expire(incident, ["victims"])
    _touch(incident, time)
    return True


@store_errors
def add_evidence(
    *,
    session: Session,
    incident: Incident,
    kind: str,
    pod: str | None,
    time: float,
    source: SourcePos,
    summary: str,
    text: str,
    attrs: Mapping[str, Any],
) -> Evidence:
    """Attach one piece of evidence from the record at ``source``; re-delivery returns the row.

    The unique key is (incident, kind, source origin, partition, position). The same record
    arriving from another source (a copy of a file, a message produced twice) adds nothing
    either: evidence of the same kind, pod, time, text and attrs returns the row kept first.
    """
    values = {
        "incident_id": incident.id,
        "kind": EvidenceKind(kind).value,
        "pod": pod,
        "time": to_datetime(time),
        **_source(source),
        "summary": clean_text(summary),
        "text": clean_text(text),
        "attrs": clean_json(dict(attrs)),
    }
    same = _same_evidence(session, values)
    if same is not None:
        return same
    keys = ["incident_id", "kind", "source_origin", "source_partition", "source_position"]
    row, inserted = get_or_insert(session, Evidence, values, keys)
    if inserted:
        session.expire(incident, ["evidence"])
        _touch(incident, time)
    return row


def _same_evidence(session: Session, values: Mapping[str, Any]) -> Evidence | None:
    """Return the incident's evidence of the same record content as ``values``, or None.

    Looked up on (incident, time) (index ``ix_evidence_incident_time``), then kind, pod, text
    and attrs compared.
    """
    params = {name: values[name] for name in ("incident_id", "time", "kind", "pod", "text")}
    rows = session.scalars(_same_evidence_statement(), params)
    return next((row for row in rows if row.attrs == values["attrs"]), None)


@functools.cache
def _same_evidence_statement() -> Select[Evidence]:
    """Return ``_same_evidence``'s SELECT, built once (a pod that is None matches NULL)."""
    return (
        select(Evidence)
        .where(
            Evidence.incident_id == bindparam("incident_id"),
            Evidence.time == bindparam("time"),
            Evidence.kind == bindparam("kind"),
            Evidence.pod.is_not_distinct_from(bindparam("pod")),
            Evidence.text == bindparam("text"),
        )
        .order_by(Evidence.id)
    )


@store_errors
def find_evidence(*, session: Session, incident: Incident, source: SourcePos) -> Evidence | None:
    """Return the incident's evidence from the record at ``source`` (first by id), or None."""
    stmt = select(Evidence).filter_by(incident_id=incident.id, **_source(source))
    return session.scalars(stmt.order_by(Evidence.id).limit(1)).first()


@store_errors
def add_timeline_entry(
    *,
    session: Session,
    incident: Incident,
    time: float,
    kind: str,
    message: str,
    dedupe_key: str,
    evidence: Evidence | None = None,
    detail: Mapping[str, Any] | None = None,
) -> TimelineEntry | None:
    """Add a timeline entry unless one with ``dedupe_key`` exists; None when it already did.

    ``detail`` is structured data kept with the line (a step's actor, status, diff ...).
    """
    values = {
        "incident_id": incident.id,
        "time": to_datetime(time),
        "kind": TimelineKind(kind).value,
        "message": clean_text(message),
        "evidence_id": evidence.id if evidence is not None else None,
        "dedupe_key": dedupe_key,
        "detail": clean_json(dict(detail)) if detail is not None else None,
    }
    row, inserted = get_or_insert(session, TimelineEntry, values, ["incident_id", "dedupe_key"])
    if not inserted:
        return None
    session.expire(incident, ["timeline"])
    return row


@store_errors
def record_verdict(
    *,
    session: Session,
    cluster: str | None,
    namespace: str,
    workload: str,
    verdict: str,
    reason: str,
    time: float,
    source: SourcePos,
    dedupe_key: str,
) -> Verdict:
    """Record a "not this pattern" verdict once per ``dedupe_key``; return the stored row."""
    values = {
        "cluster": cluster,
        "namespace": namespace,
        "workload": workload,
        "verdict": verdict,
        "reason": clean_text(reason),
        "time": to_datetime(time),
        **_source(source),
        "dedupe_key": dedupe_key,
    }
    return get_or_insert(session, Verdict, values, ["dedupe_key"])[0]


@store_errors
def upsert_question(
    *,
    session: Session,
    incident: Incident,
    qkey: str,
    question: str,
    answer: str | None,
    evidence: Evidence | None,
    to_check: str,
    time: float,
) -> Question:
    """Create or update the incident's question ``qkey``.

    An answer (with its evidence and ``answered_at`` = ``time``) replaces an earlier one; a
    later ``answer=None`` never erases an answer already found.
    """
    clean_answer = clean_text(answer) if answer is not None else None
    evidence_id = evidence.id if evidence is not None else None
    answered_at = to_datetime(time) if answer is not None else None
    values = {
        "incident_id": incident.id,
        "qkey": qkey,
        "question": question,
        "answer": clean_answer,
        "evidence_id": evidence_id,
        "to_check": to_check,
        "answered_at": answered_at,
    }
    row, inserted = get_or_insert(session, Question, values, ["incident_id", "qkey"])
    if inserted:
        session.expire(incident, ["questions"])
        return row
    row.question = question
    row.to_check = to_check
    if clean_answer is not None and (row.answer, row.evidence_id) != (clean_answer, evidence_id):
        row.answer = clean_answer
        row.evidence_id = evidence_id
        row.answered_at = answered_at
    session.flush()
    return row


@store_errors
def add_dead_letter(
    *,
    session: Session,
    source: SourcePos,
    reason: str,
    detail: str,
    raw: bytes,
    time: float | None = None,
) -> DeadLetter | None:
    """Keep a record that could not be processed; None when its source position is stored.

    ``raw`` is truncated to 64 KiB (``raw_size_bytes`` keeps the original size) and
    ``detail`` to 4096 characters. ``time`` (Unix seconds) stamps ``created_at``; the wall
    clock when omitted.
    """
    values = {
        **_source(source),
        "reason": clean_text(reason)[:255],
        "detail": clean_text(detail)[:DETAIL_LIMIT_CHARS],
        "raw": bytes(raw[:RAW_LIMIT_BYTES]),
        "raw_size_bytes": len(raw),
        "created_at": to_datetime(_clock.time() if time is None else time),
    }
    keys = ["source_origin", "source_partition", "source_position"]
    row, inserted = get_or_insert(session, DeadLetter, values, keys)
    return row if inserted else None


@store_errors
def list_incidents(*, session: Session) -> list[Incident]:
    """Return all incidents, newest opened first."""
    return list(session.scalars(select(Incident).order_by(Incident.opened_at.desc(), Incident.id)))


@store_errors
def list_verdicts(*, session: Session) -> list[Verdict]:
    """Return all verdicts, newest first."""
    return list(session.scalars(select(Verdict).order_by(Verdict.time.desc(), Verdict.id)))


@store_errors
def get_incident(*, session: Session, incident_id: int) -> Incident | None:
    """Return the incident with ``incident_id``, or None (also for an id no row can have:
    under 1 or over the 64-bit column's range, which the store would refuse with an error)."""
    if not 1 <= incident_id <= MAX_ID:
        return None
    return session.get(Incident, incident_id)


@store_errors
def get_incident_by_key(*, session: Session, key: str) -> Incident | None:
    """Return the incident with ``key``, or None."""
    return session.scalars(select(Incident).where(Incident.key == key)).one_or_none()


@store_errors
def timeline(*, session: Session, incident: Incident) -> list[TimelineEntry]:
    """Return the incident's timeline ordered by (time, id)."""
    stmt = (
        select(TimelineEntry)
        .where(TimelineEntry.incident_id == incident.id)
        .order_by(TimelineEntry.time, TimelineEntry.id)
    )
    return list(session.scalars(stmt))


@store_errors
def list_dead_letters(*, session: Session, limit: int = 100) -> list[DeadLetter]:
    """Return the most recent dead letters, newest first, at most ``limit``."""
    stmt = select(DeadLetter).order_by(DeadLetter.created_at.desc(), DeadLetter.id.desc())
    return list(session.scalars(stmt.limit(limit)))


@store_errors
def count_dead_letters(*, session: Session) -> int:
    """Return the number of dead letters stored."""
    return int(session.scalar(select(func.count()).select_from(DeadLetter)) or 0)
