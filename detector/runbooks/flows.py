"""The runbook flows: plan containment for a cascading incident, advance its steps, decide.

- ``ContainmentFlows.follow(decision, incident, ...)`` plans the runbook when an incident
  starts cascading and re-plans it when a victim is added (what was applied or approved
  stays as it was planned then); with ``predictive`` on, it plans the gateway limit alone at
  ``suspected`` when the next victim comes before a restarted pod can serve again
  (:mod:`detector.runbooks.predictive`), and the cascading plan adds the other steps; the
  quarantine of a poison request class is planned alone at ``suspected`` likewise, whenever
  the evidence shows one (:mod:`detector.runbooks.mechanism`);
- ``ContainmentFlows.advance(incident, ctx, now, ...)`` makes every step move due at event
  time ``now`` (:mod:`detector.runbooks.runner`);
- ``decide(request, ...)`` is the one decide flow of people: approve or deny a step, arm or
  disarm a workload, switch the kill switch, for every face (CLI, HTTP, Slack, web page).

Everything runs within the caller's transaction (the caller commits).
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Collection, Mapping, Set
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sqlalchemy.orm import Session

from detector.config import Settings
from detector.correlate.context import IncidentContext
from detector.correlate.state import Decision, Stage, StageChanged, VictimAdded
from detector.errors import ApprovalError
from detector.incidents import lifecycle
from detector.incidents.flows import decision_time, jsonable, note
from detector.incidents.models import Incident, TimelineEntry
from detector.runbooks import approvals, controls
from detector.runbooks import service as run_service
from detector.runbooks.bindings.base import StepActuator
from detector.runbooks.definition import Action, Runbook
from detector.runbooks.mechanism import Mechanism, diagnose
from detector.runbooks.models import Control, RunbookRun, RunbookStep, StepApproval
from detector.runbooks.planner import plan
from detector.runbooks.predictive import DEFAULT_RESTART_READY_S, early_limit
from detector.runbooks.runner import Containment, advance, settled
from detector.runbooks.steps import StepRecord, StepState
from detector.runbooks.transitions import plan_text


@dataclass
class ContainmentFlows:
    """Plan and advance the runbook of each incident; holds configuration only, no rows.

    ``dry_run`` is the process-wide switch: while True nothing acts for real, whatever is
    armed. ``containment`` carries the actuator registry and the settings' arming and kill
    switch (``from_settings``). ``predictive``: plan the gateway limit at ``suspected`` when
    the next victim comes before a restarted pod serves (``restart_ready_s`` when the
    evidence does not tell how long that takes).
    """

    runbook: Runbook
    dry_run: bool = True
    containment: Containment = field(default_factory=Containment)
    predictive: bool = False
    restart_ready_s: float = DEFAULT_RESTART_READY_S

    def __post_init__(self) -> None:
        self.containment = replace(self.containment, dry_run=self.dry_run)

    @classmethod
    def from_settings(
        cls,
        runbook: Runbook,
        settings: Settings,
        actuators: Mapping[str, StepActuator] | None = None,
    ) -> ContainmentFlows:
        """Build the flows of one process: dry-run, arming and kill switch from ``settings``."""
        containment = Containment(
            actuators=dict(actuators or {}),
            armed_workloads=frozenset(settings.containment.armed_workloads),
            kill_switch=settings.containment.kill_switch,
            gateway=settings.containment.rate_limit_driver(),
        )
        c = settings.containment
        return cls(
            runbook,
            dry_run=settings.dry_run,
            containment=containment,
            predictive=c.predictive,
            restart_ready_s=c.restart_ready_s,
        )

    def follow(
        self, d: Decision, incident: Incident, ctx: IncidentContext | None, *, session: Session
    ) -> None:
        """Plan at the start of a cascade; re-plan when a victim dies after the plan was made.

        With ``predictive``: before any plan, each decision of a ``suspected`` incident may
        plan the gateway limit alone (``_limit_early``); the cascade's plan then adds the
        other steps, and a re-plan before it keeps to the steps planned early.
        """
        if ctx is None:
            return
        run = run_service.run_of(session=session, incident=incident, runbook=self.runbook.name)
        early = None if run is None else self._planned_early(run)
        if isinstance(d, StageChanged) and d.stage is Stage.CASCADING:
            if run is None or early is not None:
                self.plan(incident, ctx, d.time, session=session)
        elif isinstance(d, VictimAdded) and run is not None and d.time > run.created_at.timestamp():
            # a victim after the plan was made: the restart list grows (an earlier one, met
            # again when a restarted process re-reads its partition, is in the plan already)
            self.plan(incident, ctx, d.time, session=session, only=early)
            message = f"runbook re-planned for {d.position} victims"
            note(session, incident, d.time, "step", message, f"replan:{d.position}")
        elif run is None:
            early_at = decision_time(d)
            if not self._quarantine_early(incident, ctx, early_at, session=session) and (
                self.predictive
            ):
                self._limit_early(incident, ctx, early_at, session=session)

    def _planned_early(self, run: RunbookRun) -> frozenset[int] | None:
        """Return the positions of a run planned early (only some of the runbook's steps
        stored); None for a run planned whole."""
        positions = frozenset(row.position for row in run.steps)
        return None if len(positions) >= len(self.runbook.steps) else positions

    def _quarantine_early(
        self, incident: Incident, ctx: IncidentContext, time: float, *, session: Session
    ) -> bool:
        """Plan the runbook's quarantine alone, before the cascade, once the evidence shows a
        request class that kills the pods (:func:`detector.runbooks.mechanism.diagnose`): the
        client retries a poison request within a second, so it would kill the next pod before
        a second death makes the incident cascading. Returns whether it was planned; the step
        machine then takes it as any first step (policy, dry-run, arming, kill switch)."""
        positions = frozenset(
            position
            for position, step in enumerate(self.runbook.steps, start=1)
            if step.action is Action.QUARANTINE_REQUESTS
        )
        if not positions or (found := diagnose(ctx)).mechanism is not Mechanism.OVERSIZED:
            return False
        self.plan(incident, ctx, time, session=session, only=positions)
        why = f"quarantine planned at the first victim: {found.evidence}"
        note(session, incident, time, "step", why, "early:quarantine")
        return True

    def _limit_early(
        self, incident: Incident, ctx: IncidentContext, time: float, *, session: Session
    ) -> None:
        """Plan the runbook's gateway limit alone when the next victim comes before a restarted
        pod can serve again (:func:`detector.runbooks.predictive.early_limit`), with the reason
        on the timeline; the step machine then takes it as any first step (policy, dry-run,
        arming, kill switch, cooldown and the hourly cap hold)."""
        gateway = frozenset(
            position
            for position, step in enumerate(self.runbook.steps, start=1)
            if step.action is Action.ENABLE_RATE_LIMIT
        )
        if not gateway or (why := early_limit(ctx, time, self.restart_ready_s)) is None:
            return
        self.plan(incident, ctx, time, session=session, only=gateway)
        note(session, incident, time, "step", why, "predictive:gateway_limit")

    def plan(
        self,
        incident: Incident,
        ctx: IncidentContext,
        time: float,
        *,
        session: Session,
        only: Set[int] | None = None,
    ) -> None:
        """Store the runbook's steps as planned for the incident's evidence at ``time``.

        ``only``: the positions to plan (None: every step).
        """
        run = run_service.get_or_create_run(
            session=session,
            incident=incident,
            runbook=self.runbook.name,
            version=str(self.runbook.version),
            mode="dry_run" if self.dry_run else "live",
            time=time,
        )
        rows = {row.position: row for row in run.steps}
        gateway = self.containment.gateway
        for step in plan(self.runbook, ctx, dry_run=self.dry_run, gateway=gateway):
            if only is not None and step.position not in only:
                continue
            row = rows.get(step.position)
            if row is not None and _acted(row):
                continue  # what was applied or approved stays as it was planned then
            run_service.upsert_step(
                session=session,
                run=run,
                position=step.position,
                action=step.action,
                title=step.title,
                status=row.status if row is not None else step.status,
                params=jsonable(step.params),
                approval=step.approval,
                result=row.result if row is not None else None,
                time=time,
            )
            note(session, incident, time, "step", f"step {step.position} {step.action} "
                 f"{step.status}: {step.title} - {plan_text(step)}",
                 f"step:{step.position}:planned")  # fmt: skip

    def advance(
        self, incident: Incident, ctx: IncidentContext, now: float, *, session: Session
    ) -> int:
        """Make every step move of the incident due at event time ``now`` (Unix seconds).

        Returns how many moves were made (0 before the runbook is planned or once settled).
        """
        run = run_service.run_of(session=session, incident=incident, runbook=self.runbook.name)
        if run is None or settled(run, self.runbook, incident.stage):
            return 0
        return advance(
            session=session,
            incident=incident,
            run=run,
            runbook=self.runbook,
            ctx=ctx,
            now=now,
            containment=self.containment,
        )


def _acted(row: RunbookStep) -> bool:
    """Return True once a step is past waiting: approved, applied, or decided."""
    state = StepRecord.from_record(row.result).state
    return state not in (StepState.PLANNED.value, StepState.AWAITING_APPROVAL.value)


class DecisionKind(StrEnum):
    """What a person decides."""

    APPROVE = "approve"
    DENY = "deny"
    ARM = "arm"
    DISARM = "disarm"
    KILL_SWITCH_ON = "kill_switch_on"
    KILL_SWITCH_OFF = "kill_switch_off"
    ACKNOWLEDGE = "acknowledge"  # the incident's lifecycle (``incidents.lifecycle``)
    RESOLVE = "resolve"
    SNOOZE = "snooze"


LIFECYCLE = frozenset({DecisionKind.ACKNOWLEDGE, DecisionKind.RESOLVE, DecisionKind.SNOOZE})


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    """One person's decision, as a face received it.

    ``incident`` (key or id) and ``step`` (id or position) for approve/deny; ``workload``
    (``namespace/workload``) for arm/disarm; ``actor`` is who decides (default: the OS user
    for controls); ``via`` the face (``cli``, ``http``, ``slack``, ``web``).
    """

    kind: DecisionKind
    via: str
    actor: str = ""
    reason: str = ""
    incident: str = ""
    step: str = ""
    workload: str = ""
    plan: str = ""  # approve/deny: the digest of the plan the person saw ("": the pending one)
    force: bool = False  # arm: a workload the store has never seen
    host: str = ""  # controls: the machine the face ran on (the CLI's host name)
    minutes: int = 0  # snooze: how long


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """What a decision changed: the step's approval row, the switch's row, or the incident
    and its lifecycle entry."""

    request: DecisionRequest
    approval: StepApproval | None = None
    control: Control | None = None
    incident: Incident | None = None
    entry: TimelineEntry | None = None


def decide(
    request: DecisionRequest,
    *,
    session: Session,
    approvers: Collection[str],
    now: float | None = None,
) -> DecisionResult:
    """Carry out one person's decision within the caller's transaction.

    Approve/deny need ``request.actor`` on ``approvers`` (the allow-list) and a step waiting
    for approval; ``now`` (Unix seconds, default the wall clock) stamps the decision.
    Raises ApprovalError: ``forbidden``, ``not_found``, ``conflict``; StoreError.
    """
    kind = request.kind
    if kind in (DecisionKind.APPROVE, DecisionKind.DENY):
        if not approvers:
            raise ApprovalError(
                "forbidden", "no approvers configured: set DETECTOR_CONTAINMENT__APPROVERS"
            )
        row = approvals.decide(
            session=session,
            incident_ref=request.incident,
            step_ref=request.step,
            approve=kind is DecisionKind.APPROVE,
            approver=request.actor,
            via=request.via,
            approvers=approvers,
            reason=request.reason,
            time=now,
            plan=request.plan or None,
        )
        return DecisionResult(request, approval=row)
    if kind in LIFECYCLE:
        return _lifecycle(request, session=session, approvers=approvers, now=now)
    by = request.actor or getpass.getuser()
    if kind in (DecisionKind.ARM, DecisionKind.DISARM):
        scope, name = approvals.workload_scope(request.workload), approvals.ARMED
        enabled = kind is DecisionKind.ARM
        if enabled and not request.force:  # disarming is the safe direction: never held back
            _require_known_workload(session, scope)
    else:
        scope, name = approvals.GLOBAL_SCOPE, approvals.KILL_SWITCH
        enabled = kind is DecisionKind.KILL_SWITCH_ON
    origin = controls.ControlOrigin(by, request.via, request.host, request.reason)
    controls.change(
        session=session, scope=scope, name=name, enabled=enabled, origin=origin, time=now
    )
    control = session.get(Control, (scope, name))
    return DecisionResult(request, control=control)


def _lifecycle(
    request: DecisionRequest, *, session: Session, approvers: Collection[str], now: float | None
) -> DecisionResult:
    """Acknowledge, resolve or snooze an incident (``incidents.lifecycle``), in wall-clock
    time, after the approvers' allow-list check. Raises ApprovalError."""
    lifecycle.check_allowed(request.actor, approvers)
    incident = approvals.find_incident(session=session, ref=request.incident)
    at = time.time() if now is None else now
    actor, via = request.actor, request.via
    if request.kind is DecisionKind.ACKNOWLEDGE:
        entry = lifecycle.acknowledge(session=session, incident=incident, actor=actor, via=via,
                                      time=at)  # fmt: skip
    elif request.kind is DecisionKind.RESOLVE:
        entry = lifecycle.resolve(session=session, incident=incident, actor=actor, via=via,
                                  reason=request.reason, time=at)  # fmt: skip
    else:
        entry = lifecycle.snooze(session=session, incident=incident, actor=actor, via=via,
                                 minutes=request.minutes, time=at)  # fmt: skip
    return DecisionResult(request, incident=incident, entry=entry)


def _require_known_workload(session: Session, scope: str) -> None:
    """Refuse to arm a workload the store has never seen (a typo, most likely).

    Raises ApprovalError(``not_found``) naming the known workloads that look close.
    """
    if controls.is_known(session=session, scope=scope):
        return
    close = controls.close_workloads(scope, controls.known_workloads(session=session))
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise ApprovalError(
        "not_found",
        f"the store has no incident, verdict or step action of {scope!r}{hint} "
        "(--force to set it anyway)",
    )
