"""The incident list of the read model: one summary row per incident, without its children.

For the web list and ``/api/incidents``: the incident's fields, its victims counted, and its
steps waiting for a person (pending approvals that have not expired by the wall clock). Two
queries in all, whatever the number of incidents or timeline entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detector.db import store_errors
from detector.incidents.models import Incident, IncidentPod
from detector.runbooks.models import StepApproval

OPEN_STAGES = ("suspected", "cascading", "contained")


@dataclass(frozen=True, slots=True)
class IncidentRow:
    """One incident of the list: ``waiting`` are the positions of steps awaiting a person."""

    id: int
    key: str
    namespace: str
    workload: str
    workload_kind: str
    stage: str
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    victims: int
    waiting: tuple[int, ...]

    @property
    def open(self) -> bool:
        """Return True while the incident is not resolved."""
        return self.stage in OPEN_STAGES


@store_errors
def list_incidents(
    *,
    session: Session,
    stage: str | None = None,
    namespace: str | None = None,
    since: datetime | None = None,
    limit: int = 500,
    now: datetime | None = None,
) -> list[IncidentRow]:
    """Return incident rows, open ones first, then by opening time (newest first).

    ``stage``/``namespace`` filter exactly; ``since`` keeps incidents updated at or after it.
    Raises StoreError.
    """
    victims = (
        select(IncidentPod.incident_id, func.count().label("n"))
        .group_by(IncidentPod.incident_id)
        .subquery()
    )
    stmt = select(Incident, func.coalesce(victims.c.n, 0)).outerjoin(
        victims, victims.c.incident_id == Incident.id
    )
    if stage:
        stmt = stmt.where(Incident.stage == stage)
    if namespace:
        stmt = stmt.where(Incident.namespace == namespace)
    if since is not None:
        stmt = stmt.where(Incident.updated_at >= since)
    stmt = stmt.order_by(Incident.opened_at.desc(), Incident.id.desc()).limit(limit)
    rows = list(session.execute(stmt))
    waiting = _waiting(session, [i.id for i, _ in rows], now or datetime.now(UTC))
    out = [
        IncidentRow(
            i.id,
            i.key,
            i.namespace,
            i.workload,
            i.workload_kind,
            i.stage,
            i.opened_at,
            i.updated_at,
            i.resolved_at,
            int(n),
            tuple(sorted(waiting.get(i.id, ()))),
        )
        for i, n in rows
    ]
    return sorted(out, key=lambda r: not r.open)  # stable: open first, newest first within


def _waiting(session: Session, ids: list[int], now: datetime) -> dict[int, list[int]]:
    if not ids:
        return {}
    stmt = select(StepApproval.incident_id, StepApproval.position, StepApproval.expires_at).where(
        StepApproval.incident_id.in_(ids), StepApproval.status == "pending"
    )
    found: dict[int, list[int]] = {}
    for incident_id, position, expires in session.execute(stmt):
        if expires is None or expires > now:
            found.setdefault(incident_id, []).append(position)
    return found
