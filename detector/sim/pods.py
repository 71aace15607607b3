"""The Kubernetes life of the replicas: creation, weight loading, CrashLoopBackOff, deletion.

A ``Fleet`` holds one pod per replica slot of the Deployment. A pod is created
(``ContainerCreating``, then the scheduler's and kubelet's events), its container starts and
loads the weights for the model's load time (readiness probe failing) before Ready; a
container that dies waits out the kubelet's restart back-off in ``CrashLoopBackOff``:
10 s doubling to a 300 s cap, reset once a container has run 10 min
(https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-restarts).
A deleted pod (eviction, rolling update) is replaced by its ReplicaSet with a new pod: a new
name, IP and UID, loading the weights again. ``rollout`` moves the Deployment to a new template
the way the Deployment controller does with ``maxSurge 0, maxUnavailable 1``: old pods that
are not available are replaced at once (the controller's clean-up of unhealthy replicas),
available ones one at a time while every other replica is available
(https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#rolling-update-deployment).

Each container start draws its load time from the model's range, from the slot's own seeded
generator; a restart after a crash fails at start for ``restart_fail_share`` of them (the dead
engine's memory not yet freed, vllm#42017). While a pod serves, the kubelet probes ``/health``
every ``period_s``: an answer slower than ``timeout_s`` is a failure (``context deadline
exceeded``); ``failure_threshold`` in a row take the pod out of the endpoints (readiness, back
at the first success) or kill and restart its container (liveness: "Container vllm failed
liveness probe, will be restarted").
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from detector.lab import recorder as r
from detector.lab import wordings as w
from detector.lab.recorder import Gpu, Pod, Recorder
from detector.sim import emit
from detector.sim.engine import Engine
from detector.sim.memory import physics
from detector.sim.scenario import Scenario

IMAGES = {
    "vllm": "docker.io/vllm/vllm-openai:v0.10.1.1",
    "sglang": "docker.io/lmsysorg/sglang:v0.4.6.post5-cu124",
    "unpaged": "docker.io/pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
}
BACKOFF_START_S = 10.0
BACKOFF_CAP_S = 300.0
BACKOFF_RESET_S = 600.0
# The engine's own flag for each ceiling the model keys by vLLM's name (SGLang's server_args:
# https://docs.sglang.ai/advanced_features/server_arguments.html).
FLAGS = {
    "sglang": {
        "max-num-seqs": "max-running-requests",
        "max-num-batched-tokens": "chunked-prefill-size",
        "max-model-len": "context-length",
    }
}


def to_flags(kind: str, args: dict[str, int]) -> dict[str, int]:
    """Return ``args`` (vLLM's names) under the engine's own flag names."""
    names = FLAGS.get(kind, {})
    return {names.get(key, key): value for key, value in args.items()}


def from_flags(kind: str, flags: dict[str, int]) -> dict[str, int]:
    """Return an engine's flags under vLLM's names (flags it does not know stay as they are)."""
    names = {flag: key for key, flag in FLAGS.get(kind, {}).items()}
    return {names.get(key, key): value for key, value in flags.items()}


CREATE_S = 0.6  # Scheduled -> Started
PROBE_EVERY_S = 10.0
BACKOFF_EVENT_EVERY_S = 15.0


class State(StrEnum):
    """Where a pod is in its life."""

    CREATING = "creating"
    LOADING = "loading"
    SERVING = "serving"
    BACKOFF = "backoff"


def next_backoff(backoff_s: float, ran_s: float) -> tuple[float, float]:
    """Return (delay before this restart, back-off for the next) after a container ran ``ran_s``."""
    if ran_s >= BACKOFF_RESET_S:
        backoff_s = BACKOFF_START_S
    return backoff_s, min(BACKOFF_CAP_S, backoff_s * 2)


@dataclass(frozen=True, slots=True)
class Template:
    """A Deployment pod template: its hash (the ReplicaSet's suffix), engine args, RS UID."""

    hash: str
    args: tuple[tuple[str, int], ...]
    rs_uid: str

    def arg_map(self) -> dict[str, int]:
        """Return the engine args as a dict."""
        return dict(self.args)


@dataclass(slots=True)
class SimPod:
    """One pod of the Deployment and its current container."""

    slot: int
    pod: Pod
    template: Template
    state: State
    created_at: float
    started_at: float = 0.0
    ready_at: float = 0.0
    restart_at: float = 0.0
    died_at: float | None = None
    restarts: int = 0
    backoff_s: float = BACKOFF_START_S
    engine: Engine | None = None
    engine_tag: str = ""
    ready: bool = True  # readiness: in the endpoints while serving
    fails_at: float | None = None  # a start that will fail (memory not freed)
    probe_at: float = 0.0
    ready_fails: int = 0
    live_fails: int = 0

    @property
    def available(self) -> bool:
        """Return whether the pod serves and is Ready (the Deployment's available replica)."""
        return self.state is State.SERVING and self.ready

    pending: deque[w.Line] = field(default_factory=deque)
    next_event: float = 0.0


class Fleet:
    """The pods of one Deployment (module docstring); events and start-up lines go to ``rec``."""

    def __init__(self, scenario: Scenario, rec: Recorder, template: Template, key: str) -> None:
        self.scenario = scenario
        self.rec = rec
        self.template = template
        self.pods: list[SimPod] = []
        self.rngs = [random.Random(f"{key}/pods/{slot}") for slot in range(scenario.replicas)]
        self.start_failures = 0
        self.liveness_kills: list[SimPod] = []
        self._ips = 0
        self.gpus = [
            Gpu(
                self._node(i),
                i % 2,
                f"GPU-{rec.uuid()}",
                scenario.gpu.model,
                scenario.gpu.total_mib,
            )
            for i in range(scenario.replicas)
        ]

    @staticmethod
    def _node(slot: int) -> str:
        return f"gpu-node-{slot // 2 + 1:02d}"

    def create(self, slot: int, t: float) -> SimPod:
        """Create the pod of ``slot`` from the current template at ``t`` (a new name and IP)."""
        sc, tpl = self.scenario, self.template
        self._ips += 1
        ip = f"10.0.{1 + slot // 2}.{20 + self._ips}"
        owner = f"{sc.workload}-{tpl.hash}"
        pod = self.rec.pod(
            sc.namespace, owner, self._node(slot), ip, "vllm", IMAGES[sc.engine.kind]
        )
        pod.port, pod.owner_uid, pod.gpu = 8000, tpl.rs_uid, self.gpus[slot]
        pod.starts = [t + CREATE_S]
        sim = SimPod(slot, pod, tpl, State.CREATING, t)
        r.started(self.rec, t, pod, scheduled=True)
        self.pods.append(sim)
        self.pods.sort(key=lambda p: p.slot)
        return sim

    def _start(self, sim: SimPod, t: float, after_crash: bool = False) -> None:
        """Start a container of ``sim`` at ``t``: it loads the weights, then serves."""
        rng = self.rngs[sim.slot]
        load_s = rng.uniform(*self.scenario.model.load_s)
        fails = after_crash and rng.random() < self.scenario.pods.restart_fail_share
        sim.state, sim.started_at, sim.ready_at = State.LOADING, t, t + load_s
        sim.fails_at = t + min(8.0, load_s / 2) if fails else None
        sim.engine_tag = f"(EngineCore_0 pid={self.rec.rng.randrange(140, 190)})"
        phys = physics(self.scenario, sim.template.arg_map())
        lines = emit.startup_lines(
            self.rec, t + 1.0, sim.engine_tag, sim.template.arg_map(), phys, load_s, self.scenario
        )
        sim.pending = deque(lines)
        sim.next_event = t + PROBE_EVERY_S

    def tick(self, t0: float, t1: float) -> list[SimPod]:
        """Move every pod through ``(t0, t1]``; return the pods that became Ready."""
        ready: list[SimPod] = []
        for sim in self.pods:
            if sim.state is State.CREATING and sim.created_at + CREATE_S <= t1:
                self._start(sim, sim.created_at + CREATE_S)
            if sim.state is State.BACKOFF:
                self._backoff(sim, t1)
            if sim.state is State.LOADING and sim.fails_at is not None and sim.fails_at <= t1:
                self._start_failed(sim, sim.fails_at)
            if sim.state is State.LOADING:
                self._loading(sim, t1)
                if sim.ready_at <= t1:
                    self._ready(sim)
                    ready.append(sim)
            if sim.state is State.SERVING:
                self._probe(sim, t1)
        return ready

    def _start_failed(self, sim: SimPod, t: float) -> None:
        """Fail a start whose GPU still holds the dead engine's memory (vllm#42017)."""
        sim.pending.clear()
        emit.start_failed(self.rec, sim.pod, t, self.scenario)
        self.start_failures += 1
        self.crash(sim, t)

    def _probe(self, sim: SimPod, t1: float) -> None:
        """Probe ``/health`` at each period due by ``t1`` (module docstring)."""
        spec = self.scenario.pods
        period = spec.readiness.period_s
        while sim.probe_at <= t1 and sim.engine is not None:
            t = sim.probe_at
            sim.probe_at += period
            latency = spec.health_base_s + spec.health_per_request_s * sim.engine.load
            if latency <= spec.readiness.timeout_s:
                sim.ready_fails, sim.ready = 0, True
            else:
                sim.ready_fails += 1
                emit.probe_timed_out(self.rec, sim.pod, t, "Readiness")
                if sim.ready_fails >= spec.readiness.failure_threshold:
                    sim.ready = False
            live = spec.liveness
            if live is None:
                continue
            if latency <= live.timeout_s:
                sim.live_fails = 0
                continue
            sim.live_fails += 1
            emit.probe_timed_out(self.rec, sim.pod, t, "Liveness")
            if sim.live_fails >= live.failure_threshold:
                emit.liveness_kill(self.rec, sim.pod, t)
                self.liveness_kills.append(sim)
                return

    def _backoff(self, sim: SimPod, t1: float) -> None:
        """Emit BackOff events while waiting; restart the container when the back-off ends."""
        while sim.next_event <= min(t1, sim.restart_at - 1.0):
            r.back_off(self.rec, sim.pod, sim.next_event, sim.next_event + 0.5, 1.0)
            sim.next_event += BACKOFF_EVENT_EVERY_S
        if sim.restart_at <= t1:
            r.started(self.rec, sim.restart_at - CREATE_S, sim.pod)
            self.rec.restart(sim.pod, sim.restart_at)
            sim.restarts += 1
            self._start(sim, sim.restart_at, after_crash=True)

    def _loading(self, sim: SimPod, t1: float) -> None:
        """Write the start-up lines due by ``t1`` and the readiness probe failures."""
        while sim.pending and sim.pending[0][0] <= t1:
            t, stream, text = sim.pending.popleft()
            self.rec.log(sim.pod, t, text, stream)
        while sim.next_event <= min(t1, sim.ready_at - 3.0):
            emit.probe_failed(self.rec, sim.pod, sim.next_event)
            sim.next_event += PROBE_EVERY_S

    def _ready(self, sim: SimPod) -> None:
        """Make ``sim`` Ready with a fresh engine."""
        while sim.pending:
            t, stream, text = sim.pending.popleft()
            self.rec.log(sim.pod, t, text, stream)
        args = sim.template.arg_map()
        phys = physics(self.scenario, args)
        sim.engine = Engine(phys, args["max-num-seqs"], args["max-num-batched-tokens"])
        sim.state, sim.ready, sim.ready_fails, sim.live_fails = State.SERVING, True, 0, 0
        sim.probe_at = sim.ready_at + self.scenario.pods.readiness.period_s

    def crash(self, sim: SimPod, t: float) -> None:
        """Record the container's death at ``t``; it waits out the restart back-off."""
        delay, sim.backoff_s = next_backoff(sim.backoff_s, t - sim.started_at)
        sim.state, sim.died_at, sim.restart_at = State.BACKOFF, t, t + delay
        sim.engine, sim.pending = None, deque()
        sim.next_event = t + 1.5

    def delete(self, sim: SimPod, t: float) -> SimPod:
        """Delete ``sim`` (Killing) and let its ReplicaSet create the replacement at ``t``."""
        if sim.state is not State.BACKOFF:
            emit.killing(self.rec, sim.pod, t)
        self.pods.remove(sim)
        return self.create(sim.slot, t)

    def rollout(self, t: float) -> list[SimPod]:
        """Replace old-template pods (module docstring); return the pods deleted."""
        old = [p for p in self.pods if p.template.hash != self.template.hash]
        gone = [p for p in old if not p.available]  # unavailable already: replaced at once
        unavailable = sum(1 for p in self.pods if not p.available)
        healthy_old = [p for p in old if p.available]
        if healthy_old and unavailable == 0:  # maxUnavailable 1: only while all are available
            gone.append(healthy_old[0])
        for sim in gone:
            self.delete(sim, t)
        return gone
