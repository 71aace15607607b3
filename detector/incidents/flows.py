"""Apply the correlator's decisions to the incident store; plan and run runbooks; answer questions.

The one place that crosses domains: correlate -> incidents -> runbooks. An incident that
starts cascading gets its runbook planned; from then on, after every batch of decisions that
touches it and at every ``finish``, the step engine advances its steps at the event time
reached (:mod:`detector.runbooks.runner`), so replay and the live loop both run it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.orm import Session

from detector.config import Settings
from detector.correlate.context import IncidentContext
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
from detector.incidents.models import Evidence, Incident, RunbookRun, RunbookStep, Verdict
from detector.incidents.questions import answer_questions
from detector.runbooks.bindings.base import StepActuator
from detector.runbooks.definition import Runbook
from detector.runbooks.planner import plan
from detector.runbooks.runner import Containment, advance, settled
from detector.runbooks.steps import StepRecord, StepState
from detector.runbooks.transitions import plan_text

ContextLookup = Callable[[str], IncidentContext | None]


@dataclass
class IncidentFlows:
    """Record decisions in the store and run containment, within the caller's transaction.

    ``dry_run`` is the process-wide switch: while True nothing acts for real, whatever is
    armed. ``containment`` carries the actuator registry and the settings' arming and kill
    switch (``from_settings``).
    """

    runbook: Runbook
    dry_run: bool = True
    containment: Containment = field(default_factory=Containment)
    incidents: dict[str, Incident] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    _planned: set[str] = field(default_factory=set)
    _clock: float = 0.0  # the latest event time of a decision seen

    def __post_init__(self) -> None:
        self.containment = replace(self.containment, dry_run=self.dry_run)

    @classmethod
    def from_settings(
        cls,
        runbook: Runbook,
        settings: Settings,
        actuators: Mapping[str, StepActuator] | None = None,
    ) -> IncidentFlows:
        """Build the flows of one process: dry-run, arming and kill switch from ``settings``."""
        containment = Containment(
            actuators=dict(actuators or {}),
            armed_workloads=frozenset(settings.containment.armed_workloads),
            kill_switch=settings.containment.kill_switch,
        )
        return cls(runbook, dry_run=settings.dry_run, containment=containment)

    def apply(
        self, decisions: list[Decision], *, session: Session, contexts: ContextLookup
    ) -> None:
        """Write each decision; plan containment when an incident starts cascading, then
        advance the steps of the incidents the decisions touched."""
        touched: dict[str, None] = {}
        for d in decisions:
            self._clock = max(self._clock, _time(d))
            if not isinstance(d, VerdictRecorded):
                touched[d.key] = None
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
        for key in touched:
            self.contain(key, session=session, contexts=contexts)

    def finish(
        self, *, session: Session, contexts: ContextLookup, now: float | None = None
    ) -> None:
        """Advance containment and answer the questions of every incident touched so far.

        ``now`` (Unix seconds, e.g. the correlator's clock) moves the event time reached
        forward even when no decision did: a resolved incident's lifts need time to pass.
        """
        self._clock = max(self._clock, now or 0.0)
        for key, incident in self.incidents.items():
            ctx = contexts(key)
            if ctx is not None:
                self.contain(key, session=session, contexts=contexts)
                self._answer(incident, ctx, session)

    def contain(
        self,
        key: str,
        *,
        session: Session,
        contexts: ContextLookup,
        now: float | None = None,
    ) -> int:
        """Advance the steps of incident ``key`` at ``now`` (default: the event time reached).

        The event time reached is the latest of the decisions seen and of the incident's
        evidence. A caller with a clock of its own (a live loop between batches) may pass
        ``now``. Returns how many moves were made.
        """
        incident, ctx = self.incidents.get(key), contexts(key)
        if incident is None or ctx is None:
            return 0
        run = _run(incident, self.runbook.name)
        if run is None or settled(run, self.runbook):
            return 0
        latest = max((s.time for s in ctx.signals), default=ctx.opened_at)
        when = now if now is not None else max(self._clock, latest)
        return advance(
            session=session,
            incident=incident,
            run=run,
            runbook=self.runbook,
            ctx=ctx,
            now=when,
            containment=self.containment,
        )

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
        rows = {row.position: row for row in run.steps}
        for step in plan(self.runbook, ctx, dry_run=self.dry_run):
            row = rows.get(step.position)
            if row is not None and _acted(row):
                continue  # what was applied or approved stays as it was planned then
            service.upsert_step(
                session=session,
                run=run,
                position=step.position,
                action=step.action,
                title=step.title,
                status=row.status if row is not None else step.status,
                params=_jsonable(step.params),
                approval=step.approval,
                result=row.result if row is not None else None,
                time=time,
            )
            self._note(session, incident, time, "step", f"step {step.position} "
                       f"{step.action} {step.status}: {step.title} - {plan_text(step)}",
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


def _time(d: Decision) -> float:
    """Return the event time of a decision (an evidence decision: its signal's)."""
    return d.signal.time if isinstance(d, EvidenceAdded) else d.time


def _run(incident: Incident, runbook: str) -> RunbookRun | None:
    return next((run for run in incident.runs if run.runbook == runbook), None)


def _acted(row: RunbookStep) -> bool:
    """Return True once a step is past waiting: approved, applied, or decided."""
    state = StepRecord.from_record(row.result).state
    return state not in (StepState.PLANNED.value, StepState.AWAITING_APPROVAL.value)


def _jsonable(value: Any) -> Any:
    """Return ``value`` with tuples/sets turned into lists and other objects into strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
