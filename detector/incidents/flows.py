"""Record the correlator's decisions in the incident store and answer the on-call questions.

``IncidentRecorder.record(decision, ...)`` writes one decision (incident, stage, victim,
evidence or verdict) with its timeline entry, within the caller's transaction, and returns
the incident row it touched (None for a verdict). It knows nothing of runbooks: planning and
containment follow in ``detector.runbooks.flows``, composed by ``detector.pipeline``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import case
from sqlalchemy.orm import Session

from detector.correlate.context import IncidentContext
from detector.correlate.series import SeriesPoint
from detector.correlate.state import (
    PATTERN,
    Decision,
    EvidenceAdded,
    IncidentOpened,
    Stage,
    StageChanged,
    VerdictRecorded,
    VictimAdded,
)
from detector.db import greatest, store_errors, to_datetime, upsert
from detector.incidents import lifecycle, service
from detector.incidents.models import Evidence, EvidenceKind, Incident, SeriesValue
from detector.incidents.questions import answer_questions

ContextLookup = Callable[[str], IncidentContext | None]
# evidence that is a forecast, not a signal: its summary is the whole timeline line
# ("next victim at risk: pod X in ~N s"), a note, which the incident's Slack thread tells
FORECAST_KINDS = frozenset({EvidenceKind.NEXT_VICTIM.value})


class SeriesSource(Protocol):
    """Where incidents' time series come from (``detector.correlate.correlator.Correlator``)."""

    @property
    def series_version(self) -> int:
        """Return the series' change counter."""
        ...

    def series(self, key: str, *, since: int = 0) -> list[SeriesPoint]:
        """Return incident ``key``'s points in buckets changed after version ``since``."""
        ...


@dataclass
class IncidentRecorder:
    """Write decisions to the store; cache the rows of the incidents the correlator still holds.

    ``incidents`` maps an incident key to its row while the correlator has a view of it
    (``forget_settled`` drops the others), so the cache is bounded like the correlator's state.
    """

    incidents: dict[str, Incident] = field(default_factory=dict)
    series_written: dict[str, int] = field(default_factory=dict)  # key -> series version written

    def record(self, d: Decision, *, session: Session, contexts: ContextLookup) -> Incident | None:
        """Write one decision and its timeline entry; return the incident (None: a verdict)."""
        if isinstance(d, VerdictRecorded):
            record_verdict(d, session=session)
            return None
        if isinstance(d, IncidentOpened):
            self.forget_settled(contexts)  # keeps the cache as small as the correlator's
        incident = self._incident(d, session)
        if isinstance(d, StageChanged) and lifecycle.resolved_by_person(session, incident):
            # a person resolved it: the detector's contained/resolved add nothing; a new
            # cascade reopens it
            if d.stage is Stage.CASCADING:
                lifecycle.reopen(session=session, incident=incident, why=d.reason,
                                 victims=len(incident.victims), time=d.time)  # fmt: skip
        elif isinstance(d, StageChanged):
            service.set_stage(session=session, incident=incident, stage=d.stage.value, time=d.time)
            note(session, incident, d.time, "stage", f"stage -> {d.stage.value}: {d.reason}",
                 f"stage:{d.stage.value}:{int(d.time)}")  # fmt: skip
            ctx = contexts(d.key)
            if ctx is not None:
                answer(incident, ctx, session=session)
        elif isinstance(d, VictimAdded):
            added = service.add_victim(session=session, incident=incident, pod=d.pod, time=d.time)
            message = f"victim #{d.position}: pod {d.pod} died of GPU OOM"
            note(session, incident, d.time, "signal", message, f"victim:{d.pod}")
            if added:  # a person's resolve does not outlive a new death
                lifecycle.reopen(session=session, incident=incident, victims=d.position,
                                 why=f"pod {d.pod} died of GPU OOM", time=d.time)  # fmt: skip
        elif isinstance(d, EvidenceAdded):
            _evidence(incident, d, session)
        return incident

    def forget_settled(self, contexts: ContextLookup) -> None:
        """Drop the rows of incidents the correlator no longer holds."""
        for key in [k for k in self.incidents if contexts(k) is None]:
            del self.incidents[key]
            self.series_written.pop(key, None)

    def record_series(self, incident: Incident, source: SeriesSource, *, session: Session) -> int:
        """Write the incident's series buckets changed since the last write; return the rows.

        Idempotent (``write_series``); the first write of a process sends every bucket held.
        """
        key, version = incident.key, source.series_version
        since = self.series_written.get(key, 0)
        if since == version:
            return 0
        points = source.series(key, since=since)
        write_series(incident, points, session=session)
        self.series_written[key] = version
        return len(points)

    def _incident(self, d: Decision, session: Session) -> Incident:
        key = d.key  # type: ignore[union-attr]
        incident = self.incidents.get(key)
        if incident is None and not isinstance(d, IncidentOpened):
            incident = service.get_incident_by_key(session=session, key=key)
        if incident is not None:
            self.incidents[key] = incident
            return incident
        assert isinstance(d, IncidentOpened), f"decision for unknown incident {key}"
        incident = service.get_or_create_incident(
            session=session,
            key=key,
            namespace=d.workload.namespace,
            workload=d.workload.name,
            workload_kind=d.workload.kind,
            cluster=d.workload.cluster,
            stage=Stage.SUSPECTED.value,
            opened_at=d.time,
        )
        self.incidents[key] = incident
        note(session, incident, d.time, "note", f"{PATTERN} incident opened for "
             f"{d.workload.label}", "opened")  # fmt: skip
        return incident


@store_errors
def write_series(incident: Incident, points: list[SeriesPoint], *, session: Session) -> None:
    """Upsert ``points`` as the incident's ``incident_series`` rows (one per metric, label and
    bucket): a stored value is kept when larger (the values of a bucket only grow, so a
    re-read of part of a bucket never lowers it), unless the detail changed (a pod's bucket
    moved from GPU memory to KV cache). Raises StoreError.
    """
    rows = [
        {
            "incident_id": incident.id,
            "time": to_datetime(p.time),
            "metric": p.metric,
            "label": p.label[:255],
            "value": p.value,
            "detail": p.detail[:32],
        }
        for p in points
    ]
    upsert(session, SeriesValue, rows, ("incident_id", "metric", "label", "time"), _grown)


def _grown(new: Any) -> dict[str, Any]:
    """Return ``write_series``'s SET clause: the larger value, or the new one of a new detail."""
    stored = SeriesValue.__table__.c
    grown = greatest(stored.value, new.value)
    value = case((stored.detail == new.detail, grown), else_=new.value)
    return {"value": value, "detail": new.detail}


def record_verdict(d: VerdictRecorded, *, session: Session) -> None:
    """Store a "not this pattern" verdict (idempotent on its dedupe key)."""
    service.record_verdict(
        session=session,
        cluster=d.workload.cluster,
        namespace=d.workload.namespace,
        workload=d.workload.name,
        verdict=d.verdict,
        reason=d.reason,
        time=d.time,
        source=d.source,
        dedupe_key=d.dedupe_key,
    )


def _evidence(incident: Incident, d: EvidenceAdded, session: Session) -> None:
    s = d.signal
    row = service.add_evidence(
        session=session,
        incident=incident,
        kind=d.kind,
        pod=s.pod,
        time=s.time,
        source=s.source,
        summary=d.summary,
        text=s.text,
        attrs=jsonable(s.attrs),
    )
    if d.kind in FORECAST_KINDS:
        kind, message = "note", d.summary
    else:
        kind, message = "signal", f"{d.kind}: {d.summary}"
    note(session, incident, s.time, kind, message, f"evidence:{d.kind}:{row.source}",
         evidence=row)  # fmt: skip


def answer(incident: Incident, ctx: IncidentContext, *, session: Session) -> None:
    """Store the answers of the on-call questions from the incident's evidence so far."""
    for ans in answer_questions(ctx):
        evidence = None
        if ans.evidence is not None:
            evidence = service.find_evidence(session=session, incident=incident,
                                             source=ans.evidence)  # fmt: skip
        service.upsert_question(
            session=session,
            incident=incident,
            qkey=ans.qkey,
            question=ans.question,
            answer=ans.answer,
            evidence=evidence,
            to_check=ans.to_check,
            time=ctx.signals[-1].time if ctx.signals else ctx.opened_at,
        )


def note(
    session: Session,
    incident: Incident,
    time: float,
    kind: str,
    message: str,
    dedupe_key: str,
    evidence: Evidence | None = None,
) -> None:
    """Add a timeline entry (message cut to 1000 characters; idempotent on ``dedupe_key``)."""
    service.add_timeline_entry(
        session=session,
        incident=incident,
        time=time,
        kind=kind,
        message=message[:1000],
        dedupe_key=dedupe_key,
        evidence=evidence,
    )


def decision_time(d: Decision) -> float:
    """Return the event time of a decision (an evidence decision: its signal's)."""
    return d.signal.time if isinstance(d, EvidenceAdded) else d.time


def jsonable(value: Any) -> Any:
    """Return ``value`` with tuples/sets turned into lists and other objects into strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
