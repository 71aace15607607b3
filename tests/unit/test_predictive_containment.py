"""Predictive containment: the gateway limit at ``suspected`` when the next victim is near.

``ContainmentFlows`` with ``predictive`` on a SQLite store (schema by ``create_all``: unit
tests only), the bundled runbook (1 lower_batch_ceiling auto, 2 enable_rate_limit auto,
3 stagger_restarts approval), dry-run as the process default.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

import detector.notify.models  # noqa: F401  (their tables, for create_all)
from detector import db
from detector.correlate.context import IncidentContext
from detector.correlate.forecast import NextVictim
from detector.correlate.state import EvidenceAdded, Stage, StageChanged, VictimAdded
from detector.db import Base
from detector.events.model import Signal, SignalKind, SourcePos
from detector.incidents import service
from detector.incidents.flows import decision_time
from detector.incidents.models import Incident
from detector.runbooks import service as run_service
from detector.runbooks.flows import ContainmentFlows
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.models import StepAction
from detector.runbooks.predictive import early_limit, restart_ready_s
from detector.runbooks.runner import Containment, records_of

RUNBOOK = load_runbook(default_runbook_path())
KEY = "llm/Deployment/m@1"
T0 = float(int(time.time()) - 300)  # near the wall clock: approvals expire on it


@pytest.fixture
def session(sqlite_url: str) -> Iterator[Session]:
    engine = db.make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    try:
        with db.session_factory(engine)() as s:
            yield s
    finally:
        engine.dispose()


def sig(kind: SignalKind, dt: float, pod: str | None = None, **attrs: Any) -> Signal:
    return Signal(kind, T0 + dt, SourcePos("t.log", int(dt) + 1000), "llm", pod, attrs=attrs)


def context(
    stage: str, *victims: str, eta_s: float | None = 20.0, at: float = 5.0, extra: tuple = ()
) -> IncidentContext:
    """Return the incident at ``T0 + at``: its victims died 30 s apart from ``T0``; the
    forecast (``eta_s``; None: none) names pod b."""
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
        *(sig(SignalKind.LB_RESPONSE, -29.5 + i, status=200, count=20) for i in range(30)),
        *extra,
    ]
    nxt = None if eta_s is None else NextVictim("b", eta_s, T0 + at, 0.9, 0.95, 0.002, 6)
    return IncidentContext(
        key=KEY,
        namespace="llm",
        workload="m",
        workload_kind="Deployment",
        stage=stage,
        opened_at=T0,
        victims=victims,
        pods_seen=("a", "b", "c", "d"),
        signals=tuple(sorted(signals, key=lambda s: s.time)),
        next_victim=nxt,
    )


def announced(ctx: IncidentContext) -> EvidenceAdded:
    nxt = ctx.next_victim
    assert nxt is not None
    signal = sig(SignalKind.ENGINE_PRESSURE, nxt.fitted_at - T0, nxt.pod, eta_s=nxt.eta_s)
    return EvidenceAdded(KEY, "next_victim", signal, nxt.summary())


def open_incident(session: Session) -> Incident:
    return service.get_or_create_incident(
        session=session,
        key=KEY,
        namespace="llm",
        workload="m",
        workload_kind="Deployment",
        cluster=None,
        stage="suspected",
        opened_at=T0,
    )


def step(flows: ContainmentFlows, session: Session, inc: Incident, d: Any, ctx: Any) -> None:
    """Follow one decision, then advance, as the pipeline's contain stage does."""
    flows.follow(d, inc, ctx, session=session)
    flows.advance(inc, ctx, decision_time(d), session=session)
    session.flush()


def planned(session: Session, inc: Incident) -> list[int]:
    run = run_service.run_of(session=session, incident=inc, runbook=RUNBOOK.name)
    return [] if run is None else sorted(row.position for row in run.steps)


def states(session: Session, inc: Incident) -> dict[int, str]:
    run = run_service.run_of(session=session, incident=inc, runbook=RUNBOOK.name)
    assert run is not None
    session.refresh(run)
    return {pos: rec.state for pos, rec in records_of(run).items()}


def actions(session: Session) -> list[tuple[str, str]]:
    rows = session.scalars(select(StepAction).order_by(StepAction.id))
    return [(r.step_id, r.move) for r in rows]


def timeline(session: Session, inc: Incident) -> list[str]:
    return [t.message for t in service.timeline(session=session, incident=inc)]


def cascade(flows: ContainmentFlows, session: Session, inc: Incident) -> IncidentContext:
    """Let pod b die 30 s after a: a victim, then the stage, as the correlator decides."""
    ctx = context("cascading", "a", "b", eta_s=None, at=30.0)
    step(flows, session, inc, VictimAdded(KEY, "b", T0 + 30, 2), ctx)
    step(flows, session, inc, StageChanged(KEY, Stage.CASCADING, T0 + 30, "b died"), ctx)
    return ctx


def test_the_gateway_limit_goes_on_at_suspected_then_the_cascade_plans_the_rest(
    session: Session,
) -> None:
    flows, inc = ContainmentFlows(RUNBOOK, predictive=True), open_incident(session)
    suspected = context("suspected", "a", eta_s=20.0)
    step(flows, session, inc, announced(suspected), suspected)
    assert planned(session, inc) == [3]
    assert states(session, inc) == {3: "verifying"}  # applied (dry-run), verify by deadline
    assert actions(session) == [("enable_rate_limit", "applied")]
    why = [m for m in timeline(session, inc) if m.startswith("predictive:")]
    assert why == [
        "predictive: pod b reaches its pressure ceiling in ~20 s (forecast at "
        f"{time.strftime('%H:%M:%S', time.gmtime(T0 + 5))}), before a restarted pod can serve "
        "again in ~130 s (no restart or model load in the evidence: default 130 s): the "
        "gateway limit goes on at suspected"
    ]
    # the forecast, repeated, plans nothing more
    step(
        flows,
        session,
        inc,
        announced(context("suspected", "a", eta_s=10.0, at=10.0)),
        context("suspected", "a", eta_s=10.0, at=10.0),
    )
    assert actions(session) == [("enable_rate_limit", "applied")]
    # b dies: the cascade plans the other steps; the gateway limit is kept, not applied again
    cascading = cascade(flows, session, inc)
    assert planned(session, inc) == [1, 2, 3, 4]
    got = states(session, inc)
    assert got[1] == "not_needed"  # the quarantine: no request class in the evidence
    assert got[2] == "verifying"  # the batch ceiling: mechanism undetermined, its turn
    assert got[3] == "escalated"  # the limit did not stop the cascade: the next step's turn
    assert got[4] == "awaiting_approval"
    # a later victim re-plans: still one apply of each, nothing undone
    later = context("cascading", "a", "b", "c", eta_s=None, at=60.0)
    step(flows, session, inc, VictimAdded(KEY, "c", T0 + 60, 3), later)
    assert cascading.stage == "cascading"
    assert actions(session) == [
        ("enable_rate_limit", "applied"),
        ("lower_batch_ceiling", "applied"),
    ]


def test_without_the_option_nothing_happens_until_cascading(session: Session) -> None:
    flows, inc = ContainmentFlows(RUNBOOK), open_incident(session)
    suspected = context("suspected", "a", eta_s=20.0)
    step(flows, session, inc, announced(suspected), suspected)
    assert planned(session, inc) == []
    assert actions(session) == []
    cascade(flows, session, inc)
    assert planned(session, inc) == [1, 2, 3, 4]
    assert actions(session) == [("lower_batch_ceiling", "applied")]
    assert states(session, inc)[3] == "planned"  # its turn comes when step 2 fails


@pytest.mark.parametrize(
    "ctx",
    [
        context("suspected", "a", eta_s=200.0),  # the survivor outlasts a restart (130 s)
        context("suspected", "a", eta_s=None),  # no survivor at risk
        context("cascading", "a", "c", eta_s=20.0),  # too late for predictive: planned anyway
        context("suspected", "a", eta_s=20.0, extra=(sig(SignalKind.POD_READY, 12.0, "a"),)),
    ],
    ids=["outlasts-restart", "no-forecast", "cascading", "restart-measured-12-s"],
)
def test_no_early_limit(session: Session, ctx: IncidentContext) -> None:
    flows, inc = ContainmentFlows(RUNBOOK, predictive=True), open_incident(session)
    d = announced(ctx) if ctx.next_victim is not None else VictimAdded(KEY, "a", T0, 1)
    step(flows, session, inc, d, ctx)
    assert planned(session, inc) == []
    assert actions(session) == []


def test_the_rails_still_hold_the_early_limit(session: Session) -> None:
    held = Containment(kill_switch=True)
    flows = ContainmentFlows(RUNBOOK, predictive=True, containment=held)
    inc = open_incident(session)
    suspected = context("suspected", "a", eta_s=20.0)
    step(flows, session, inc, announced(suspected), suspected)
    assert planned(session, inc) == [3]
    assert actions(session) == []  # planned and approved by policy, blocked by the switch
    assert any("kill_switch" in m for m in timeline(session, inc))


def test_restart_ready_from_the_evidence() -> None:
    assert restart_ready_s(context("suspected", "a"), 130.0)[0] == 130.0
    load = (
        sig(SignalKind.ENGINE_CONFIG, -400, "d", engine="vllm", max_num_seqs=256),
        sig(SignalKind.ENGINE_CONFIG, -355, "d", engine="vllm", kv_cache_tokens=443_024),
    )
    took, basis = restart_ready_s(context("suspected", "a", extra=load), 130.0)
    assert took == 55.0 and "model load time 45 s" in basis and "back-off 10 s" in basis
    back = (sig(SignalKind.POD_READY, 95.0, "a"),)
    took, basis = restart_ready_s(context("suspected", "a", extra=load + back), 130.0)
    assert took == 95.0 and basis == "pod a served again 95 s after its GPU OOM"
    # the forecast counts down from its fit: 20 s at T0+5 is 5 s left at T0+20
    why = early_limit(context("suspected", "a", extra=load), T0 + 20, 130.0)
    assert why is not None and "in ~5 s" in why and "in ~55 s" in why
