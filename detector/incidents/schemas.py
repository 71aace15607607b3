"""Pydantic "out" models of the incident store, read from the ORM rows (``from_attributes``).

The read model (``detector.report``) composes them with the runbook's
(``detector.runbooks.schemas``) into one incident document, read inside the session that
loaded the rows (relationships load lazily). Times are
timezone-aware UTC datetimes (ISO 8601 ending in ``Z`` in JSON); a source position is its
``str(SourcePos)`` form (``path:line`` or ``topic[partition]@offset``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict


class Out(BaseModel):
    """Base of the out models: read from attributes, immutable."""

    model_config = ConfigDict(from_attributes=True, frozen=True)


def _source_str(value: Any) -> Any:
    return value if isinstance(value, str) else str(value)


# A detector.events.model.SourcePos, shown as text.
SourceText = Annotated[str, BeforeValidator(_source_str)]


class VictimOut(Out):
    """A victim pod in order of failure (``position`` is 1-based)."""

    pod: str
    position: int
    first_oom_at: datetime


class EvidenceOut(Out):
    """One piece of evidence: its summary, the original record's text and the parsed figures."""

    id: int
    kind: str
    pod: str | None
    time: datetime
    summary: str
    source: SourceText
    text: str = ""
    attrs: dict[str, Any] = {}


class TimelineEntryOut(Out):
    """One timeline line; ``detail`` is a step's structured entry (actor, status, diff ...)
    or, on a ``contained`` stage entry of the read model, who contained the incident
    (``detector.report.recovery.Recovery.as_detail``)."""

    id: int
    time: datetime
    kind: str
    message: str
    evidence_id: int | None
    detail: dict[str, Any] | None = None


class QuestionOut(Out):
    """An on-call question, its answer when the evidence gives one, and what to check."""

    qkey: str
    question: str
    answer: str | None
    evidence_id: int | None
    to_check: str
    answered_at: datetime | None


class IncidentSummaryOut(Out):
    """An incident without its children, for lists."""

    id: int
    key: str
    pattern: str
    cluster: str | None
    namespace: str
    workload: str
    workload_kind: str
    stage: str
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None


class VerdictOut(Out):
    """A recorded "not this pattern" verdict."""

    id: int
    cluster: str | None
    namespace: str
    workload: str
    verdict: str
    reason: str
    time: datetime
    source: SourceText


class DeadLetterOut(Out):
    """A dead letter without its raw bytes (``raw_size_bytes`` gives their original size)."""

    id: int
    source: SourceText
    reason: str
    detail: str
    raw_size_bytes: int
    created_at: datetime
