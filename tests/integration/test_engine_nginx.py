"""The step machine drives the real nginx rate limit: applied when armed, relaxed, then removed.

nginx is started by the fixture of test_nginx_actuator.py (Debian package ``nginx``) on free
loopback ports; the store is a SQLite file. The incident is small: two of four pods died, 5 ok
responses per second before, so the planner's aggregate budget is 2.5/s (150 r/m for every
client together) and, no client being named, 2 r/s per client; the lift relaxes both x2.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import small_cascade
from small_cascade import T0, signal
from sqlalchemy import select
from sqlalchemy.orm import Session
from test_nginx_actuator import (  # the nginx fixture and helpers of the actuator's own tests
    BURST_N,
    RunningNginx,
    assert_limited,
    burst,
    nginx,
    planned_rate_limit,
)

from detector import db
from detector.actuators.nginx.limiter import NginxRateLimiter
from detector.correlate.context import IncidentContext
from detector.events.model import SignalKind
from detector.incidents import service
from detector.incidents.models import Incident
from detector.runbooks import approvals
from detector.runbooks import service as run_service
from detector.runbooks.bindings.base import ActuatorBinding
from detector.runbooks.bindings.nginx import rate_limit_from_step
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.models import RunbookRun
from detector.runbooks.planner import plan
from detector.runbooks.runner import Containment, advance

__all__ = ["nginx"]  # a fixture, used by name
RUNBOOK = load_runbook(default_runbook_path())
RATE_ONLY = RUNBOOK.model_copy(update={"steps": (RUNBOOK.step("enable_rate_limit"),)})


def context(stage: str, at: float) -> IncidentContext:
    """The small cascade at ``stage``, with a clean LB window ``at`` s after the first OOM."""
    calm = signal(SignalKind.LB_RESPONSE, at, status=200, error_rate_per_s=0.0)
    return small_cascade.context(stage, key="prod/ml/llm@1", extra=(calm,))


def _live(gw: RunningNginx) -> Containment:
    limiter = NginxRateLimiter(gw.gateway)
    binding = ActuatorBinding(limiter, lambda step: limiter.plan(rate_limit_from_step(step)))
    return Containment(dry_run=False, actuators={"enable_rate_limit": binding})


def _incident(session: Session) -> Incident:
    """Store the small cascade's incident, its planned rate-limit step, the workload armed."""
    incident = service.get_or_create_incident(
        session=session,
        key="prod/ml/llm@1",
        namespace="ml",
        workload="llm",
        workload_kind="Deployment",
        cluster="prod",
        stage="cascading",
        opened_at=T0,
    )
    run = run_service.get_or_create_run(
        session=session, incident=incident, runbook=RATE_ONLY.name, version="1", mode="live"
    )
    (step,) = plan(RATE_ONLY, context("cascading", 30), dry_run=False)
    run_service.upsert_step(
        session=session,
        run=run,
        position=1,
        action=step.action,
        title=step.title,
        status=step.status,
        params=dict(step.params),
        approval=step.approval,
    )
    approvals.set_control(session=session, scope="ml/llm", name="armed", enabled=True, by="test")
    session.commit()
    return incident


def _tick(
    session: Session, incident: Incident, live: Containment, stage: str, dt: float
) -> list[str]:
    """Advance the steps at ``T0 + dt`` and commit; return the timeline events it added."""
    run = session.scalars(select(RunbookRun)).one()
    session.refresh(run)
    before = len(service.timeline(session=session, incident=incident))
    advance(session=session, incident=incident, run=run, runbook=RATE_ONLY,
            ctx=context(stage, dt), now=T0 + dt, containment=live)  # fmt: skip
    session.commit()
    entries = service.timeline(session=session, incident=incident)[before:]
    return [str((e.detail or {}).get("event")) for e in entries]


def test_armed_rate_limit_is_applied_relaxed_and_removed(
    nginx: RunningNginx, tmp_path: Path
) -> None:
    live = _live(nginx)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            incident = _incident(session)

            def tick(stage: str, dt: float) -> list[str]:
                return _tick(session, incident, live, stage, dt)

            assert tick("cascading", 31) == ["auto_approved", "applied"]
            applied = service.timeline(session=session, incident=incident)[-1]
            assert applied.detail is not None and applied.detail["mode"] == "live"
            assert "rate=150r/m" in applied.detail["diff"]
            counts, elapsed = burst(nginx.port)
            assert_limited(counts, elapsed, planned_rate_limit())

            # contained: the limit was sized for the pods left, it relaxes as they come back
            assert tick("contained", 100) == ["verified", "lifted"]  # x2, nginx -t and reload
            assert "rate=5r/s" in nginx.gateway.http_include.read_text()  # 300 r/m
            assert tick("contained", 130) == []  # not before the lift interval
            later = [e for dt in (500, 560, 620, 680) for e in tick("resolved", dt)]
            assert later[-1] == "removed" and set(later[:-1]) <= {"lifted"}, later
            assert nginx.gateway.http_include.read_text() == ""
            assert nginx.gateway.location_include.read_text() == ""
            assert burst(nginx.port)[0] == Counter({200: BURST_N})
            assert tick("resolved", 2000) == []  # nothing left to do
    finally:
        engine.dispose()
