"""A small cascade for the containment tests, shared by unit and integration tests.

Workload ml/llm has 4 pods; llm-a and llm-b died of GPU OOM 30 s apart; in the 30 s before,
300 ok responses came in (5 per second). The shipped runbook plans 2 requests per second for
it: floor(5 x 2 serving / 4 seen).
"""

from __future__ import annotations

from detector.correlate.context import IncidentContext
from detector.events.model import Signal, SignalKind, SourcePos
from detector.runbooks.definition import Action
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import PlannedStep, plan

T0 = 1_714_564_800.0  # the first victim's OOM, Unix seconds


def signal(kind: SignalKind, dt: float, pod: str | None = None, **attrs: object) -> Signal:
    """Return a signal of ml/llm ``dt`` seconds after T0."""
    source = SourcePos("recorded/ml.log", int(dt) + 1000)
    return Signal(kind=kind, time=T0 + dt, source=source, namespace="ml", pod=pod, attrs=attrs)


def context(
    stage: str = "cascading", *, key: str = "prod/ml/llm", extra: tuple[Signal, ...] = ()
) -> IncidentContext:
    """Return the incident's context at ``stage``, with ``extra`` signals after the cascade."""
    signals = (
        *(signal(SignalKind.LB_RESPONSE, -29 + i * 0.5, status=200, count=3) for i in range(100)),
        signal(SignalKind.GPU_OOM, 0, "llm-a"),
        signal(SignalKind.GPU_OOM, 30, "llm-b"),
        *extra,
    )
    return IncidentContext(
        key=key,
        namespace="ml",
        workload="llm",
        workload_kind="Deployment",
        stage=stage,
        opened_at=T0,
        victims=("llm-a", "llm-b"),
        pods_seen=("llm-a", "llm-b", "llm-c", "llm-d"),
        signals=tuple(sorted(signals, key=lambda s: s.time)),
    )


def rate_step() -> PlannedStep:
    """Return the shipped runbook's planned enable_rate_limit step for the cascade."""
    steps = plan(load_runbook(default_runbook_path()), context(), dry_run=False)
    return next(step for step in steps if step.action is Action.ENABLE_RATE_LIMIT)
