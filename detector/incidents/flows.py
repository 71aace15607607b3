"""Apply the correlator's decisions to the incident store; plan runbooks; answer questions.

The one place that crosses domains: correlate -> incidents -> runbooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

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
from detector.incidents import service
from detector.incidents.context import IncidentContext
from detector.incidents.models import Evidence, Incident, Verdict
from detector.incidents.questions import answer_questions
from detector.runbooks.definition import Runbook
from detector.runbooks.planner import plan

ContextLookup = Callable[[str], IncidentContext | None]


@dataclass
class IncidentFlows:
    """Record decisions in the store, within the caller's transaction."""

    runbook: Runbook
    dry_run: bool = True
    incidents: dict[str, Incident] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    _planned: set[str] = field(default_factory=set)

    def apply(
        self, decisions: list[Decision], *, session: Session, contexts: ContextLookup
    ) -> None:
        """Write each decision; plan containment when an incident starts cascading."""
        for d in decisions:
            if isinstance(d, VerdictRecorded):
                self.verdicts[d.dedupe_key] = service.record_verdict(
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
                continue
            incident = self._incident(d, session)
            if isinstance(d, StageChanged):
                self._stage(incident, d, session, contexts)
            elif isinstance(d, VictimAdded):
                self._victim(incident, d, session, contexts)
            elif isinstance(d, EvidenceAdded):
                self._evidence(incident, d, session)

    def finish(self, *, session: Session, contexts: ContextLookup) -> None:
        """Answer the investigation questions of every incident touched in this run."""
        for key, incident in self.incidents.items():
            ctx = contexts(key)
            if ctx is not None:
                self._answer(incident, ctx, session)

    def _incident(self, d: Decision, session: Session) -> Incident:
        key = d.key  # type: ignore[union-attr]
        incident = self.incidents.get(key)
        if incident is not None:
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
        self._note(session, incident, d.time, "note", f"{PATTERN} incident opened for "
                   f"{d.workload.label}", "opened")  # fmt: skip
        return incident

    def _stage(
        self, incident: Incident, d: StageChanged, session: Session, contexts: ContextLookup
    ) -> None:
        service.set_stage(session=session, incident=incident, stage=d.stage.value, time=d.time)
        self._note(session, incident, d.time, "stage", f"stage -> {d.stage.value}: {d.reason}",
                   f"stage:{d.stage.value}:{int(d.time)}")  # fmt: skip
        ctx = contexts(d.key)
        if ctx is None:
            return
        if d.stage is Stage.CASCADING and d.key not in self._planned:
            self._planned.add(d.key)
            self._plan(incident, ctx, d.time, session)
        self._answer(incident, ctx, session)

    def _victim(
        self, incident: Incident, d: VictimAdded, session: Session, contexts: ContextLookup
    ) -> None:
        service.add_victim(session=session, incident=incident, pod=d.pod, time=d.time)
        message = f"victim #{d.position}: pod {d.pod} died of GPU OOM"
        self._note(session, incident, d.time, "signal", message, f"victim:{d.pod}")
        ctx = contexts(d.key)  # re-run or not, the plan follows the same decisions
        if d.key in self._planned and ctx is not None:  # the restart list grows with victims
            self._plan(incident, ctx, d.time, session)
            message = f"runbook re-planned for {d.position} victims"
            self._note(session, incident, d.time, "step", message, f"replan:{d.position}")

    def _evidence(self, incident: Incident, d: EvidenceAdded, session: Session) -> None:
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
            attrs=_jsonable(s.attrs),
        )
        self._note(session, incident, s.time, "signal", f"{d.kind}: {d.summary}",
                   f"evidence:{d.kind}:{s.source}", evidence=row)  # fmt: skip

    def _plan(
        self, incident: Incident, ctx: IncidentContext, time: float, session: Session
    ) -> None:
        mode = "dry_run" if self.dry_run else "live"
        run = service.get_or_create_run(
            session=session,
            incident=incident,
            runbook=self.runbook.name,
            version=str(self.runbook.version),
            mode=mode,
            time=time,
        )
        for step in plan(self.runbook, ctx, dry_run=self.dry_run):
            service.upsert_step(
                session=session,
                run=run,
                position=step.position,
                action=step.action,
                title=step.title,
                status=step.status,
                params=_jsonable(step.params),
                approval=step.approval,
                time=time,
            )
            self._note(session, incident, time, "step", f"step {step.position} "
                       f"{step.action} {step.status}: {step.title}",
                       f"step:{step.position}:planned")  # fmt: skip

    def _answer(self, incident: Incident, ctx: IncidentContext, session: Session) -> None:
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

    @staticmethod
    def _note(
        session: Session,
        incident: Incident,
        time: float,
        kind: str,
        message: str,
        dedupe_key: str,
        evidence: Evidence | None = None,
    ) -> None:
        service.add_timeline_entry(
            session=session,
            incident=incident,
            time=time,
            kind=kind,
            message=message[:1000],
            dedupe_key=dedupe_key,
            evidence=evidence,
        )


def _jsonable(value: Any) -> Any:
    """Return ``value`` with tuples/sets turned into lists and other objects into strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
