"""Load the read model's incidents and verdicts from the store (reads only)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from detector.db import store_errors
from detector.incidents import service
from detector.incidents.models import Incident, Verdict
from detector.incidents.schemas import VerdictOut
from detector.report.schemas import IncidentOut


@store_errors
def load_incidents(*, session: Session, keys: Sequence[str] | None = None) -> list[IncidentOut]:
    """Return the incidents with ``keys`` in that order (None: every incident, by id).

    Raises StoreError.
    """
    if keys is None:
        rows = service.list_incidents(session=session)
    else:
        found = {i.key: i for i in session.scalars(select(Incident).where(Incident.key.in_(keys)))}
        rows = [found[k] for k in keys if k in found]
    return [IncidentOut.model_validate(row) for row in rows]


@store_errors
def load_verdicts(*, session: Session, dedupe_keys: Sequence[str]) -> list[VerdictOut]:
    """Return the verdicts with ``dedupe_keys`` in that order; raises StoreError."""
    stmt = select(Verdict).where(Verdict.dedupe_key.in_(dedupe_keys))
    found = {v.dedupe_key: v for v in session.scalars(stmt)}
    return [VerdictOut.model_validate(found[k]) for k in dedupe_keys if k in found]


@store_errors
def load_incident(*, session: Session, ref: str) -> IncidentOut | None:
    """Return the incident with key ``ref``, or numeric id ``ref``; None when there is none.

    Raises StoreError.
    """
    incident = service.get_incident_by_key(session=session, key=ref)
    if incident is None and ref.isascii() and ref.isdigit():
        incident = service.get_incident(session=session, incident_id=int(ref))
    return IncidentOut.model_validate(incident) if incident is not None else None
