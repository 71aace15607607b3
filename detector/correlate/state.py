"""Correlator state per workload and the decisions the correlator emits (pure data)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from detector.correlate.forecast import NextVictim
from detector.correlate.identity import WorkloadRef
from detector.correlate.requests import RequestSizes
from detector.correlate.windows import ClientStats, ClientWindow, RateWindow
from detector.events.model import Signal, SignalKind, SourcePos

_V = TypeVar("_V")


class Stage(StrEnum):
    """Stages of a cascade incident.

    ``suspected``: one pod died of GPU OOM, or memory is at the ceiling while 5xx rise;
    ``cascading``: another pod died of GPU OOM inside the window, or 5xx stayed above threshold
    while surviving pods sit at the memory ceiling; ``contained``: no new GPU OOM for
    ``contained_after_s`` and 5xx under threshold; ``resolved``: contained for ``quiet_s`` more.
    """

    SUSPECTED = "suspected"
    CASCADING = "cascading"
    CONTAINED = "contained"
    RESOLVED = "resolved"


PATTERN = "gpu_oom_cascade"
NOT_THIS_PATTERN = "not_gpu_oom_cascade"


@dataclass(frozen=True, slots=True)
class IncidentOpened:
    """A new incident for ``workload``; its ``key`` is unique per workload and window."""

    key: str
    workload: WorkloadRef
    time: float


@dataclass(frozen=True, slots=True)
class StageChanged:
    """The incident moved to ``stage`` at event ``time`` because of ``reason``."""

    key: str
    stage: Stage
    time: float
    reason: str


@dataclass(frozen=True, slots=True)
class VictimAdded:
    """``pod`` died of GPU OOM; ``position`` is its 1-based order of failure."""

    key: str
    pod: str
    time: float
    position: int


@dataclass(frozen=True, slots=True)
class EvidenceAdded:
    """A signal joined the incident's evidence as ``kind`` (gpu_oom, crash_loop, lb_errors ...)."""

    key: str
    kind: str
    signal: Signal
    summary: str


@dataclass(frozen=True, slots=True)
class VerdictRecorded:
    """A look-alike: "not this pattern" for ``workload`` with the ``reason``."""

    workload: WorkloadRef
    verdict: str
    reason: str
    time: float
    source: SourcePos
    dedupe_key: str


Decision = IncidentOpened | StageChanged | VictimAdded | EvidenceAdded | VerdictRecorded


@dataclass(slots=True)
class IncidentState:
    """The correlator's working view of one open incident."""

    key: str
    stage: Stage
    opened_at: float
    last_oom_at: float
    victims: dict[str, float] = field(default_factory=dict)  # pod -> first OOM time, ordered
    signals: list[Signal] = field(default_factory=list)
    evidence_counts: Counter[str] = field(default_factory=Counter)
    seen_configs: set[tuple[str, str]] = field(default_factory=set)  # (pod, attrs) attached
    contained_at: float | None = None
    # the next-victim forecast (detector.correlate.forecast): the latest (None: no survivor
    # at risk), the last one announced, when the next may run and whether pressure came since
    next_victim: NextVictim | None = None
    announced: NextVictim | None = None
    forecast_due_at: float = 0.0
    forecast_stale: bool = True


@dataclass(slots=True)
class WorkloadState:
    """What the correlator remembers about one workload; bounded by the pods of the window.

    Per-pod entries (``pods``, ``last_oom``, ``at_ceiling``, ``preemptions``,
    ``last_pressure``, ``ambiguous``)
    and per-GPU ones (``gpu_used``) go with ``forget_idle``; ``engine_config`` (pods log it
    once, at start) and ``crash_loops`` have caps of their own.
    """

    ref: WorkloadRef
    lb: RateWindow
    clients: ClientWindow  # requests per client address and the proxies logging them
    # the client distribution when the current 5xx surge started (None: no surge): what the
    # plan sizes per-client limits from, the same whatever the other streams' progress
    surge_clients: ClientStats | None = None
    pods: dict[str, float] = field(default_factory=dict)  # pod -> last seen, in order seen
    last_oom: dict[str, float] = field(default_factory=dict)  # pod -> last GPU OOM time
    last_gpu_oom_at: float | None = None
    # (pod, measure) -> the latest signal at or over its ceiling; measure: "GPU memory",
    # "KV cache", "KV cache preemptions", "queue depth"
    at_ceiling: dict[tuple[str, str], Signal] = field(default_factory=dict)
    engine: str | None = None  # serving engine seen in the workload's signals
    engine_metrics: bool = False  # KV-cache / preemption / queue signals seen
    preemptions: dict[str, float] = field(default_factory=dict)  # pod -> last running total
    # pod -> its latest memory or KV-cache reading (the record a next-victim forecast names)
    last_pressure: dict[str, Signal] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # counter series -> last total
    per_code_counters: bool = False  # Envoy per-code counters seen: skip the per-class ones
    ambiguous: dict[str, Signal] = field(default_factory=dict)  # pod -> unconfirmed GPU OOM
    engine_config: dict[tuple[str, str], Signal] = field(default_factory=dict)  # (pod, keys)
    last_lb: Signal | None = None
    crash_loops: deque[Signal] = field(default_factory=lambda: deque(maxlen=20))
    errors_above_since: float | None = None
    errors_above_source: Signal | None = None
    surge_handled: bool = False
    baseline_ok_rate: float = 0.0  # ok responses/s in the last window before the surge
    host_oom_since: float | None = None
    last_host_oom_at: float | None = None
    # GPU (uuid or node/index) -> (used bytes, free bytes, last seen)
    gpu_used: dict[str, tuple[int | None, int | None, float]] = field(default_factory=dict)
    incident: IncidentState | None = None
    # pod -> (engine, VRAM fraction it reserves at start), from its startup lines; "" is the
    # workload's latest, for GPU readings without a pod
    reservations: dict[str, tuple[str, float]] = field(default_factory=dict)
    reservation_note: str | None = None  # why the latest VRAM reading was not pressure
    # pod -> its latest known non-memory crash cause (CUDA fault, NCCL timeout, Xid); capped
    crash_causes: dict[str, Signal] = field(default_factory=dict)
    crash_verdict_at: float | None = None  # the last crash-cause verdict: one per episode
    resolved: deque[str] = field(default_factory=deque)  # keys of resolved incidents kept
    sizes: RequestSizes = field(default_factory=RequestSizes)  # request sizes at the gateway
    # a victim's pod IP -> (pod, its death): its requests should stop, until it restarts
    dead_addrs: dict[str, tuple[str, float]] = field(default_factory=dict)
    # signals attributed to the workload, by kind: its coverage (``coverage.py``)
    seen: dict[SignalKind, int] = field(default_factory=lambda: dict.fromkeys(SignalKind, 0))

    def forget_idle(self, horizon: float) -> list[str]:
        """Forget the pods and GPUs last seen before ``horizon`` (event time); return the pods.

        Their entries go from every per-pod map; ``engine_config`` keeps its own cap.
        """
        idle = [pod for pod, seen in self.pods.items() if seen < horizon]
        if idle:
            gone = set(idle)
            for pod in idle:
                del self.pods[pod]
                self.last_oom.pop(pod, None)
                self.preemptions.pop(pod, None)
                self.last_pressure.pop(pod, None)
                self.ambiguous.pop(pod, None)
            for key in [k for k in self.at_ceiling if k[0] in gone]:
                del self.at_ceiling[key]
        for gpu in [g for g, (_, _, seen) in self.gpu_used.items() if seen < horizon]:
            del self.gpu_used[gpu]
        return idle

    def move_pod(self, pod: str, to: WorkloadState) -> None:
        """Move ``pod``'s per-pod entries to ``to`` (the pod's workload was revised).

        Moved: last seen, last GPU OOM, ceilings, preemptions, latest pressure reading,
        unconfirmed OOM, engine
        configs, VRAM reservation, crash cause and crash loops. Workload-wide state (load
        balancer windows, GPUs, the incident) stays.
        """
        seen = self.pods.pop(pod, None)
        if seen is not None:
            to.pods[pod] = max(seen, to.pods.get(pod, seen))
        _move(self.last_oom, to.last_oom, pod)
        _move(self.preemptions, to.preemptions, pod)
        _move(self.last_pressure, to.last_pressure, pod)
        _move(self.ambiguous, to.ambiguous, pod)
        _move(self.reservations, to.reservations, pod)
        _move(self.crash_causes, to.crash_causes, pod)
        for ceiling in [k for k in self.at_ceiling if k[0] == pod]:
            to.at_ceiling[ceiling] = self.at_ceiling.pop(ceiling)
        for config in [k for k in self.engine_config if k[0] == pod]:
            to.engine_config[config] = self.engine_config.pop(config)
        loops = [c for c in self.crash_loops if c.pod == pod]
        if loops:
            kept = [c for c in self.crash_loops if c.pod != pod]
            self.crash_loops.clear()
            self.crash_loops.extend(kept)
            merged = sorted([*to.crash_loops, *loops], key=lambda c: c.time)
            to.crash_loops.clear()
            to.crash_loops.extend(merged)  # the newest 20, as the deque keeps
        last = to.last_oom.get(pod)
        if last is not None and (to.last_gpu_oom_at is None or last > to.last_gpu_oom_at):
            to.last_gpu_oom_at = last

    def pressure_of(self, pod: str) -> Signal | None:
        """Return the latest signal that put ``pod`` at a ceiling, or None."""
        found = [s for (p, _), s in self.at_ceiling.items() if p == pod]
        return max(found, key=lambda s: s.time) if found else None

    def pods_at_ceiling(self, now: float, window_s: float) -> dict[str, Signal]:
        """Return pod -> latest pressure signal for pods at a ceiling within the window."""
        out: dict[str, Signal] = {}
        for (pod, _), sig in self.at_ceiling.items():
            if now - sig.time <= window_s and (pod not in out or sig.time > out[pod].time):
                out[pod] = sig
        return out


def _move(mine: dict[str, _V], theirs: dict[str, _V], pod: str) -> None:
    """Move ``pod``'s entry, if any, from ``mine`` to ``theirs``."""
    if pod in mine:
        theirs[pod] = mine.pop(pod)
