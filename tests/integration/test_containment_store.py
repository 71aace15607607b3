"""Approvals, arming, the kill switch and the step runner on real databases.

Each test runs on a SQLite file and on a fresh PostgreSQL database (skipped when the server is
unreachable, a failure under CI), migrated with ``alembic upgrade head``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detector import db
from detector.actuators.base import ActionResult, Change, Operation, Plan, Status
from detector.correlate.context import IncidentContext
from detector.errors import ApprovalError
from detector.events.model import Signal, SignalKind, SourcePos
from detector.incidents import service
from detector.incidents.models import Incident
from detector.notify import outbox
from detector.notify.models import Notification
from detector.runbooks import approvals
from detector.runbooks import service as run_service
from detector.runbooks.definition import Runbook
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.models import RunbookRun, StepAction, StepApproval
from detector.runbooks.planner import PlannedStep, plan
from detector.runbooks.runner import Containment, advance
from detector.runbooks.steps import StepRecord

# Event time near the wall clock: a person's decision is checked against the wall clock. Set
# again before each test (``_near_now``): read once at collection, it lets approvals expire
# when the tests before this module take longer than their expiry.
T0 = float(int(time.time()) - 300)
APPROVERS = ("alice", "bob")
RUNBOOK = load_runbook(default_runbook_path())


@pytest.fixture(autouse=True)
def _near_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "T0", float(int(time.time()) - 300))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest) -> str:
    """Return the URL of an empty database of each backend, migrated to head."""
    value: str = request.getfixturevalue(
        "sqlite_url" if request.param == "sqlite" else "postgres_url"
    )
    db.upgrade(value)
    return value


@pytest.fixture
def make_session(url: str) -> Iterator[Any]:
    engine = db.make_engine(url)
    try:
        yield db.session_factory(engine)
    finally:
        engine.dispose()


@pytest.fixture
def session(make_session: Any) -> Iterator[Session]:
    with make_session() as s:
        yield s


def sig(kind: SignalKind, dt: float, pod: str | None = None, **attrs: Any) -> Signal:
    return Signal(kind, T0 + dt, SourcePos("t.log", int(dt) + 1000), "llm", pod, attrs=attrs)


def context(key: str, *victims: str, stage: str = "cascading", at: float = 0) -> IncidentContext:
    signals = [
        sig(
            SignalKind.ENGINE_CONFIG,
            -300,
            "a",
            engine="vllm",
            max_num_seqs=256,
            max_model_len=32768,
            kv_cache_tokens=443_024,
        ),
        *(sig(SignalKind.GPU_OOM, i * 30.0, pod) for i, pod in enumerate(victims)),
        sig(SignalKind.LB_RESPONSE, at, status=502, error_rate_per_s=3.0),
        # 10 ok/s before the second victim: limit-rps 5 (2 of 4 replicas left), lifted to 10
        *(sig(SignalKind.LB_RESPONSE, -29.5 + i, status=200, count=20) for i in range(30)),
        sig(SignalKind.LB_RESPONSE, 0.5, status=200, count=10),
    ]
    return IncidentContext(
        key=key,
        namespace="llm",
        workload="m",
        workload_kind="Deployment",
        stage=stage,
        opened_at=T0,
        victims=victims,
        pods_seen=("a", "b", "c", "d"),
        signals=tuple(sorted(signals, key=lambda s: s.time)),
    )


def open_incident(
    session: Session, key: str = "llm/m@1", at: float | None = None, runbook: Runbook = RUNBOOK
) -> Incident:
    at = T0 if at is None else at
    incident = service.get_or_create_incident(
        session=session,
        key=key,
        namespace="llm",
        workload="m",
        workload_kind="Deployment",
        cluster=None,
        stage="cascading",
        opened_at=at,
    )
    run = run_service.get_or_create_run(
        session=session,
        incident=incident,
        runbook=RUNBOOK.name,
        version="1",
        mode="dry_run",
        time=at,
    )
    for step in plan(runbook, context(key, "a", "b")):
        run_service.upsert_step(
            session=session,
            run=run,
            position=step.position,
            action=step.action,
            title=step.title,
            status=step.status,
            params=dict(step.params),
            approval=step.approval,
            time=at,
        )
    session.flush()
    return incident


def tick(
    session: Session,
    incident: Incident,
    now: float,
    ctx: IncidentContext,
    containment: Containment | None = None,
    runbook: Runbook = RUNBOOK,
) -> int:
    run = session.scalars(select(RunbookRun).where(RunbookRun.incident_id == incident.id)).one()
    session.refresh(run)
    made = advance(
        session=session,
        incident=incident,
        run=run,
        runbook=runbook,
        ctx=ctx,
        now=now,
        containment=containment or Containment(),
    )
    session.commit()
    return made


def step_events(session: Session, incident: Incident) -> list[str]:
    return [
        str((t.detail or {}).get("event"))
        for t in service.timeline(session=session, incident=incident)
        if t.detail is not None
    ]


def walk_to_approval(session: Session, incident: Incident) -> None:
    """Quarantine passed over (no request class), ceiling applied, the cascade spreads, rate
    limit applied, spreads again: approval asked."""
    assert tick(session, incident, T0 + 30, context(incident.key, "a", "b", at=30)) == 3
    assert tick(session, incident, T0 + 60, context(incident.key, "a", "b", "c", at=60)) == 3
    assert tick(session, incident, T0 + 90, context(incident.key, "a", "b", "c", "d", at=90)) == 2


def test_the_runner_records_every_move_once(session: Session) -> None:
    incident = open_incident(session)
    walk_to_approval(session, incident)
    assert step_events(session, incident) == [
        "not_needed",
        "auto_approved",
        "applied",
        "escalated",
        "auto_approved",
        "applied",
        "escalated",
        "approval_requested",
    ]
    rows = approvals.approvals_of(session=session, incident=incident)
    assert {k: r.status for k, r in rows.items()} == {
        "lower_batch_ceiling": "approved",
        "enable_rate_limit": "approved",
        "stagger_restarts": "pending",
    }
    assert rows["lower_batch_ceiling"].decided_by == "policy:auto"
    assert rows["stagger_restarts"].approver_group == "sre-oncall"
    applied = [
        t.detail
        for t in service.timeline(session=session, incident=incident)
        if t.detail and t.detail["event"] == "applied"
    ]
    assert "+--max-num-seqs=13" in applied[0]["diff"] and applied[0]["mode"] == "dry_run"
    assert 'limit-rps: "' in applied[1]["diff"]
    actions = session.scalars(select(StepAction).order_by(StepAction.id)).all()
    assert [(a.step_id, a.move, a.live) for a in actions] == [
        ("lower_batch_ceiling", "applied", False),
        ("enable_rate_limit", "applied", False),
    ]
    before = len(service.timeline(session=session, incident=incident))
    # the same time again, an older time, and a fresh reader: nothing new
    assert tick(session, incident, T0 + 90, context(incident.key, "a", "b", "c", "d", at=90)) == 0
    assert tick(session, incident, T0 + 10, context(incident.key, "a", "b", "c", "d", at=10)) == 0
    assert len(service.timeline(session=session, incident=incident)) == before


def test_approve_deny_and_their_refusals(session: Session, make_session: Any) -> None:
    incident = open_incident(session)
    walk_to_approval(session, incident)
    key = incident.key

    def decide(step: str = "stagger_restarts", who: str = "alice", **kw: Any) -> StepApproval:
        kw.setdefault("approve", True)
        with make_session() as other:
            row = approvals.decide(
                session=other,
                incident_ref=kw.pop("ref", key),
                step_ref=step,
                approver=who,
                via="cli",
                approvers=APPROVERS,
                **kw,
            )
            other.commit()
            return row

    for kw, code in [
        ({"who": "mallory"}, "forbidden"),
        ({"ref": "llm/nope@1"}, "not_found"),
        ({"step": "reboot_cluster"}, "not_found"),
        ({"step": "lower_batch_ceiling"}, "conflict"),  # policy auto: nothing to decide
    ]:
        with pytest.raises(ApprovalError) as info:
            decide(**kw)
        assert info.value.reason == code, kw
    row = decide(step="4", ref=str(incident.id), reason="pods are crash-looping")  # by position
    assert (row.status, row.decided_by, row.via) == ("approved", "alice", "cli")
    with pytest.raises(ApprovalError, match="conflict"):
        decide(who="bob", approve=False)
    # the engine applies what was approved, naming the approver, in dry-run
    ctx = context(key, "a", "b", "c", "d", at=120)
    assert tick(session, incident, T0 + 120, ctx) == 2
    # the decision is stamped with the wall clock, the engine's moves with event time
    events = step_events(session, incident)
    assert sorted(events[-3:]) == ["approved", "approved", "restarted"]
    details = [t.detail for t in service.timeline(session=session, incident=incident) if t.detail]
    decision = next(d for d in details if d.get("via") == "cli")
    assert (decision["actor"], decision["reason"]) == ("alice", "pods are crash-looping")
    restart = next(d for d in details if d["event"] == "restarted")
    assert restart["mode"] == "dry_run" and '"kind": "Eviction"' in restart["diff"]
    engine = next(d for d in details if d["event"] == "approved" and "via" not in d)
    assert engine["actor"] == "alice" and engine["approval"]["by"] == "alice"


@pytest.mark.parametrize("decision", ["approved", "denied"])
def test_the_thread_tells_a_decision_once_and_the_timeline_keeps_it_taken_up(
    session: Session, decision: str
) -> None:
    """The decision is told when it is made (who, how, when: ``approvals.decide``); the step
    taking it up at event time stays on the timeline and is not told again; what the step
    does then is told."""
    incident = open_incident(session)
    walk_to_approval(session, incident)
    approvals.decide(session=session, incident_ref=incident.key, step_ref="stagger_restarts",
                     approve=decision == "approved", approver="alice", via="slack",
                     approvers=APPROVERS)  # fmt: skip
    session.commit()
    tick(session, incident, T0 + 120, context(incident.key, "a", "b", "c", "d", at=120))
    outbox.enqueue(session=session, incident=incident, channel="C0OUTBOX")
    session.commit()
    queued = set(session.scalars(select(Notification.entry_id)))
    timeline = service.timeline(session=session, incident=incident)
    assert [(t.detail or {}).get("event") for t in timeline].count(decision) == 2
    written = sorted(timeline, key=lambda t: t.id)  # as queued (the decision: wall clock)
    told = [t.message for t in written if t.id in queued and "stagger_restarts" in t.message]
    assert told[0].startswith("step 4 stagger_restarts approval_requested by detector")
    assert told[1:2] == [f"step 4 stagger_restarts {decision} by alice via slack"]
    after = ["step 4 stagger_restarts would be restarted"] if decision == "approved" else []
    assert [m.split(" [")[0] for m in told[2:]] == after


def test_a_pending_approval_expires_and_cannot_be_decided_after(session: Session) -> None:
    incident = open_incident(session)
    walk_to_approval(session, incident)
    ctx = context(incident.key, "a", "b", "c", "d", at=600)
    assert tick(session, incident, T0 + 689, ctx) == 0  # asked at +90, expires at +690
    assert tick(session, incident, T0 + 690, ctx) == 1
    assert step_events(session, incident)[-1] == "expired"
    row = approvals.approvals_of(session=session, incident=incident)["stagger_restarts"]
    assert (row.status, row.via) == ("expired", "engine")
    with pytest.raises(ApprovalError, match="conflict"):
        approvals.decide(
            session=session,
            incident_ref=incident.key,
            step_ref="stagger_restarts",
            approve=True,
            approver="alice",
            via="cli",
            approvers=APPROVERS,
        )
    rec = StepRecord.from_record(session.scalars(select(RunbookRun)).one().steps[3].result)
    assert (rec.state, rec.outcome) == ("expired", "failed")


def test_of_two_racing_decisions_one_wins(make_session: Any) -> None:
    with make_session() as setup:
        incident = open_incident(setup)
        walk_to_approval(setup, incident)
        key = incident.key
    first, second = make_session(), make_session()
    try:
        stale = approvals.approvals_of(
            session=second, incident=approvals.find_incident(session=second, ref=key)
        )["stagger_restarts"]
        assert stale.status == "pending"  # the second reader saw it pending
        approvals.decide(
            session=first,
            incident_ref=key,
            step_ref="stagger_restarts",
            approve=True,
            approver="alice",
            via="http",
            approvers=APPROVERS,
        )
        first.commit()
        with pytest.raises(ApprovalError, match="conflict"):
            approvals.decide(
                session=second,
                incident_ref=key,
                step_ref="stagger_restarts",
                approve=False,
                approver="bob",
                via="cli",
                approvers=APPROVERS,
            )
    finally:
        first.close()
        second.close()


def test_controls_arm_disarm_and_kill_switch(session: Session) -> None:
    scope = "llm/m"
    kw: dict[str, Any] = {"session": session, "namespace": "llm", "workload": "m"}
    assert approvals.is_armed(**kw, armed_workloads=()) is False
    assert approvals.is_armed(**kw, armed_workloads=("llm/m",)) is True
    approvals.set_control(session=session, scope=scope, name="armed", enabled=False, by="ops")
    assert approvals.is_armed(**kw, armed_workloads=("llm/m",)) is False  # disarm wins
    approvals.set_control(session=session, scope=scope, name="armed", enabled=True, by="ops")
    assert approvals.is_armed(**kw, armed_workloads=()) is True
    assert approvals.kill_switch_on(session=session) is False
    assert approvals.kill_switch_on(session=session, setting=True) is True
    approvals.set_control(session=session, scope="*", name="kill_switch", enabled=True, by="ops")
    assert approvals.kill_switch_on(session=session) is True
    session.commit()


@dataclass
class Recorder:
    """A registered actuator that records every call (a fake of a real one)."""

    calls: list[tuple[str, str, bool]] = field(default_factory=list)

    def plan_step(self, step: PlannedStep) -> Plan:
        change = Change(f"fake/{step.step_id}", "old\n", f"{step.params.get('limit_rps')}\n")
        return Plan(step.action.value, "fake", (change,), "fake")

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        self.calls.append(("apply", plan.action, dry_run))
        status = Status.DRY_RUN if dry_run else Status.OK
        return ActionResult(plan.action, "fake", Operation.APPLY, status, plan.changes)

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        self.calls.append(("revert", plan.action, dry_run))
        status = Status.DRY_RUN if dry_run else Status.OK
        return ActionResult(plan.action, "fake", Operation.REVERT, status, plan.changes)


def test_armed_workloads_act_for_real_unless_the_kill_switch_is_on(session: Session) -> None:
    rate_first = RUNBOOK.model_copy(update={"steps": (RUNBOOK.step("enable_rate_limit"),)})
    fake = Recorder()
    live = Containment(dry_run=False, actuators={"enable_rate_limit": fake})
    incident = open_incident(session, runbook=rate_first)
    ctx = context(incident.key, "a", "b", at=30)
    approvals.set_control(session=session, scope="*", name="kill_switch", enabled=True, by="ops")
    assert tick(session, incident, T0 + 30, ctx, live, rate_first) == 2  # approved, blocked
    assert step_events(session, incident) == ["auto_approved", "blocked"]
    assert fake.calls == []
    approvals.set_control(session=session, scope="*", name="kill_switch", enabled=False, by="ops")
    assert tick(session, incident, T0 + 31, ctx, live, rate_first) == 1  # not armed: dry-run
    assert fake.calls == [("apply", "enable_rate_limit", True)]


def test_an_armed_workload_is_changed_and_lifted_for_real(session: Session) -> None:
    rate_only = RUNBOOK.model_copy(update={"steps": (RUNBOOK.step("enable_rate_limit"),)})
    fake = Recorder()
    live = Containment(dry_run=False, actuators={"enable_rate_limit": fake})
    approvals.set_control(session=session, scope="llm/m", name="armed", enabled=True, by="ops")
    incident = open_incident(session, runbook=rate_only)
    assert (
        tick(session, incident, T0 + 30, context(incident.key, "a", "b", at=30), live, rate_only)
        == 2
    )
    assert fake.calls == [("apply", "enable_rate_limit", False)]
    row = session.scalars(select(RunbookRun)).one().steps[0]
    assert row.status == "verifying"  # a live step's status is its state
    calm = context(incident.key, "a", "b", stage="contained", at=100)
    # verified, and relaxed at once: the limit was sized for the pods left, which come back
    assert tick(session, incident, T0 + 100, calm, live, rate_only) == 2
    resolved = context(incident.key, "a", "b", stage="resolved", at=500)
    made = sum(
        tick(session, incident, T0 + t, resolved, live, rate_only) for t in (500, 620, 740, 860)
    )
    assert made == 1  # 5 -> 10 r/s at +100, removed at +500 (20 >= the 10.2 r/s seen)
    assert fake.calls[1:] == [
        ("apply", "enable_rate_limit", False),
        ("revert", "enable_rate_limit", False),
    ]
    assert step_events(session, incident)[-2:] == ["lifted", "removed"]
    lifted = service.timeline(session=session, incident=incident)[-2]
    assert "limit_rps 5 -> 10" in lifted.message and "[live]" in lifted.message


def test_cooldown_and_cap_count_the_workload_across_incidents(session: Session) -> None:
    first = open_incident(session, "llm/m@1")  # the quarantine passed over, then the ceiling
    assert tick(session, first, T0 + 30, context(first.key, "a", "b", at=30)) == 3
    second = open_incident(session, "llm/m@2", at=T0 + 60)
    assert tick(session, second, T0 + 100, context(second.key, "a", "b", at=100)) == 3
    assert step_events(session, second) == ["not_needed", "auto_approved", "blocked"]
    last = service.timeline(session=session, incident=second)[-1]
    assert "cooldown" in last.message
    assert tick(session, second, T0 + 331, context(second.key, "a", "b", at=331)) == 1
    assert step_events(session, second)[-1] == "applied"
    count = session.scalar(select(func.count()).select_from(StepAction))
    assert count == 2
    assert (
        approvals.actions_between(
            session=session, namespace="llm", workload="m", live=False, since=T0, until=T0 + 3600
        )
        == 2
    )
    capped = RUNBOOK.model_copy(update={"max_actions_per_hour": 2})
    third = open_incident(session, "llm/m@3", at=T0 + 400)
    assert tick(session, third, T0 + 700, context(third.key, "a", at=700), None, capped) == 3
    assert "cap: 2 actions" in service.timeline(session=session, incident=third)[-1].message
