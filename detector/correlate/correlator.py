"""The correlator: signals in, decisions out; pure, event time only.

One instance owns the state of the workloads whose records it sees (with Kafka, one
consumer of the group owns a partition, and every record is keyed by workload).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Final

from detector.config import CorrelateSettings, WorkloadMap
from detector.correlate import pattern
from detector.correlate.context import IncidentContext
from detector.correlate.coverage import retire
from detector.correlate.forecast import (
    FORECAST_EVERY_S,
    NextVictim,
    PressureSample,
    forecast,
    to_announce,
)
from detector.correlate.identity import WorkloadRef, WorkloadResolver, host_of_address
from detector.correlate.series import GPU_MEMORY, KV_CACHE, SeriesBook, SeriesPoint
from detector.correlate.state import (
    Decision,
    EvidenceAdded,
    IncidentState,
    Stage,
    WorkloadState,
)
from detector.correlate.unattributed import UnattributedTally
from detector.correlate.windows import ERROR_STATUSES, ClientWindow, RateWindow, upstream_failed
from detector.events.model import Signal, SignalKind

PRE_RESERVING = frozenset({"vllm", "tgi", "sglang"})  # engines that reserve VRAM at start
# ENGINE_CONFIG attr -> the VRAM fraction an engine reserves at start: vLLM
# https://docs.vllm.ai/en/latest/configuration/conserving_memory.html, TGI
# https://huggingface.co/docs/text-generation-inference/reference/launcher, SGLang
# https://docs.sglang.ai/advanced_features/server_arguments.html
RESERVATION_KEYS: Final = ("gpu_memory_utilization", "cuda_memory_fraction", "mem_fraction_static")
# A reading this far over the reservation is still the engine's own: the CUDA context, NCCL
# buffers and CUDA graphs lie outside vLLM's budget (~2-6 % of an 80 GiB GPU)
RESERVATION_MARGIN: Final = 0.07
CRASH_CAUSES_KEPT: Final = 64  # pods whose latest known crash cause is remembered
RESOLVED_KEPT_PER_WORKLOAD: Final = 4  # views of resolved incidents kept for ``context``
SWEEPS_PER_WINDOW: Final = 4  # idle pods are looked for this often per correlation window
NEXT_VICTIM: Final = "next_victim"  # the evidence kind of a next-victim forecast
# a timeout on a dead victim's address this long after its death, no restart seen: a zombie
# (``Correlator._zombie``); a process that exits resets its connections within a second
ZOMBIE_AFTER_S: Final = 10.0
_FORECAST_STAGES: Final = (Stage.SUSPECTED, Stage.CASCADING)
_LB = SignalKind.LB_RESPONSE


class Correlator:
    """Recognize GPU OOM cascades in a stream of signals (rules: :mod:`detector.correlate.pattern`).

    ``observe(signal)`` returns the decisions the signal caused, in order; the clock is the
    latest event time seen, so out-of-order records within the windows are handled by
    their own event time.

    Memory is bounded by the workloads and the window, not by the pods ever seen: a pod that
    no signal named for longer than ``window_s`` of event time is forgotten (its per-pod state
    and the resolver's cache entry; a workload of kind ``unknown``, which is one pod, with it),
    unless its workload has an open incident; of the resolved incidents, the last
    ``RESOLVED_KEPT_PER_WORKLOAD`` per workload keep their view. The time series for charts
    (``series``, :mod:`detector.correlate.series`) keep the window's buckets and the spans of
    open incidents (and, until the next look for idle pods, of the ones just resolved).
    """

    def __init__(
        self,
        settings: CorrelateSettings,
        mapping: WorkloadMap | None = None,
        cluster: str | None = None,
    ) -> None:
        self.cfg = settings
        self.resolver = WorkloadResolver(mapping, cluster)
        self.workloads: dict[WorkloadRef, WorkloadState] = {}
        self.now = 0.0
        self.unattributed = 0
        self.unattributed_by_reason = UnattributedTally()  # what was left out, why, how to fix
        self.retired: dict[SignalKind, int] = {}  # forgotten workloads' signals, by kind
        self._open: dict[str, WorkloadState] = {}  # incident key -> workload state
        self._contexts: dict[str, IncidentContext] = {}  # resolved incidents' views
        self.series_book: SeriesBook[WorkloadRef] = (
            SeriesBook()
        )  # per-workload time series for charts
        self._ended: dict[str, tuple[WorkloadRef, float, float]] = {}  # resolved: series spans
        self._sweep_every_s = settings.window_s / SWEEPS_PER_WINDOW
        self._next_sweep = 0.0  # event time of the next look for idle pods

    def observe(self, signal: Signal) -> list[Decision]:
        """Apply one signal; return the decisions it caused."""
        ref = self.resolver.resolve(signal)
        if ref is None:
            self.unattributed += 1
            self.unattributed_by_reason.add(signal)
            return []
        ws = self.workloads.get(ref)
        if ws is None:
            width = self.cfg.rate_window_s
            ws = self.workloads[ref] = WorkloadState(ref, RateWindow(width), ClientWindow(width))
        elif ws.ref is not ref:  # a better source named its kind: the same workload, re-keyed
            del self.workloads[ref]
            self.workloads[ref] = ws
            ws.ref = ref
        time, kind, pod = signal.time, signal.kind, signal.pod
        ws.seen[kind] += 1  # its coverage (coverage.py): one counter per signal, nothing more
        now = time if time > self.now else self.now
        revision = self.resolver.revised and self.resolver.take_revision()
        moved = self._move_pod(*revision, ws, now) if revision else []
        if pod and (kind is not _LB or signal.attrs.get("sidecar")):
            ws.pods[pod] = now  # seen "now": a late record is activity too
        # the hottest kind without the handler table's lookup, once per load-balancer line
        out = self._lb_response(ws, signal) if kind is _LB else _HANDLERS[kind](self, ws, signal)
        if moved:
            out[:0] = moved
        if time > self.now:
            self.now = time
            if self._open:
                out += self.advance(time)
            if time >= self._next_sweep:
                self._forget_idle(time)
        if ws.incident is not None:
            self._open[ws.incident.key] = ws
        return out

    def advance(self, now: float) -> list[Decision]:
        """Apply the passage of event time to every open incident."""
        out: list[Decision] = []
        for key, ws in list(self._open.items()):
            inc = ws.incident
            out += pattern.on_clock(ws, now, self.cfg)
            if inc is not None and ws.incident is not inc:
                self._keep_resolved(ws, key, _context(ws, inc), now)
                del self._open[key]
            elif inc is not None and inc.forecast_stale and now >= inc.forecast_due_at:
                out += self._forecast(ws, inc, now)
        return out

    def _forecast(self, ws: WorkloadState, inc: IncidentState, now: float) -> list[Decision]:
        """Forecast the incident's next victim from its survivors' recent pressure; announce it
        as ``next_victim`` evidence when it says something new (:mod:`.forecast`).

        Runs from ``advance`` only: with an incident open, after new pressure samples, at most
        once per ``FORECAST_EVERY_S`` of event time. Survivors: the pods with pressure in the
        window that are no victim and did not crash-loop within it. The measure is GPU memory:
        the headroom beside a paged engine's pool, where the allocations its start-up did not
        profile come from (vLLM ``gpu_worker.py``: the pool is what the utilization requests
        less the profiled peak), judged from the engine's reservation up to the device's
        capacity. KV-cache usage is left out: vLLM, SGLang and TGI fill their pool by design
        and preempt or queue when it is full, so a pool at 95-100% precedes no death (it named
        next victims on a saturated fleet that never ran out of memory).
        """
        inc.forecast_stale, inc.forecast_due_at = False, now + FORECAST_EVERY_S
        cfg = self.cfg
        if inc.stage not in _FORECAST_STAGES:
            inc.next_victim = None
            return []
        down = {c.pod for c in ws.crash_loops if now - c.time <= cfg.window_s}
        down.update(inc.victims)
        buckets = [  # the KV cache of a paged engine runs full by design: no sign of a death
            b
            for b in self.series_book.pressure_since(ws.ref, now - cfg.forecast_window_s)
            if b[4] != KV_CACHE
        ]
        measure = {pod: detail for _, pod, _, _, detail in sorted(buckets)}  # a pod's latest
        samples = [
            PressureSample(t, pod, ratio, ceiling, self._floor(ws, pod, detail))
            for t, pod, ratio, ceiling, detail in buckets
            if pod not in down and pod in ws.last_pressure and detail == measure[pod]
        ]
        window_s, horizon_s = cfg.forecast_window_s, cfg.forecast_horizon_s
        found = forecast(samples, now, window_s=window_s, horizon_s=horizon_s)
        inc.next_victim = found[0] if found else None
        told = to_announce(found, inc.announced)
        return [] if told is None else self._announce(ws, inc, told)

    def _announce(self, ws: WorkloadState, inc: IncidentState, nxt: NextVictim) -> list[Decision]:
        """Return the ``next_victim`` evidence of ``nxt``: the pod's latest pressure record,
        at the forecast's time, with the forecast's figures as its attrs."""
        if inc.evidence_counts[NEXT_VICTIM] >= self.cfg.max_evidence_per_kind:
            return []
        inc.evidence_counts[NEXT_VICTIM] += 1
        inc.announced = nxt
        attrs = {
            "pod": nxt.pod,
            "eta_s": nxt.eta_s,
            "fitted_at": nxt.fitted_at,
            "reaches_at": nxt.reaches_at,
            "ratio": round(nxt.ratio, 4),
            "ceiling": round(nxt.ceiling, 4),
            "slope_per_s": round(nxt.slope_per_s, 6),
            "samples": nxt.samples,
            "window_s": self.cfg.forecast_window_s,
        }
        sig = replace(ws.last_pressure[nxt.pod], time=nxt.fitted_at, attrs=attrs)
        return [EvidenceAdded(inc.key, NEXT_VICTIM, sig, nxt.summary())]

    @staticmethod
    def _floor(ws: WorkloadState, pod: str, detail: str) -> float:
        """Return the pressure under which ``pod``'s readings are no trend: for GPU memory of an
        engine that reserves VRAM at start, half-way from its reservation to the device's
        capacity. Under it the engine is loading its weights, or its steps use the headroom
        its start-up profiled (the CUDA context, activations that come and go with the batch:
        0.90-0.94 of the device at 0.9 on a saturated vLLM fleet); past it the allocations
        nothing profiled are eating the last of the headroom."""
        if detail != GPU_MEMORY:
            return 0.0
        reserved = ws.reservations.get(pod) or ws.reservations.get("")
        return (reserved[1] + 1.0) / 2 if reserved is not None else 0.0

    def _sampled(self, ws: WorkloadState, sig: Signal) -> None:
        """Keep ``sig`` as its pod's latest pressure reading; the next forecast is due."""
        ws.last_pressure[sig.pod or ""] = sig
        if ws.incident is not None:
            ws.incident.forecast_stale = True

    def _move_pod(
        self, pod: str, old_ref: WorkloadRef, ws: WorkloadState, now: float
    ) -> list[Decision]:
        """Move a revised pod's state from its old workload to ``ws``; return the decisions.

        An open incident of the old workload made only of this pod's evidence (its one victim)
        was the new workload's all along: it is resolved with a note naming the new workload,
        and the pod's GPU OOMs are applied to ``ws`` again at their own times, which opens (or
        joins) the new workload's incident with the pod as a victim in its place. An incident
        of the old workload with other victims or evidence keeps what it recorded. The
        decisions already written cannot change workload, hence resolve-and-reapply rather
        than a move of the incident.
        """
        old = self.workloads.get(old_ref)
        if old is None or old is ws:
            return []
        old.move_pod(pod, ws)
        inc = old.incident
        if inc is None or set(inc.victims) != {pod} or any(s.pod != pod for s in inc.signals):
            return []
        old.incident = None
        reason = f"pod {pod} belongs to {ws.ref.label} (named by its pod object later): moved there"
        out = pattern.set_stage(inc, Stage.RESOLVED, now, reason)
        self._open.pop(inc.key, None)
        self._keep_resolved(old, inc.key, _context(old, inc), now)
        ws.last_oom.pop(pod, None)  # applied again below, each death counted once
        for sig in inc.signals:
            if sig.kind is SignalKind.GPU_OOM:
                out += pattern.on_gpu_oom(ws, sig, self.cfg)
        return out

    def _keep_resolved(
        self, ws: WorkloadState, key: str, ctx: IncidentContext, resolved_at: float
    ) -> None:
        """Keep the view of a resolved incident, dropping the workload's oldest beyond the cap."""
        kept = ws.resolved
        if key in kept:
            kept.remove(key)
        elif len(kept) >= RESOLVED_KEPT_PER_WORKLOAD:
            oldest = kept.popleft()
            self._contexts.pop(oldest, None)
            self._ended.pop(oldest, None)
        kept.append(key)
        self._contexts[key] = ctx
        self._ended[key] = (ws.ref, ctx.opened_at - self.cfg.window_s, resolved_at)

    def _forget_idle(self, now: float) -> None:
        """Forget pods and GPUs idle for longer than the window, outside open incidents.

        A workload of kind ``unknown`` is its one pod (no controller could be told from its
        name or labels): it goes with its pod, with its resolved incidents' views, once no
        load-balancer line of its upstream came within the window either.
        """
        last_sweep = self._next_sweep - self._sweep_every_s
        self._next_sweep = now + self._sweep_every_s
        horizon = now - self.cfg.window_s
        self._drop_series(horizon, last_sweep)
        for ref, ws in list(self.workloads.items()):
            if ws.incident is not None:
                continue
            for pod in ws.forget_idle(horizon):
                self.resolver.forget(ref.namespace, pod, ref)
            lb_seen = ws.last_lb is not None and ws.last_lb.time >= horizon
            if ref.kind == "unknown" and not ws.pods and not lb_seen:
                del self.workloads[ref]
                retire(self.retired, ws.seen)
                self.resolver.forget_workload(ref)
                self.series_book.forget(ref)
                for key in ws.resolved:
                    self._contexts.pop(key, None)
                    self._ended.pop(key, None)

    def _drop_series(self, horizon: float, last_sweep: float) -> None:
        """Drop series buckets before ``horizon``, or before the span of an open incident or
        of one resolved since ``last_sweep`` (its last buckets are written after the decision
        that resolved it: ``series``)."""
        book, window_s = self.series_book, self.cfg.window_s
        keep: dict[WorkloadRef, float] = {}
        for ref, start, resolved_at in self._ended.values():
            if resolved_at >= last_sweep:
                keep[ref] = min(start, keep.get(ref, start))
        for ref in list(book.workloads):
            until = min(horizon, keep.get(ref, horizon))
            ws = self.workloads.get(ref)
            if ws is not None and ws.incident is not None:
                until = min(until, ws.incident.opened_at - window_s)
            book.drop_before(ref, until)

    @property
    def open_incidents(self) -> int:
        """Return how many incidents are open (not resolved)."""
        return len(self._open)

    def context(self, key: str) -> IncidentContext | None:
        """Return the pure view of incident ``key`` for planning and questions."""
        ws = self._open.get(key)
        if ws is not None and ws.incident is not None and ws.incident.key == key:
            return _context(ws, ws.incident)
        return self._contexts.get(key)

    @property
    def series_version(self) -> int:
        """Return the series' change counter (``series(key, since=...)``)."""
        return self.series_book.version

    def series(self, key: str, *, since: int = 0) -> list[SeriesPoint]:
        """Return incident ``key``'s series (:mod:`detector.correlate.series`) from
        ``opened_at - window_s`` to now (resolved: to its resolution), the buckets changed
        after version ``since``; ordered by metric, label, time. Empty when the correlator no
        longer holds the incident or its buckets.
        """
        ws = self._open.get(key)
        if ws is not None and ws.incident is not None and ws.incident.key == key:
            start = ws.incident.opened_at - self.cfg.window_s
            return self.series_book.points(ws.ref, start, since=since)
        ended = self._ended.get(key)
        if ended is None:
            return []
        ref, start, end = ended
        return self.series_book.points(ref, start, end, since=since)

    def observe_all(self, signals: Iterable[Signal]) -> list[Decision]:
        """Apply many signals in order; return all decisions."""
        out: list[Decision] = []
        for signal in signals:
            out += self.observe(signal)
        return out

    # --- handlers per signal kind -------------------------------------------------------

    def _gpu_oom(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        self._note_engine(ws, sig)
        if not sig.attrs.get("ambiguous"):
            return self._victim(ws, sig, pattern.on_gpu_oom(ws, sig, self.cfg))
        # The line alone cannot decide: the workload's context must. It counts as a GPU OOM with
        # an open incident, memory pressure on the pod or a recent crash loop of it; otherwise
        # it waits in ``ws.ambiguous`` for the pod's crash loop to confirm it.
        pod = sig.pod or "?"
        recent = [c for c in ws.crash_loops if c.pod == pod and sig.time - c.time <= 60.0]
        if ws.incident is not None or ws.pressure_of(pod) is not None or recent:
            return self._victim(ws, sig, pattern.on_gpu_oom(ws, sig, self.cfg))
        ws.ambiguous[pod] = sig
        return []

    def _victim(self, ws: WorkloadState, sig: Signal, out: list[Decision]) -> list[Decision]:
        """Note a victim's death for the request sizes it held (``ws.sizes``); return ``out``."""
        inc, pod = ws.incident, sig.pod
        if inc is not None and pod and pod in inc.victims:
            ip = self.resolver.ip_of(ws.ref.namespace, pod)
            ws.sizes.died(pod, inc.victims[pod], ip)
            if ip is not None:
                ws.dead_addrs[ip] = (pod, sig.time)
        return out

    def _restarting(self, ws: WorkloadState, pod: str | None) -> None:
        """A sign that ``pod`` is no longer the dead engine (a crash loop, a start, Ready)."""
        if ws.dead_addrs:
            for ip in [ip for ip, (p, _) in ws.dead_addrs.items() if p == pod]:
                del ws.dead_addrs[ip]

    def _zombie(self, ws: WorkloadState, sig: Signal, status: int) -> list[Decision]:
        """A request that timed out (504) on a dead victim's address (``_undead``)."""
        addr = sig.attrs.get("upstream_addr")
        if status != 504 and sig.attrs.get("upstream_status") not in (504, "504"):
            return []
        if not isinstance(addr, str) or not addr:
            return []
        return self._undead(
            ws,
            sig,
            addr,
            f"the gateway still sends it requests and they time out (504 from {addr})",
        )

    def _undead(self, ws: WorkloadState, sig: Signal, addr: str, seen: str) -> list[Decision]:
        """A dead victim's address still in service ``ZOMBIE_AFTER_S`` or more after its
        death, with no sign of a restart since: its engine is dead while its server takes
        requests and its probe says Ready (vllm#39863; before vLLM PR #21728 a dead EngineCore
        left ``/health`` at 200), so nothing restarts it. A death that ends the process resets
        its connections at once (502) and takes the pod out of the endpoints. Attached once
        per death as ENGINE_DEAD evidence of the pod with ``zombie``."""
        inc, found = ws.incident, ws.dead_addrs.get(host_of_address(addr))
        if inc is None or found is None or sig.time - found[1] < ZOMBIE_AFTER_S:
            return []
        pod, died = found
        if (pod, f"zombie@{died}") in inc.seen_configs:
            return []
        inc.seen_configs.add((pod, f"zombie@{died}"))
        attrs = {"zombie": True, "died_at": died, "address": addr}
        marked = replace(sig, kind=SignalKind.ENGINE_DEAD, pod=pod, attrs=attrs)
        summary = (
            f"pod {pod} is a zombie: its engine died {sig.time - died:.0f} s ago, yet {seen}; "
            "its probe says Ready, so nothing restarts it"
        )
        return pattern.attach(inc, "engine_dead", marked, summary, self.cfg)

    def _engine_dead(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        inc = ws.incident
        if inc is None or sig.pod not in inc.victims:
            return []
        return pattern.attach(inc, "engine_dead", sig, f"engine dead in pod {sig.pod}", self.cfg)

    def _start_failed(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        """A pod that could not start because its GPU's memory is held: evidence of an open
        incident (a restart that does not help, told apart from a new death); nothing without
        one (a start failure is no cascade)."""
        self._restarting(ws, sig.pod)
        if ws.incident is None:
            return []
        summary = pattern.start_failed_summary(sig)
        return pattern.attach(ws.incident, "start_failed", sig, summary, self.cfg)

    def _crash_loop(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        ws.crash_loops.append(sig)
        self._restarting(ws, sig.pod)
        out: list[Decision] = []
        pending = ws.ambiguous.pop(sig.pod or "", None)
        cause = ws.crash_causes.get(sig.pod or "")
        if pending is not None and cause is not None and cause.time >= pending.time - 60.0:
            pending = None  # the pod died of a known non-memory cause: no OOM confirmed
        if pending is not None and sig.time - pending.time <= self.cfg.window_s:
            out += pattern.on_gpu_oom(ws, pending, self.cfg)  # the pod did die: confirmed
        if ws.incident is None:
            return out
        summary = pattern.crash_summary(sig)
        return out + pattern.attach(ws.incident, "crash_loop", sig, summary, self.cfg)

    def _host_oom(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        return pattern.on_host_oom(ws, sig, self.cfg)

    def _pod_ready(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        self._restarting(ws, sig.pod)
        inc = ws.incident
        if inc is None or sig.pod not in inc.victims:
            return []
        return pattern.attach(inc, "pod_ready", sig, f"pod {sig.pod} Ready again", self.cfg)

    def _engine_config(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        self._note_engine(ws, sig)
        if not sig.pod:
            return []
        ws.engine_config[(sig.pod, ",".join(sorted(sig.attrs)))] = sig
        for key in RESERVATION_KEYS:
            fraction = sig.attrs.get(key)
            if isinstance(fraction, int | float) and 0 < fraction <= 1:
                engine = str(sig.attrs.get("engine") or ws.engine or "engine")
                ws.reservations[sig.pod] = ws.reservations[""] = (engine, float(fraction))
                if len(ws.reservations) > 64:  # bound: drop the oldest pod's
                    del ws.reservations[next(p for p in ws.reservations if p)]
        if len(ws.engine_config) > 64:  # bound: drop the oldest
            del ws.engine_config[next(iter(ws.engine_config))]
        if not pattern.ENGINE_UP_KEYS.isdisjoint(sig.attrs):  # its KV cache allocated: started
            self._restarting(ws, sig.pod)
        if ws.incident is None:
            return []
        return pattern.attach_config(ws.incident, sig, self.cfg) + pattern.on_engine_back(
            ws, sig, self.cfg
        )

    def _gpu_memory(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        key = str(sig.attrs.get("uuid") or f"{sig.node}/{sig.attrs.get('gpu')}")
        used, free, _ = ws.gpu_used.get(key, (None, None, 0.0))
        used = sig.attrs.get("used_bytes", used)
        free = sig.attrs.get("free_bytes", free)
        ws.gpu_used[key] = (used, free, max(self.now, sig.time))
        total = sig.attrs.get("total_bytes") or (
            used + free if used is not None and free is not None else None
        )
        if used is None or not total:
            return []
        ratio = used / total
        reserved = ws.reservations.get(sig.pod or "") or ws.reservations.get("")
        if sig.pod:  # the device's capacity is the last ceiling: an allocation past it fails
            ceiling = min(
                1.0,
                self.cfg.memory_ceiling if reserved is None else reserved[1] + RESERVATION_MARGIN,
            )
            self.series_book.add_pressure(ws.ref, sig.time, sig.pod, GPU_MEMORY, ratio, ceiling)
            self._sampled(ws, sig)
        if ws.engine in PRE_RESERVING and ws.engine_metrics:
            return []  # VRAM sits near its reservation: KV cache, preemptions, queue decide
        if reserved is not None:
            return self._reserved_memory(ws, sig, ratio, reserved)
        what = "GPU memory"
        if ws.engine in PRE_RESERVING:
            what = f"GPU memory ({ws.engine} pre-reserves VRAM; no KV-cache metrics in the input)"
        return self._pressure(ws, sig, what, ratio, self.cfg.memory_ceiling)

    def _reserved_memory(
        self, ws: WorkloadState, sig: Signal, ratio: float, reserved: tuple[str, float]
    ) -> list[Decision]:
        """Judge a VRAM reading against the engine's own reservation, not the ceiling.

        At (or under) the reservation plus ``RESERVATION_MARGIN`` the memory is what the engine
        took at start: not pressure (the reason is kept in ``ws.reservation_note``); over it,
        pressure, with the reservation in the signal's attrs.
        """
        engine, fraction = reserved
        what = "GPU memory over the engine's reservation"
        if ratio <= fraction + RESERVATION_MARGIN:
            if ratio >= self.cfg.memory_ceiling:  # the ceiling alone would have called it pressure
                ws.reservation_note = (
                    f"VRAM {ratio:.0%} is {engine}'s own reservation {fraction:.2f} "
                    "(+ CUDA context): not pressure"
                )
            if sig.pod:
                ws.at_ceiling.pop((sig.pod, what), None)
            return []
        marked = replace(sig, attrs={**sig.attrs, "engine": engine, "reservation": fraction})
        return self._pressure(ws, marked, what, ratio, fraction + RESERVATION_MARGIN)

    def _pod_address(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        """An EndpointSlice's pod IP (the resolver learned it). For a dead victim: listed
        Ready long after its death it is a zombie (``_undead``); listed not Ready, its probe
        saw the death."""
        ready, ip = sig.attrs.get("ready"), sig.attrs.get("pod_ip")
        if not ws.dead_addrs or not isinstance(ip, str):
            return []
        if ready is False:
            self._restarting(ws, sig.pod)
            return []
        if ready is not True:
            return []
        return self._undead(ws, sig, ip, "the Service's endpoints still list it Ready")

    def _crash_cause(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        pod = sig.pod or ""
        ws.crash_causes.pop(pod, None)
        ws.crash_causes[pod] = sig
        if len(ws.crash_causes) > CRASH_CAUSES_KEPT:  # bound: drop the oldest
            del ws.crash_causes[next(iter(ws.crash_causes))]
        return []

    def _engine_pressure(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        a, cfg, pod = sig.attrs, self.cfg, sig.pod or ""
        self._note_engine(ws, sig)
        out: list[Decision] = []
        usage = a.get("kv_cache_usage")
        if isinstance(usage, int | float):
            ws.engine_metrics = True
            if pod:
                self.series_book.add_pressure(
                    ws.ref, sig.time, pod, KV_CACHE, float(usage), cfg.kv_cache_ceiling
                )
                self._sampled(ws, sig)
            out += self._pressure(ws, sig, "KV cache", float(usage), cfg.kv_cache_ceiling)
        preempted = a.get("preemptions")
        if isinstance(preempted, int | float):
            ws.engine_metrics = True
            last = ws.preemptions.get(pod)
            ws.preemptions[pod] = float(preempted)
            grew = 1.0 if last is not None and preempted > last else 0.0
            out += self._pressure(ws, sig, "KV cache preemptions", grew, 1.0)
        waiting = a.get("requests_waiting")
        if isinstance(waiting, int | float) and cfg.queue_depth_ceiling:
            ws.engine_metrics = True
            ratio = float(waiting) / cfg.queue_depth_ceiling
            out += self._pressure(ws, sig, "queue depth", ratio, 1.0)
        return out

    def _note_engine(self, ws: WorkloadState, sig: Signal) -> None:
        engine = sig.attrs.get("engine") or sig.attrs.get("framework")
        if isinstance(engine, str) and engine in PRE_RESERVING:
            ws.engine = engine

    def _pressure(
        self, ws: WorkloadState, sig: Signal, what: str, ratio: float, ceiling: float
    ) -> list[Decision]:
        """Track one pressure measure of a pod; attach its crossings as evidence."""
        pod = sig.pod
        if not pod:
            return []
        key = (pod, what)
        if ratio < ceiling:
            ws.at_ceiling.pop(key, None)
            return []
        was_at = key in ws.at_ceiling
        marked = replace(sig, attrs={**sig.attrs, "ratio": ratio, "pressure": what})
        ws.at_ceiling[key] = marked
        if was_at or ws.incident is None:
            return []
        return pattern.attach(
            ws.incident, "gpu_memory", marked, pattern.pressure_summary(marked), self.cfg
        )

    def _lb_response(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        attrs = sig.attrs
        status = attrs.get("status")
        if not isinstance(status, int):
            return []
        if attrs.get("counter_total") is None:  # an access line (_response_count, inline)
            count = int(attrs.get("count") or 1)
        else:
            count = _response_count(ws, sig)
        if count <= 0:
            return []
        if not attrs.get("error_log"):  # its request's access line is the response counted
            self.series_book.add_responses(ws.ref, sig.time, status, count)
        upstream_error = upstream_failed(
            attrs.get("upstream_status"), attrs.get("upstream_statuses")
        )
        ws.lb.add(sig.time, status, count, upstream_error)
        held = self._sizes(ws, sig, status, upstream_error)
        if ws.dead_addrs:
            held += self._zombie(ws, sig, status)
        client, proxy = attrs.get("client"), sig.pod
        if client is not None or proxy is not None:  # a sidecar's pod serves, it is no proxy
            ws.clients.add(sig.time, client, None if attrs.get("sidecar") else proxy, count)
        ws.last_lb = sig
        return held + self._surge(ws, sig, status, upstream_error)

    def _sizes(
        self, ws: WorkloadState, sig: Signal, status: int, upstream_error: bool
    ) -> list[Decision]:
        """Record the line's request size (``ws.sizes``); attach each victim's largest request
        so far as ``request_held`` evidence."""
        sizes, size = ws.sizes, sig.attrs.get("request_bytes")
        if isinstance(size, int) and 200 <= status < 400:
            sizes.served(sig.time, size)
        inc = ws.incident
        if inc is None or not sizes.deaths:
            return []
        if not isinstance(size, int) or not (upstream_error or status in (500, 502)):
            sizes.settle(sig.time)
            return []
        addr = sig.attrs.get("upstream_addr")
        host = host_of_address(addr) if isinstance(addr, str) and addr else None
        largest = sizes.failed(sig, size, host)
        if largest is None:
            return []
        summary = (
            f"pod {largest.pod} failed a request of {size / 1024:.1f} KiB as it died (status "
            f"{status}): the largest of the {len(largest.sizes)} it held so far"
        )
        return pattern.attach(inc, "request_held", sig, summary, self.cfg)

    def _surge(
        self, ws: WorkloadState, sig: Signal, status: int, upstream_error: bool
    ) -> list[Decision]:
        """Start, sustain or end the workload's 5xx surge at this line."""
        lb, cfg = ws.lb, self.cfg
        # the surge test counts gateway 502/503/504 and upstream 5xx (a dying engine's 500s)
        above = lb.fails(cfg.error_rate_per_s, cfg.error_ratio)
        if ws.errors_above_since is None:
            if not above:
                ws.baseline_ok_rate = lb.ok_rate_per_s
                return []
            return self._surge_started(ws, sig)
        # hysteresis: the surge ends when the 5xx rate or share falls under half its threshold
        over_half = lb.fails(cfg.error_rate_per_s / 2, cfg.error_ratio / 2)
        if not over_half and status not in ERROR_STATUSES and not upstream_error:
            ws.errors_above_since = ws.errors_above_source = ws.surge_clients = None
            ws.surge_handled = False
            return []
        if above and not ws.surge_handled:
            since = ws.errors_above_since or sig.time
            if sig.time - since >= cfg.sustain_s:
                ws.surge_handled = True
                return pattern.on_surge_sustained(ws, sig.time, cfg)
        return []

    def _surge_started(self, ws: WorkloadState, sig: Signal) -> list[Decision]:
        ws.surge_clients = ws.clients.stats(sig.time)
        marked = _window_summary(ws, sig)
        ws.errors_above_since = sig.time
        ws.errors_above_source = marked
        if ws.incident is None:
            return []
        summary = str(marked.attrs["summary"])
        return pattern.attach(ws.incident, "lb_errors", marked, summary, self.cfg)


def _response_count(ws: WorkloadState, sig: Signal) -> int:
    """Return how many responses ``sig`` stands for: 1 per access line, a counter's increase.

    A Prometheus counter's first sample only sets the baseline; a decrease is a counter
    reset, after which the new total counts (Prometheus' ``increase()`` semantics).
    """
    total = sig.attrs.get("counter_total")
    if total is None:
        return int(sig.attrs.get("count") or 1)
    metric = sig.attrs.get("metric")
    if metric == "envoy_cluster_upstream_rq":
        ws.per_code_counters = True
    elif metric == "envoy_cluster_upstream_rq_xx" and ws.per_code_counters:
        return 0  # the same requests as the per-code series: count them once
    series = str(sig.attrs.get("series"))
    last = ws.counters.get(series)
    ws.counters[series] = float(total)
    if last is None:
        return 0
    return round(float(total) - last if total >= last else float(total))


def _window_summary(ws: WorkloadState, sig: Signal) -> Signal:
    """Return ``sig`` carrying the workload's load-balancer window rates (per second) and
    its client distribution (``clients``, ``client_max_requests``, ``client_requests`` over
    ``clients_span_s``, ``clients_capped``; ``proxies``: proxy instances that logged them).

    Two error figures, apart: ``error_rate_per_s`` / ``error_ratio``, the gateway's own
    502/503/504; ``upstream_error_rate_per_s`` / ``upstream_error_ratio``, responses whose
    upstream (the workload's pods) answered 5xx, 500 included, to some try (a gateway that
    retries may still have answered the client 200)."""
    lb = ws.lb
    seen = ws.surge_clients if ws.surge_clients is not None else ws.clients.stats(sig.time)
    upstream = sig.attrs.get("upstream")
    if lb.upstream_errors and not lb.errors:  # the pods' own 5xx (500s), passed on or retried
        summary = (
            f"upstream 5xx surge at upstream {upstream}: its pods answered 5xx to "
            f"{lb.upstream_error_rate_per_s:.1f}/s, {lb.upstream_error_ratio:.0%} of "
            f"{lb.request_rate_per_s:.1f} req/s over {lb.width_s:.0f} s "
            "(gateway 502/503/504: none)"
        )
    else:
        summary = (
            f"5xx surge at upstream {upstream}: {lb.error_rate_per_s:.1f}/s, "
            f"{lb.error_ratio:.0%} of {lb.request_rate_per_s:.1f} req/s over {lb.width_s:.0f} s"
        )
        if lb.upstream_errors:
            summary += (
                f"; upstream pods answered 5xx to {lb.upstream_error_rate_per_s:.1f}/s "
                f"({lb.upstream_error_ratio:.0%})"
            )
    attrs = {
        **sig.attrs,
        "summary": summary,
        "error_rate_per_s": round(lb.error_rate_per_s, 3),
        "request_rate_per_s": round(lb.request_rate_per_s, 3),
        "error_ratio": round(lb.error_ratio, 3),
        "upstream_error_rate_per_s": round(lb.upstream_error_rate_per_s, 3),
        "upstream_error_ratio": round(lb.upstream_error_ratio, 3),
        "throttled_rate_per_s": round(lb.throttled / lb.width_s, 3),
        "baseline_ok_rate_per_s": round(ws.baseline_ok_rate, 3),
        "window_s": lb.width_s,
        "clients": seen.clients,
        "client_max_requests": seen.max_requests,
        "client_requests": seen.requests,
        "clients_span_s": seen.span_s,
        "clients_capped": seen.capped,
        "proxies": seen.proxies,
    }
    return replace(sig, attrs=attrs)


def _context(ws: WorkloadState, inc: IncidentState) -> IncidentContext:
    signals = sorted(inc.signals, key=lambda s: s.time)
    if ws.last_lb is not None and ws.lb.total:
        signals.append(_window_summary(ws, ws.last_lb))
    return IncidentContext(
        key=inc.key,
        namespace=ws.ref.namespace,
        workload=ws.ref.name,
        workload_kind=ws.ref.kind,
        stage=inc.stage.value,
        opened_at=inc.opened_at,
        cluster=ws.ref.cluster,
        victims=tuple(inc.victims),
        pods_seen=tuple(ws.pods),
        signals=tuple(signals),
        next_victim=inc.next_victim,
        requests=ws.sizes.evidence(),
    )


_HANDLERS = {
    SignalKind.GPU_OOM: Correlator._gpu_oom,
    SignalKind.ENGINE_DEAD: Correlator._engine_dead,
    SignalKind.START_FAILED: Correlator._start_failed,
    SignalKind.CRASH_LOOP: Correlator._crash_loop,
    SignalKind.HOST_OOM: Correlator._host_oom,
    SignalKind.POD_READY: Correlator._pod_ready,
    SignalKind.LB_RESPONSE: Correlator._lb_response,
    SignalKind.GPU_MEMORY: Correlator._gpu_memory,
    SignalKind.ENGINE_PRESSURE: Correlator._engine_pressure,
    SignalKind.ENGINE_CONFIG: Correlator._engine_config,
    SignalKind.CRASH_CAUSE: Correlator._crash_cause,
    SignalKind.POD_ADDRESS: Correlator._pod_address,
}
