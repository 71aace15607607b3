"""The cascade pattern's rules: open, escalate, contain and resolve incidents; verdicts.

Each rule takes the workload's state, the signal or clock, and the settings, mutates the
state and returns the decisions it made. Pure: no I/O, time passed in.
"""

from __future__ import annotations

from detector.config import CorrelateSettings
from detector.correlate.state import (
    NOT_THIS_PATTERN,
    Decision,
    EvidenceAdded,
    IncidentOpened,
    IncidentState,
    Stage,
    StageChanged,
    VerdictRecorded,
    VictimAdded,
    WorkloadState,
)
from detector.events.model import Signal


def attach(
    inc: IncidentState, kind: str, signal: Signal, summary: str, cfg: CorrelateSettings
) -> list[Decision]:
    """Attach ``signal`` as evidence of ``kind`` unless the kind's cap is reached."""
    if inc.evidence_counts[kind] >= cfg.max_evidence_per_kind:
        return []
    inc.evidence_counts[kind] += 1
    inc.signals.append(signal)
    return [EvidenceAdded(inc.key, kind, signal, summary)]


def attach_config(inc: IncidentState, sig: Signal, cfg: CorrelateSettings) -> list[Decision]:
    """Attach an engine configuration signal unless the pod already logged the same values."""
    seen = (sig.pod or "", repr(sorted(sig.attrs.items())))
    if seen in inc.seen_configs:
        return []
    inc.seen_configs.add(seen)
    return attach(inc, "engine_config", sig, config_summary(sig), cfg)


ENGINE_UP_KEYS = frozenset({"kv_cache_tokens", "kv_cache_bytes", "gpu_blocks", "max_concurrency"})


def on_engine_back(ws: WorkloadState, sig: Signal, cfg: CorrelateSettings) -> list[Decision]:
    """Attach a victim's engine startup end (its KV cache allocated) after its last GPU OOM.

    The engine serves again: recovery evidence of kind ``pod_ready``, once per restart, even
    when the engine logs the same values as before its crash.
    """
    inc, pod = ws.incident, sig.pod or ""
    last_oom = ws.last_oom.get(pod)
    if inc is None or pod not in inc.victims or last_oom is None or sig.time <= last_oom:
        return []
    if ENGINE_UP_KEYS.isdisjoint(sig.attrs) or (pod, f"up@{last_oom}") in inc.seen_configs:
        return []
    inc.seen_configs.add((pod, f"up@{last_oom}"))
    return attach(inc, "pod_ready", sig, f"pod {pod}: engine started again (KV cache ready)", cfg)


def on_gpu_oom(ws: WorkloadState, sig: Signal, cfg: CorrelateSettings) -> list[Decision]:
    """Apply a GPU OOM of one pod: open an incident, add a victim, or escalate."""
    pod = sig.pod or "?"
    last = ws.last_oom.get(pod)
    new_death = last is None or sig.time - last > cfg.oom_dedupe_s
    ws.last_oom[pod] = sig.time
    ws.last_gpu_oom_at = sig.time
    out: list[Decision] = []
    inc = ws.incident
    if inc is None:
        inc, out = open_incident(ws, sig.time, f"GPU OOM in pod {pod}", cfg)
    if new_death:
        out += attach(inc, "gpu_oom", sig, oom_summary(sig), cfg)
        inc.last_oom_at = max(inc.last_oom_at, sig.time)
    if pod not in inc.victims:
        inc.victims[pod] = sig.time
        out.append(VictimAdded(inc.key, pod, sig.time, len(inc.victims)))
        pressure = ws.pressure_of(pod)
        if pressure is not None and sig.time - pressure.time <= cfg.window_s:
            out += attach(inc, "gpu_memory", pressure, pressure_summary(pressure), cfg)
    if not new_death:
        return out
    first_time = next(iter(inc.victims.values()))
    recent = [p for p, t in inc.victims.items() if sig.time - t <= cfg.window_s]
    if len(recent) >= 2 and inc.stage is not Stage.CASCADING:
        reason = (
            f"pod {pod} died of GPU OOM {sig.time - first_time:.0f} s after the first victim; "
            f"{len(inc.victims)} pods of {ws.ref.name} down"
        )
        out += set_stage(inc, Stage.CASCADING, sig.time, reason)
    elif inc.stage is Stage.CONTAINED:
        out += set_stage(inc, Stage.SUSPECTED, sig.time, f"new GPU OOM in pod {pod}")
    return out


def open_incident(
    ws: WorkloadState, time: float, reason: str, cfg: CorrelateSettings
) -> tuple[IncidentState, list[Decision]]:
    """Open a ``suspected`` incident and attach the context seen before it."""
    key = f"{ws.ref.label}@{int(time)}"
    inc = IncidentState(key=key, stage=Stage.SUSPECTED, opened_at=time, last_oom_at=time)
    ws.incident = inc
    ws.sizes.reset()
    ws.dead_addrs.clear()
    out: list[Decision] = [IncidentOpened(key, ws.ref, time)]
    out.append(StageChanged(key, Stage.SUSPECTED, time, reason))
    for sig in ws.engine_config.values():
        out += attach_config(inc, sig, cfg)
    for sig in ws.crash_loops:
        if time - sig.time <= cfg.window_s:
            out += attach(inc, "crash_loop", sig, crash_summary(sig), cfg)
    if ws.errors_above_source is not None:
        src = ws.errors_above_source
        out += attach(inc, "lb_errors", src, src.attrs.get("summary", "5xx surge"), cfg)
    return inc, out


def set_stage(inc: IncidentState, stage: Stage, time: float, reason: str) -> list[Decision]:
    """Move the incident to ``stage`` (no-op if already there)."""
    if inc.stage is stage:
        return []
    inc.stage = stage
    inc.contained_at = time if stage is Stage.CONTAINED else None
    return [StageChanged(inc.key, stage, time, reason)]


def on_clock(ws: WorkloadState, now: float, cfg: CorrelateSettings) -> list[Decision]:
    """Apply the passage of event time: contained after a calm period, then resolved."""
    inc = ws.incident
    if inc is None:
        return []
    ws.lb.advance(now)
    if inc.stage in (Stage.SUSPECTED, Stage.CASCADING):
        calm = now - inc.last_oom_at >= cfg.contained_after_s and ws.errors_above_since is None
        if calm:
            reason = (
                f"no new GPU OOM for {now - inc.last_oom_at:.0f} s and 5xx under threshold "
                f"({ws.lb.error_rate_per_s:.1f}/s)"
            )
            return set_stage(inc, Stage.CONTAINED, now, reason)
    elif inc.stage is Stage.CONTAINED and now - (inc.contained_at or now) >= cfg.quiet_s:
        ws.incident = None
        return set_stage(inc, Stage.RESOLVED, now, f"quiet for {cfg.quiet_s:.0f} s")
    return []


def on_surge_sustained(ws: WorkloadState, now: float, cfg: CorrelateSettings) -> list[Decision]:
    """Decide what a sustained 5xx surge means for the workload."""
    src = ws.errors_above_source
    assert src is not None
    inc = ws.incident
    survivors = ws.pods_at_ceiling(now, cfg.window_s)
    causes = _recent_crash_causes(ws, now, cfg)
    if inc is None:  # a pod that died of a known non-memory cause is no survivor at a ceiling
        survivors = {p: s for p, s in survivors.items() if p not in causes}
    if inc is not None:
        survivors = {p: s for p, s in survivors.items() if p not in inc.victims}
        if inc.stage is Stage.SUSPECTED and inc.victims and survivors:
            pods = ", ".join(sorted(survivors))
            reason = (
                f"5xx above threshold for {cfg.sustain_s:.0f} s after the first GPU OOM "
                f"while survivors' memory is at the ceiling ({pods})"
            )
            return set_stage(inc, Stage.CASCADING, now, reason)
        return []
    if survivors:
        pods = ", ".join(sorted(survivors))
        inc, out = open_incident(ws, now, f"memory at the ceiling ({pods}) while 5xx rise", cfg)
        for sig in survivors.values():
            out += attach(inc, "gpu_memory", sig, pressure_summary(sig), cfg)
        return out
    recent_oom = ws.last_gpu_oom_at is not None and now - ws.last_gpu_oom_at <= cfg.window_s
    recent_host = ws.last_host_oom_at is not None and now - ws.last_host_oom_at <= cfg.window_s
    if recent_oom or recent_host:
        return []
    note = f"; {ws.reservation_note}" if ws.reservation_note else ""
    if causes:
        last = ws.crash_verdict_at
        if last is not None and now - last <= cfg.window_s:
            return []  # the same crash loop's next surge: its verdict stands
        ws.crash_verdict_at = now
        return [crash_cause_verdict(ws, causes, now, cfg, note)]
    reason = (
        f"{src.attrs.get('summary', '5xx surge')} sustained for {cfg.sustain_s:.0f} s "
        f"with no GPU OOM and no memory pressure in {ws.ref.label}: "
        "a failing upstream or dependency, not a GPU OOM cascade" + note
    )
    key = f"{ws.ref.label}:lb_5xx_without_gpu_oom@{int(ws.errors_above_since or now)}"
    return [VerdictRecorded(ws.ref, NOT_THIS_PATTERN, reason, now, src.source, key)]


def _recent_crash_causes(
    ws: WorkloadState, now: float, cfg: CorrelateSettings
) -> dict[str, Signal]:
    """Return pod -> its known non-memory crash cause seen within the window, no GPU OOM since."""
    out: dict[str, Signal] = {}
    for pod, sig in ws.crash_causes.items():
        last_oom = ws.last_oom.get(pod)
        if now - sig.time <= cfg.window_s and (last_oom is None or last_oom < sig.time - 60.0):
            out[pod] = sig
    return out


def crash_cause_verdict(
    ws: WorkloadState, causes: dict[str, Signal], now: float, cfg: CorrelateSettings, note: str
) -> VerdictRecorded:
    """Return the verdict for 5xx from pods that died of known non-memory causes."""
    by_cause: dict[str, list[str]] = {}
    for pod, sig in sorted(causes.items()):
        by_cause.setdefault(str(sig.attrs.get("cause_text") or "a known fault"), []).append(pod)
    named = "; ".join(
        f"{cause} in pod{'s' if len(pods) > 1 else ''} {', '.join(pods)}"
        for cause, pods in by_cause.items()
    )
    looping = sorted({c.pod for c in ws.crash_loops if c.pod and now - c.time <= cfg.window_s})
    loop = f"; crash loop of {', '.join(looping)}" if looping else ""
    src = ws.errors_above_source
    surge = src.attrs.get("summary", "5xx surge") if src is not None else "5xx surge"
    reason = (
        f"pods crashed of a known non-memory cause: {named}{loop}; {surge}; "
        "no GPU out-of-memory error in their logs: not a GPU OOM cascade" + note
    )
    first = min(causes.values(), key=lambda s: s.time)
    key = f"{ws.ref.label}:crash_cause@{int(ws.errors_above_since or now)}"
    return VerdictRecorded(ws.ref, NOT_THIS_PATTERN, reason, now, first.source, key)


def on_host_oom(ws: WorkloadState, sig: Signal, cfg: CorrelateSettings) -> list[Decision]:
    """Record a host-RAM OOM look-alike verdict once per episode."""
    ws.last_host_oom_at = sig.time
    if ws.host_oom_since is not None and sig.time - ws.host_oom_since <= cfg.window_s:
        return []
    ws.host_oom_since = sig.time
    reason_attr = sig.attrs.get("reason") or "OOMKilled"
    exit_code = sig.attrs.get("exit_code")
    reason = (
        f"host-RAM OOM: pod {sig.pod} container {sig.container or '?'} terminated "
        f"{reason_attr}"
        + (f" (exit code {exit_code})" if exit_code is not None else "")
        + " by the kernel/cgroup OOM killer; no CUDA out-of-memory error in its logs"
    )
    key = f"{ws.ref.label}:host_oom@{int(sig.time)}"
    return [VerdictRecorded(ws.ref, NOT_THIS_PATTERN, reason, sig.time, sig.source, key)]


def oom_summary(sig: Signal) -> str:
    """Describe a GPU OOM signal in one line."""
    a = sig.attrs
    parts = [f"GPU OOM in pod {sig.pod}"]
    if a.get("framework"):
        parts.append(f"({a['framework']})")
    if a.get("accelerator"):
        parts.append(f"on {a['accelerator']}")
    if a.get("sharing_layer"):
        parts.append(f"under the {a['sharing_layer']} GPU-sharing quota")
    if a.get("bytes_tried") is not None:
        parts.append(f"tried {a['bytes_tried'] / 2**30:.2f} GiB")
    if a.get("free_bytes") is not None:
        parts.append(f"free {a['free_bytes'] / 2**30:.2f} GiB")
    if a.get("capacity_bytes") is not None:
        parts.append(f"of {a['capacity_bytes'] / 2**30:.2f} GiB")
    if a.get("gpu_index") is not None:
        parts.append(f"on GPU {a['gpu_index']}")
    return " ".join(parts)


def start_failed_summary(sig: Signal) -> str:
    """Describe a start-up that found the GPU's memory held, in one line."""
    a = sig.attrs
    free, cap = a.get("free_bytes"), a.get("capacity_bytes")
    held = (
        f" ({free / 2**30:.2f} of {cap / 2**30:.2f} GiB free)"
        if isinstance(free, int) and isinstance(cap, int)
        else ""
    )
    gpu = f" on GPU {a['gpu_index']}" if a.get("gpu_index") is not None else ""
    return (
        f"pod {sig.pod} could not start: its GPU's memory is still held{held}{gpu}, by the dead "
        "engine or another process; restarting again does not help until it is freed"
    )


def pressure_summary(sig: Signal) -> str:
    """Describe a memory-pressure signal in one line, naming the measure it used."""
    a = sig.attrs
    what = a.get("pressure", "memory")
    if what == "KV cache preemptions":
        return f"KV cache preemptions rising in pod {sig.pod} (total {a.get('preemptions')})"
    if what == "queue depth":
        return f"queue depth {a.get('requests_waiting')} requests waiting in pod {sig.pod}"
    ratio = a.get("ratio")
    value = f"{ratio:.0%}" if isinstance(ratio, float) else "?"
    reservation = a.get("reservation")
    if isinstance(reservation, float):
        engine = a.get("engine") or "engine"
        return f"VRAM {value} over {engine}'s reservation {reservation:.2f} in pod {sig.pod}"
    return f"{what} at {value} in pod {sig.pod}"


def config_summary(sig: Signal) -> str:
    """Describe an engine configuration signal in one line."""
    keys = ", ".join(f"{k}={v}" for k, v in sig.attrs.items() if k != "engine")
    return f"{sig.attrs.get('engine', 'engine')} config of pod {sig.pod}: {keys}"[:300]


def crash_summary(sig: Signal) -> str:
    """Describe a crash-loop signal in one line."""
    a = sig.attrs
    bits = [f"pod {sig.pod} {a.get('reason', 'crash loop')}"]
    if a.get("restart_count") is not None:
        bits.append(f"restarts={a['restart_count']}")
    if a.get("last_reason"):
        bits.append(f"last={a['last_reason']}")
    if a.get("exit_code") is not None:
        bits.append(f"exit={a['exit_code']}")
    if a.get("count"):
        bits.append(f"count={a['count']}")
    return " ".join(bits)
