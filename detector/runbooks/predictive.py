"""Predictive containment: the gateway limit at ``suspected`` when the next victim is near. Pure.

A cascade goes on as long as each death moves its load to survivors that die before the dead
pods can serve again. When the next-victim forecast (``IncidentContext.next_victim``,
:mod:`detector.correlate.forecast`) says a survivor reaches its pressure ceiling sooner than a
restarted pod can serve (``restart_ready_s``), waiting for the second death to plan is waiting
for the cascade: with ``DETECTOR_CONTAINMENT__PREDICTIVE=true`` the runbook's gateway limit
(``enable_rate_limit``) is planned and applied at ``suspected`` (``early_limit`` says why;
``detector.runbooks.flows.ContainmentFlows.follow`` acts on it).
"""

from __future__ import annotations

from typing import Final

from detector.correlate.context import IncidentContext
from detector.correlate.pattern import ENGINE_UP_KEYS
from detector.events.model import Signal, SignalKind
from detector.runbooks.health import hms
from detector.runbooks.planner import observed_load_s

# the kubelet's first back-off before it restarts a crashed container (then doubling, up to
# 5 min): https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-restarts
CRASHLOOP_FIRST_BACKOFF_S: Final = 10.0
DEFAULT_RESTART_READY_S: Final = 130.0  # 120 s of model load + the first back-off


def _serving(sig: Signal) -> bool:
    """Return True for a signal that says its pod serves: Ready, or its engine's KV cache up."""
    if sig.kind is SignalKind.POD_READY:
        return True
    return sig.kind is SignalKind.ENGINE_CONFIG and not ENGINE_UP_KEYS.isdisjoint(sig.attrs)


def restart_ready_s(ctx: IncidentContext, default_s: float) -> tuple[float, str]:
    """Return how long a restarted pod needs to serve again (seconds), and where that is from.

    In order: a victim seen serving again (pod Ready, or its engine's KV cache allocated:
    ``pattern.on_engine_back``) after its first GPU OOM, the longest such gap; the model load
    measured in the engine's startup lines (``planner.observed_load_s``) plus the first
    CrashLoopBackOff back-off; else ``default_s``.
    """
    died: dict[str, float] = {}
    for sig in ctx.signals:
        if sig.kind is SignalKind.GPU_OOM and sig.pod in ctx.victims:
            died[sig.pod] = min(died.get(sig.pod, sig.time), sig.time)
    back: dict[str, float] = {}
    for sig in ctx.signals:
        pod = sig.pod or ""
        if pod in died and sig.time > died[pod] and _serving(sig):
            back[pod] = min(back.get(pod, sig.time), sig.time)
    if back:
        pod = max(back, key=lambda p: back[p] - died[p])
        took = back[pod] - died[pod]
        return took, f"pod {pod} served again {took:.0f} s after its GPU OOM"
    load, basis = observed_load_s(ctx.signals)
    if load is not None:
        return load + CRASHLOOP_FIRST_BACKOFF_S, (
            f"{basis} + the first CrashLoopBackOff back-off {CRASHLOOP_FIRST_BACKOFF_S:g} s"
        )
    return default_s, f"no restart or model load in the evidence: default {default_s:g} s"


def early_limit(ctx: IncidentContext, now: float, default_ready_s: float) -> str | None:
    """Return why the gateway limit goes on at event time ``now``, ahead of the cascade; None
    unless the incident is ``suspected`` and its next victim reaches its ceiling before a
    restarted pod can serve again (``restart_ready_s``; ``default_ready_s`` when the evidence
    does not tell)."""
    nxt = ctx.next_victim
    if ctx.stage != "suspected" or nxt is None or nxt.pod in ctx.victims:
        return None
    left = max(0.0, nxt.reaches_at - now)
    ready, basis = restart_ready_s(ctx, default_ready_s)
    if left >= ready:
        return None
    return (
        f"predictive: pod {nxt.pod} reaches its pressure ceiling in ~{left:.0f} s (forecast at "
        f"{hms(nxt.fitted_at)}), before a restarted pod can serve again in ~{ready:.0f} s "
        f"({basis}): the gateway limit goes on at suspected"
    )
