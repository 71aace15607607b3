"""Plan a runbook against an incident: compute the variables, render every step. Pure.

``build_variables`` turns an IncidentContext into the plain values the parameter templates
read; ``plan`` renders each step of the runbook with them and attaches its approval status.
No clock, network or database: the same context always gives the same plan.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from detector.capacity.sizing import CeilingProposal, ceiling_from_evidence, coerce_float
from detector.correlate.context import IncidentContext
from detector.correlate.pattern import ENGINE_UP_KEYS
from detector.events.model import Signal, SignalKind
from detector.incidents.questions import engine_config
from detector.runbooks.definition import Action, Floors, Lift, OnFailure, Runbook, Step, Verify
from detector.runbooks.mechanism import diagnose
from detector.runbooks.rate_limits import GatewayLimits, Traffic, gateway_limits, traffic_before
from detector.runbooks.render import render_step

RATE_WINDOW_S = 60.0  # load-balancer lines counted in this window before the last victim
DEFAULT_SPACING_S = 120.0  # restart spacing when no model load time is in the logs
MAX_LOAD_S = 1800.0  # a start longer than this is not one model load (a stuck or crashed start)
# the gateway queues what the healthy capacity serves in this long rather than answering 429:
# clients and gateways that fail over or retry on 429 (the OpenAI SDK, LiteLLM, Kong's AI
# proxy) would turn the refusals into more load
QUEUE_WAIT_S = 10.0
NOTHING_LACKING = "nothing"  # a step's ``lacks`` param when its sizing had every input
DEFAULT_FLOORS = Floors(
    batch_ceiling=1, batched_tokens=512, rate_limit_rps=1, limit_connections=1, spacing_s=30.0
)


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """One rendered step of a plan.

    ``position`` is 1-based; ``params`` are the rendered parameter values (all str);
    ``status`` is ``dry_run`` in a dry run, else ``planned`` (policy ``auto``) or
    ``awaiting_approval`` (policy ``approval``); ``basis`` explains the numbers. ``policy``,
    ``approval_expiry_s`` (seconds a pending approval waits), ``lift`` (how a temporary
    measure is relaxed after the incident) and ``floors`` (the runbook's, merged with the
    defaults) are for the step machine.
    """

    position: int
    step_id: str
    action: Action
    title: str
    params: dict[str, str]
    approval: str
    status: str
    verify: Verify
    on_failure: OnFailure
    cooldown_s: float
    basis: str
    policy: str = "auto"
    approval_expiry_s: float = 600.0
    lift: Lift | None = None
    floors: Floors = DEFAULT_FLOORS
    when: tuple[str, ...] = ()  # the mechanisms the step answers (empty: any)

    @property
    def lacks(self) -> str | None:
        """Return what the step's sizing lacks (its ``lacks`` param), None when it lacks
        nothing; a step that lacks an input is not sized and never acts (``transitions``)."""
        value = self.params.get("lacks")
        return value if value and value != NOTHING_LACKING else None


def _merge_floors(floors: Floors | None) -> Floors:
    given = floors.model_dump(exclude_none=True) if floors is not None else {}
    return DEFAULT_FLOORS.model_copy(update=given)


def planned_step(
    runbook: Runbook, position: int, params: dict[str, str], status: str, title: str = ""
) -> PlannedStep:
    """Return the PlannedStep at ``position`` (1-based) from already rendered ``params``.

    For steps planned before and stored (``RunbookStep`` rows): the policy, verification,
    lift and floors come from the runbook, the params from the store. Raises IndexError when
    the runbook has no step at ``position``.
    """
    step = runbook.steps[position - 1]
    return PlannedStep(
        position=position,
        step_id=step.id,
        action=step.action,
        title=title or step.title,
        params=params,
        approval=step.approval,
        status=status,
        verify=step.verify,
        on_failure=step.on_failure,
        cooldown_s=step.cooldown_s,
        basis=params.get("basis", ""),
        policy=step.policy.value,
        approval_expiry_s=step.approval_expiry_s,
        lift=step.lift,
        floors=_merge_floors(runbook.floors()),
        when=tuple(step.when or ()),
    )


def last_victim_time(ctx: IncidentContext) -> float:
    """Return the first-OOM time of the last victim; else the latest OOM, signal, or opening."""
    ooms = [s for s in ctx.signals if s.kind is SignalKind.GPU_OOM]
    if ctx.victims:
        own = [s.time for s in ooms if s.pod == ctx.victims[-1]]
        if own:
            return min(own)
    if ooms:
        return max(s.time for s in ooms)
    return max((s.time for s in ctx.signals), default=ctx.opened_at)


def observed_upstream(signals: tuple[Signal, ...]) -> str | None:
    """Return the upstream most LB_RESPONSE lines name (first seen wins a tie), or None."""
    names = Counter(
        str(s.attrs["upstream"])
        for s in signals
        if s.kind is SignalKind.LB_RESPONSE and s.attrs.get("upstream")
    )
    return names.most_common(1)[0][0] if names else None


_FAILURES = frozenset(
    {SignalKind.GPU_OOM, SignalKind.ENGINE_DEAD, SignalKind.CRASH_LOOP, SignalKind.START_FAILED}
)


def observed_load_s(signals: tuple[Signal, ...]) -> tuple[float | None, str]:
    """Return the longest model load seen in the engine startup evidence, and where.

    Either logged as ``model_load_s`` (ENGINE_CONFIG attrs), or measured per pod from the
    engine's startup lines already parsed: an ENGINE_CONFIG line of arguments starts a load,
    the next line of the same pod that reports its KV cache (``ENGINE_UP_KEYS``: vLLM "GPU KV
    cache size", "Available KV cache memory", "# GPU blocks", "Maximum concurrency") ends it;
    a crash of the pod (GPU OOM, engine dead, crash loop) in between voids the start, since
    lines logged around a crash (a config dump) are no start of a load. Loads over
    ``MAX_LOAD_S`` are ignored. (None, "") when neither is there.
    """
    configs = [s for s in signals if s.kind is SignalKind.ENGINE_CONFIG]
    logged = [v for s in configs if (v := coerce_float(s.attrs.get("model_load_s"))) and v > 0]
    if logged:
        return max(logged), f"model load time {max(logged):g} s seen in the logs " + (
            f"(longest of {len(logged)})"
        )
    started: dict[str, float] = {}
    best: tuple[float, str, float, float] | None = None
    lines = [s for s in signals if s.kind is SignalKind.ENGINE_CONFIG or s.kind in _FAILURES]
    for sig in sorted(lines, key=lambda s: (s.time, s.kind is not SignalKind.ENGINE_CONFIG)):
        pod = sig.pod or ""
        if sig.kind in _FAILURES:  # a crash ends any load in progress: its lines start none
            started.pop(pod, None)
            continue
        if ENGINE_UP_KEYS.isdisjoint(sig.attrs):
            started.setdefault(pod, sig.time)
            continue
        start = started.pop(pod, None)
        if start is not None and 0 < sig.time - start <= MAX_LOAD_S:
            took = round(sig.time - start, 1)
            if best is None or took > best[0]:
                best = (took, pod, start, sig.time)
    if best is None:
        return None, ""
    took, pod, start, end = best
    return took, (
        f"model load time {took:g} s measured in pod {pod}'s startup lines (engine arguments "
        f"at {_hms(start)}, KV cache ready at {_hms(end)}; longest seen)"
    )


def _hms(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S")


def _spacing(signals: tuple[Signal, ...], floors: Floors) -> tuple[float, float | None, str]:
    load, seen = observed_load_s(signals)
    floor_s = floors.spacing_s or 0.0
    if load is not None:
        wanted, basis = float(math.ceil(load)), seen
        by = "the measured model load time"
    else:
        wanted = DEFAULT_SPACING_S
        basis = f"no model load time in the logs: default {DEFAULT_SPACING_S:g} s"
        by = "the default"
    spacing = max(floor_s, wanted)
    by = "the floor" if floor_s > wanted else by
    return (
        spacing,
        load,
        (f"{basis}; spacing = max(floor {floor_s:g} s, that) = {spacing:g} s, set by {by}"),
    )


def memory_headroom(signals: tuple[Signal, ...], pod: str) -> float | None:
    """Return the pod's latest memory headroom (0..1, free share), or None when unknown.

    KV-cache usage (engine_pressure ``kv_cache_usage``) is preferred, since engines that
    pre-reserve VRAM (vLLM, TGI, SGLang) sit near their reservation even when idle; then GPU
    memory (gpu_memory used/total or free/total), then the free/capacity bytes of its GPU OOM.
    """
    kv: list[tuple[float, float]] = []
    other: list[tuple[float, float]] = []
    for sig in signals:
        if sig.pod != pod:
            continue
        a = sig.attrs
        usage = coerce_float(a.get("kv_cache_usage"))
        if sig.kind is SignalKind.ENGINE_PRESSURE and usage is not None:
            kv.append((sig.time, 1.0 - usage))
            continue
        free = _FREE_SHARE[sig.kind](a) if sig.kind in _FREE_SHARE else None
        if free is not None:
            other.append((sig.time, free))
    chosen = kv or other
    return round(max(chosen)[1], 4) if chosen else None


def _free_share(a: dict[str, Any]) -> float | None:
    used, total, free = (
        coerce_float(a.get(k)) for k in ("used_bytes", "total_bytes", "free_bytes")
    )
    if total is None and used is not None and free is not None:
        total = used + free
    if not total:
        return None
    if free is not None:
        return max(0.0, min(1.0, free / total))
    return None if used is None else max(0.0, min(1.0, 1.0 - used / total))


def _oom_free_share(a: dict[str, Any]) -> float | None:
    free, capacity = coerce_float(a.get("free_bytes")), coerce_float(a.get("capacity_bytes"))
    return max(0.0, min(1.0, free / capacity)) if free is not None and capacity else None


_FREE_SHARE = {SignalKind.GPU_MEMORY: _free_share, SignalKind.GPU_OOM: _oom_free_share}


_READINGS = frozenset({SignalKind.GPU_MEMORY, SignalKind.ENGINE_PRESSURE})


def pods_now(signals: tuple[Signal, ...]) -> tuple[set[str], set[str]]:
    """Return (pods recovered, pods off the ceiling) as the latest evidence shows them.

    A pod recovered when, after its last failure (GPU OOM, engine dead, crash loop), it was
    seen Ready or its engine logged the end of its startup (the KV cache allocated: the model
    is loaded and the engine serves); a pod is off the ceiling when its latest memory or
    engine-pressure reading carries no ``pressure`` mark.
    """
    failed: dict[str, float] = {}
    ready: dict[str, float] = {}
    reading: dict[str, Signal] = {}
    for s in signals:
        if not s.pod:
            continue
        if s.kind in _FAILURES:
            failed[s.pod] = max(s.time, failed.get(s.pod, s.time))
        elif s.kind is SignalKind.POD_READY or (
            s.kind is SignalKind.ENGINE_CONFIG and not ENGINE_UP_KEYS.isdisjoint(s.attrs)
        ):
            ready[s.pod] = max(s.time, ready.get(s.pod, s.time))
        elif s.kind in _READINGS and (s.pod not in reading or s.time >= reading[s.pod].time):
            reading[s.pod] = s
    recovered = {p for p, t in ready.items() if t > failed.get(p, float("-inf"))}
    cooled = {p for p, s in reading.items() if "pressure" not in s.attrs}
    return recovered, cooled


def zombies(ctx: IncidentContext) -> list[str]:
    """Return the victims whose engine is dead while their server takes requests (the
    correlator's ENGINE_DEAD evidence with ``zombie``) and not seen started since; pure."""
    recovered, _ = pods_now(ctx.signals)
    found = [
        s.pod
        for s in ctx.signals
        if s.kind is SignalKind.ENGINE_DEAD and s.attrs.get("zombie") and s.pod
    ]
    return [p for p in dict.fromkeys(found) if p not in recovered]


def restart_plan(ctx: IncidentContext) -> tuple[list[str], list[str], str]:
    """Return (crashed pods, healthy pods at the ceiling, basis) in restart order; pure.

    Only pods still down or still at the ceiling as the evidence stands now (``pods_now``). Crashed
    pods (the victims) come first, zombies first of all (``zombies``: they take requests they never
    answer and nothing else restarts them), then in the order they died (their first GPU OOM in
    event time, not the order a process happened to read them in): they serve nothing, so restarting
    them costs no capacity, and a restart starts from an empty GPU, so the memory they had before
    does not matter (the order also stays the same for a process that took over the workload and saw
    fewer of their readings). Then the healthy pods whose memory pressure reached a ceiling (the
    correlator marks those signals with ``pressure``): the next victims, restarted under the lowered
    ceiling, the most memory headroom first (``memory_headroom``), pods of unknown headroom last,
    ties in order of first sight.
    """
    recovered, cooled = pods_now(ctx.signals)
    died: dict[str, float] = {}  # each victim's first GPU OOM in event time
    for s in ctx.signals:
        if s.kind is SignalKind.GPU_OOM and s.pod and s.time < died.get(s.pod, float("inf")):
            died[s.pod] = s.time
    rank = {p: i for i, p in enumerate(ctx.victims)}
    undead = zombies(ctx)
    victims = sorted(
        (p for p in ctx.victims if p not in recovered),
        key=lambda p: (p not in undead, died.get(p, float("inf")), rank[p]),
    )
    at_ceiling = [
        p
        for p in dict.fromkeys(s.pod for s in ctx.signals if s.pod and "pressure" in s.attrs)
        if p not in ctx.victims and p not in cooled
    ]
    headroom = {p: memory_headroom(ctx.signals, p) for p in at_ceiling}

    def ordered(pods: list[str]) -> list[str]:
        rank = {p: i for i, p in enumerate(pods)}
        return sorted(pods, key=lambda p: (headroom[p] is None, -(headroom[p] or 0.0), rank[p]))

    crashed, healthy = victims, ordered(at_ceiling)
    shown = ", ".join(
        f"{p} {'?' if headroom[p] is None else format(headroom[p], '.1%')}" for p in healthy
    )
    zombie_note = f" (zombies first: {', '.join(undead)})" if undead else ""
    basis = (
        f"{len(crashed)} crashed pod(s) first{zombie_note}, in the order they died, then "
        f"{len(healthy)} "
        f"healthy pod(s) at the memory ceiling, the most memory headroom first: "
        f"{shown or 'none'}"
    )
    return crashed, healthy, basis


def build_variables(
    ctx: IncidentContext, *, floors: Floors | None = None, gateway: str | None = None
) -> dict[str, Any]:
    """Return the template variables for an incident: plain str/int/float/list/dict/None values.

    Keys: namespace, workload, workload_kind, cluster, stage, victims, victim_count,
    replicas_seen, healthy_replicas, engine, current (latest engine_config attrs), ceiling
    (CeilingProposal fields plus current_is_default), proposed ({param: value}), ceiling_basis,
    window_s, request_count, request_rate_per_s, ok_rate_per_s, error_rate_per_s,
    rate_limited_per_s, clients_seen, client_max_rate_per_s, gateway_replicas_seen, the 429
    step's sizing (``detector.runbooks.rate_limits``: aggregate_budget_rps, aggregate_limit_rpm,
    aggregate_connections; rate_limit_rps and limit_connections per client IP and controller
    replica; aggregate_bound_rps and aggregate_bound_connections, what those allow for the
    clients seen), rate_limit_basis, rate_limit_lacks (what that sizing lacks, an unknown
    budget: the step's ``lacks``; ``NOTHING_LACKING`` when sized), queue_burst and
    queue_wait_s (the requests over the budget the gateway queues, ``QUEUE_WAIT_S`` of it),
    ingress_name, upstream, restart_order
    (crashed_pods then healthy_restarts, see ``restart_plan``), zombie_pods (``zombies``),
    restart_order_basis,
    spacing_s, model_load_s, spacing_basis, gateway (the configured 429 gateway, "" when
    none), and the failure mechanism (``detector.runbooks.mechanism.diagnose``): mechanism,
    mechanism_evidence, max_body_bytes and refused_share (the quarantine's bound and what it
    refuses),
    evidence_until, class_victims. Rates are per second.
    """
    floors = _merge_floors(floors)
    victims = list(ctx.victims)
    seen_pods = set(ctx.pods_seen) | set(victims)
    healthy = len(seen_pods - set(victims))
    config = engine_config(ctx.signals).values
    ceiling = ceiling_from_evidence(
        config, floor=floors.batch_ceiling or 1, batched_tokens_floor=floors.batched_tokens or 1
    )
    traffic = traffic_before(ctx.signals, last_victim_time(ctx), RATE_WINDOW_S)
    limits = gateway_limits(
        traffic,
        healthy,
        len(seen_pods),
        ceiling,
        rps_floor=floors.rate_limit_rps or 1,
        connections_floor=floors.limit_connections or 1,
        gateway=gateway,
    )
    queue = math.ceil(limits.budget_rps * QUEUE_WAIT_S) if limits.budget_rps else 0
    spacing, load, spacing_basis = _spacing(ctx.signals, floors)
    crashed, healthy_restarts, order_basis = restart_plan(ctx)
    diagnosis = diagnose(ctx)
    return {
        "mechanism": diagnosis.mechanism.value,
        "mechanism_evidence": diagnosis.evidence,
        "max_body_bytes": diagnosis.max_body_bytes,
        "refused_share": diagnosis.refused_share,
        "evidence_until": diagnosis.evidence_until,
        "class_victims": list(diagnosis.class_victims),
        "gateway": gateway or "",
        "namespace": ctx.namespace,
        "workload": ctx.workload,
        "workload_kind": ctx.workload_kind,
        "cluster": ctx.cluster,
        "stage": ctx.stage,
        "victims": victims,
        "victim_count": len(victims),
        "replicas_seen": len(seen_pods),
        "healthy_replicas": healthy,
        "current": dict(config),
        **_ceiling_variables(ceiling),
        **_traffic_variables(traffic),
        **_limit_variables(limits),
        "queue_burst": queue,
        "queue_wait_s": QUEUE_WAIT_S,
        "ingress_name": ctx.workload,
        "upstream": observed_upstream(ctx.signals),
        "restart_order": crashed + healthy_restarts,
        "crashed_pods": crashed,
        "zombie_pods": zombies(ctx),
        "healthy_restarts": healthy_restarts,
        "restart_order_basis": order_basis,
        "spacing_s": spacing,
        "model_load_s": load,
        "spacing_basis": spacing_basis,
    }


def _ceiling_variables(ceiling: CeilingProposal) -> dict[str, Any]:
    proposed = {ceiling.param: ceiling.proposed}
    if ceiling.batched_tokens_param and ceiling.batched_tokens_proposed is not None:
        proposed[ceiling.batched_tokens_param] = ceiling.batched_tokens_proposed
    return {
        "engine": ceiling.engine,
        "ceiling": {**asdict(ceiling), "current_is_default": ceiling.current_is_default},
        "proposed": proposed,
        "ceiling_basis": ceiling.basis,
    }


def _traffic_variables(traffic: Traffic) -> dict[str, Any]:
    return {
        "window_s": traffic.window_s,
        "request_count": traffic.requests,
        "request_rate_per_s": traffic.rate(traffic.requests),
        "ok_rate_per_s": traffic.rate(traffic.ok),
        "error_rate_per_s": traffic.rate(traffic.errors_5xx),
        "rate_limited_per_s": traffic.rate(traffic.rate_limited),
        "clients_seen": traffic.clients,
        "client_max_rate_per_s": traffic.client_max_rate_per_s,
        "gateway_replicas_seen": traffic.proxies,
    }


def _limit_variables(limits: GatewayLimits) -> dict[str, Any]:
    return {
        "aggregate_budget_rps": limits.budget_rps,
        "aggregate_limit_rpm": limits.aggregate_rpm,
        "aggregate_connections": limits.aggregate_connections,
        "rate_limit_rps": limits.per_client_rps,
        "limit_connections": limits.per_client_connections,
        "aggregate_bound_rps": limits.bound_rps,
        "aggregate_bound_connections": limits.bound_connections,
        "rate_limit_basis": limits.basis,
        "rate_limit_lacks": limits.lacks or NOTHING_LACKING,
    }


_BASIS_KEY = {
    Action.QUARANTINE_REQUESTS: "mechanism_evidence",
    Action.LOWER_BATCH_CEILING: "ceiling_basis",
    Action.ENABLE_RATE_LIMIT: "rate_limit_basis",
    Action.STAGGER_RESTARTS: "spacing_basis",
}


def _status(step: Step, dry_run: bool) -> str:
    if dry_run:
        return "dry_run"
    return "planned" if step.policy == "auto" else "awaiting_approval"


def plan(
    runbook: Runbook, ctx: IncidentContext, *, dry_run: bool = True, gateway: str | None = None
) -> list[PlannedStep]:
    """Render every step of ``runbook`` for ``ctx``, in order; pure.

    ``gateway`` is the 429 gateway the settings configure (``nginx``, ``ingress-nginx``,
    ``kong``, ``envoy``, ``envoy-gateway``; None: none, the plan says what each would do).
    Raises RunbookError (from rendering) naming the step and param that failed.
    """
    floors = _merge_floors(runbook.floors())
    variables = build_variables(ctx, floors=floors, gateway=gateway)
    return [
        PlannedStep(
            position=position,
            step_id=step.id,
            action=step.action,
            title=step.title,
            params=render_step(step, variables),
            approval=step.approval,
            status=_status(step, dry_run),
            verify=step.verify,
            on_failure=step.on_failure,
            cooldown_s=step.cooldown_s,
            basis=str(variables[_BASIS_KEY[step.action]]),
            policy=step.policy.value,
            approval_expiry_s=step.approval_expiry_s,
            lift=step.lift,
            floors=floors,
            when=tuple(step.when or ()),
        )
        for position, step in enumerate(runbook.steps, start=1)
    ]
