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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from detector.lab import recorder as r
from detector.lab import wordings as w
from detector.lab.recorder import Gpu, Pod, Recorder
from detector.sim import emit
from detector.sim.engine import Engine, physics
from detector.sim.scenario import Scenario

VLLM_IMAGE = "docker.io/vllm/vllm-openai:v0.10.1.1"
BACKOFF_START_S = 10.0
BACKOFF_CAP_S = 300.0
BACKOFF_RESET_S = 600.0
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
    pending: deque[w.Line] = field(default_factory=deque)
    next_event: float = 0.0


class Fleet:
    """The pods of one Deployment (module docstring); events and start-up lines go to ``rec``."""

    def __init__(self, scenario: Scenario, rec: Recorder, template: Template) -> None:
        self.scenario = scenario
        self.rec = rec
        self.template = template
        self.pods: list[SimPod] = []
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
        pod = self.rec.pod(sc.namespace, owner, self._node(slot), ip, "vllm", VLLM_IMAGE)
        pod.port, pod.owner_uid, pod.gpu = 8000, tpl.rs_uid, self.gpus[slot]
        pod.starts = [t + CREATE_S]
        sim = SimPod(slot, pod, tpl, State.CREATING, t)
        r.started(self.rec, t, pod, scheduled=True)
        self.pods.append(sim)
        self.pods.sort(key=lambda p: p.slot)
        return sim

    def _start(self, sim: SimPod, t: float) -> None:
        """Start a container of ``sim`` at ``t``: it loads the weights, then serves."""
        load_s = self.scenario.model.load_s
        sim.state, sim.started_at, sim.ready_at = State.LOADING, t, t + load_s
        sim.engine_tag = f"(EngineCore_0 pid={self.rec.rng.randrange(140, 190)})"
        phys = physics(self.scenario, sim.template.arg_map())
        lines = emit.startup_lines(
            self.rec, t + 1.0, sim.engine_tag, sim.template.arg_map(), phys, load_s
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
            if sim.state is State.LOADING:
                self._loading(sim, t1)
                if sim.ready_at <= t1:
                    self._ready(sim)
                    ready.append(sim)
        return ready

    def _backoff(self, sim: SimPod, t1: float) -> None:
        """Emit BackOff events while waiting; restart the container when the back-off ends."""
        while sim.next_event <= min(t1, sim.restart_at - 1.0):
            r.back_off(self.rec, sim.pod, sim.next_event, sim.next_event + 0.5, 1.0)
            sim.next_event += BACKOFF_EVENT_EVERY_S
        if sim.restart_at <= t1:
            r.started(self.rec, sim.restart_at - CREATE_S, sim.pod)
            self.rec.restart(sim.pod, sim.restart_at)
            sim.restarts += 1
            self._start(sim, sim.restart_at)

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
        sim.state = State.SERVING

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
        unhealthy = [p for p in old if p.state is not State.SERVING]
        gone = list(unhealthy)
        unavailable = sum(
            1 for p in self.pods if p.state is not State.SERVING and p not in unhealthy
        )
        healthy_old = [p for p in old if p.state is State.SERVING]
        if healthy_old and unavailable == 0:
            gone.append(healthy_old[0])
        for sim in gone:
            self.delete(sim, t)
        return gone
