"""A kill -9 between an actuator's call and the record of its result keeps the undo.

The step runner commits the plan of a step's first live apply (its ``before``) before it calls
the actuator (``runner._write_ahead``). Here the process is killed (SIGKILL, in a forked child
on the same store) right after the actuator changed the target and before anything recorded
it; a restarted process finds the change in place, records it without making it twice, and at
``resolved`` puts the target back exactly as it was before the incident: a real nginx (its
include files) and the Kubernetes API stand-in (an Ingress's ingress-nginx annotations).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from pathlib import Path
from signal import SIGKILL

from kube_fake import FakeKube, api, kube
from small_cascade import T0, signal
from sqlalchemy import select
from sqlalchemy.orm import Session
from test_nginx_actuator import BURST_N, RunningNginx, burst, nginx

from detector import db
from detector.actuators.base import Plan
from detector.actuators.kubernetes.api import KubeApi
from detector.actuators.nginx.limiter import NginxRateLimiter
from detector.config import KubernetesSettings
from detector.correlate.context import IncidentContext
from detector.events.model import SignalKind
from detector.incidents import service
from detector.incidents.models import Incident
from detector.runbooks import approvals, runner
from detector.runbooks import service as run_service
from detector.runbooks.bindings.base import ActuatorBinding, StepActuator
from detector.runbooks.bindings.kubernetes import ingress_limits
from detector.runbooks.bindings.nginx import rate_limit_from_step
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.models import RunbookRun
from detector.runbooks.planner import plan
from detector.runbooks.runner import Containment, advance
from detector.runbooks.transitions import Move, Transition

__all__ = ["api", "kube", "nginx"]  # fixtures, used by name
RUNBOOK = load_runbook(default_runbook_path())
RATE_ONLY = RUNBOOK.model_copy(update={"steps": (RUNBOOK.step("enable_rate_limit"),)})
INGRESS = "/apis/networking.k8s.io/v1/namespaces/ml/ingresses/llm"


def context(stage: str, at: float) -> IncidentContext:
    """The small cascade at ``stage``, with a clean LB window ``at`` s after the first OOM."""
    import small_cascade

    calm = signal(SignalKind.LB_RESPONSE, at, status=200, error_rate_per_s=0.0)
    return small_cascade.context(stage, key="prod/ml/llm@1", extra=(calm,))


def _incident(session: Session, gateway: str) -> Incident:
    """Store the small cascade's incident and its planned rate-limit step, the workload armed
    (idempotent: a restarted process reads what is there)."""
    incident = service.get_or_create_incident(
        session=session, key="prod/ml/llm@1", namespace="ml", workload="llm",
        workload_kind="Deployment", cluster="prod", stage="cascading", opened_at=T0,
    )  # fmt: skip
    run = run_service.get_or_create_run(
        session=session, incident=incident, runbook=RATE_ONLY.name, version="1", mode="live"
    )
    if not run.steps:
        (step,) = plan(RATE_ONLY, context("cascading", 30), dry_run=False, gateway=gateway)
        run_service.upsert_step(
            session=session, run=run, position=1, action=step.action, title=step.title,
            status=step.status, params=dict(step.params), approval=step.approval,
        )  # fmt: skip
    approvals.set_control(session=session, scope="ml/llm", name="armed", enabled=True, by="test")
    session.commit()
    return incident


def _tick(session: Session, incident: Incident, live: Containment, stage: str, dt: float) -> None:
    run = session.scalars(select(RunbookRun)).one()
    session.refresh(run)
    advance(session=session, incident=incident, run=run, runbook=RATE_ONLY,
            ctx=context(stage, dt), now=T0 + dt, containment=live)  # fmt: skip
    session.commit()


def _killed_after_the_apply(url: str, live: Containment, gateway: str) -> None:
    """Apply the step, then die by SIGKILL before anything records it (a forked child)."""
    real = runner.act

    def act(t: Transition, c: Containment, prepared: Plan | None = None) -> Transition:
        done = real(t, c, prepared)
        if t.live and t.move is Move.APPLY:
            os.kill(os.getpid(), SIGKILL)
        return done

    runner.act = act  # type: ignore[assignment]
    with db.session_factory(db.make_engine(url))() as session:
        _tick(session, _incident(session, gateway), live, "cascading", 31)


def _crash(tmp_path: Path, actuator: StepActuator, gateway: str) -> tuple[str, Containment]:
    """Kill a process after its apply; return the store's URL and the containment."""
    live = Containment(dry_run=False, actuators={"enable_rate_limit": actuator}, gateway=gateway)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db.upgrade(url)
    child = multiprocessing.get_context("fork").Process(
        target=_killed_after_the_apply, args=(url, live, gateway)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -SIGKILL
    return url, live


def _crash_then_resolve(tmp_path: Path, actuator: StepActuator, gateway: str) -> None:
    """Kill the process after the apply, restart on the same store, resolve the incident."""
    url, live = _crash(tmp_path, actuator, gateway)
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            incident = _incident(session, gateway)
            _tick(session, incident, live, "cascading", 31)
            events = [(e.detail or {}).get("event") for e in service.timeline(
                session=session, incident=incident)]  # fmt: skip
            assert events.count("applied") == 1, events
            _tick(session, incident, live, "contained", 100)
            for dt in (500, 560, 620, 680):
                _tick(session, incident, live, "resolved", dt)
            events = [(e.detail or {}).get("event") for e in service.timeline(
                session=session, incident=incident)]  # fmt: skip
            assert events[-1] == "removed", events
    finally:
        engine.dispose()


def test_nginx_limit_applied_then_killed_is_removed_at_resolved(
    nginx: RunningNginx, tmp_path: Path
) -> None:
    limiter = NginxRateLimiter(nginx.gateway)
    binding = ActuatorBinding(limiter, lambda step: limiter.plan(rate_limit_from_step(step)))
    _crash_then_resolve(tmp_path, binding, "nginx")
    assert nginx.gateway.http_include.read_text() == ""
    assert nginx.gateway.location_include.read_text() == ""
    assert burst(nginx.port)[0] == Counter({200: BURST_N})


def test_ingress_annotations_applied_then_killed_are_restored_at_resolved(
    kube: FakeKube, api: KubeApi, tmp_path: Path
) -> None:
    existing = {"nginx.ingress.kubernetes.io/limit-connections": "50", "owner": "ml"}
    meta = {"name": "llm", "namespace": "ml", "annotations": existing}
    original = kube.get(kube.put({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                                  "metadata": meta}))  # fmt: skip
    _crash_then_resolve(tmp_path, ingress_limits(api, KubernetesSettings()), "ingress-nginx")
    final = kube.get(INGRESS)
    assert original is not None and final is not None
    assert final["metadata"]["annotations"] == original["metadata"]["annotations"]


def test_a_step_that_ends_without_its_apply_on_record_undoes_it(
    kube: FakeKube, api: KubeApi, tmp_path: Path
) -> None:
    """Restarted only once the incident resolved, the process withdraws the approved step,
    whose apply never reached the record: the annotations it wrote are put back."""
    meta = {"name": "llm", "namespace": "ml", "annotations": {"owner": "ml"}}
    kube.put({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta})
    url, live = _crash(tmp_path, ingress_limits(api, KubernetesSettings()), "ingress-nginx")
    limited = kube.get(INGRESS)
    assert limited is not None and "nginx.ingress.kubernetes.io/limit-rps" in str(limited)
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            incident = _incident(session, "ingress-nginx")
            _tick(session, incident, live, "resolved", 900)
            last = service.timeline(session=session, incident=incident)[-1]
            assert "was undone" in last.message, last.message
    finally:
        engine.dispose()
    final = kube.get(INGRESS)
    assert final is not None and final["metadata"]["annotations"] == {"owner": "ml"}
