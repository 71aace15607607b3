"""The simulated endpoint: replicas, traffic and emission stepped together in event time.

``Endpoint`` is pure and seeded: time is the offset it is advanced to, never a clock, and the
same scenario and seed give the same records. Each step (``Scenario.step_s``) moves the pods
through their lives (``pods``), routes the step's arrivals through the gateway limit and the
load balancer (``traffic``), steps every serving engine (``engine``) and writes what each
shows (``emit``). The load balancer answers as ingress-nginx does: 503 with upstream ``-``
when no endpoint is Ready; 502 with upstream status 502 and the dead pod's address for the
requests in flight when a pod dies (the connection is reset) and for a connection refused by a
pod that died less than ``endpoint_lag_s`` ago when no other endpoint is left (otherwise
nginx tries the next one); 504 after ``upstream_timeout_s`` without an answer (the engine
aborts the request); 429 from the gateway limit, counted as shed, not failed.

The actuation methods (``set_deployment_args``, ``evict``, ``set_gateway_limit``) act at
``now``, as the Kubernetes API server and the gateway would.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from detector.lab import recorder_traffic as tr
from detector.lab.recorder import Recorder
from detector.sim import emit
from detector.sim.engine import Sequence
from detector.sim.pods import Fleet, SimPod, State, Template
from detector.sim.scenario import Scenario
from detector.sim.traffic import Arrivals, Balancer, Client, Gateway, GatewayLimit

STATS_EVERY_S = 10.0  # vLLM's stats line
GAUGES_EVERY_S = 15.0  # Prometheus scrape of vLLM
FB_EVERY_S = 15.0  # dcgm-exporter scrape


@dataclass(frozen=True)
class PodView:
    """A pod as the API server shows it."""

    name: str
    uid: str
    ip: str
    node: str
    ready: bool
    phase: str  # "Pending" | "Running"
    waiting_reason: str | None  # "CrashLoopBackOff" | "ContainerCreating" | None
    restart_count: int
    engine_args: dict[str, int]
    template_hash: str


@dataclass
class Outcome:
    """What the run did to the endpoint and its clients.

    ``victims``: the first pod that died of GPU OOM in each replica slot, in order of death
    (a slot counts once however often its pods die again); ``pods_lost`` is their number.
    ``requests`` counts every attempt (a retry is a new request); ``failed_requests`` the 5xx;
    ``shed_requests`` the 429s. ``all_serving_at``: the offset from which every replica is
    Ready again after the first OOM, to the end (None if never). ``deaths``: every GPU OOM
    death, repeats included; ``non_oom_deaths``: the other crashes.
    """

    pods_total: int
    pods_lost: int = 0
    victims: list[str] = field(default_factory=list)
    requests: int = 0
    failed_requests: int = 0
    shed_requests: int = 0
    first_oom_at: float | None = None
    all_serving_at: float | None = None
    deaths: int = 0
    non_oom_deaths: int = 0
    victim_slots: set[int] = field(default_factory=set, repr=False)


@dataclass(slots=True)
class _InFlight:
    """A request inside a pod: its client, when nginx sent it and to which upstreams."""

    client: Client
    at: float
    sim: SimPod
    tried: list[tuple[str, str]]


class Endpoint:
    """A closed-loop LLM serving endpoint (module docstring); ``start``: Unix seconds of 0."""

    def __init__(self, scenario: Scenario, *, start: float, seed: int | None = None) -> None:
        self.scenario = scenario
        seed = scenario.seed if seed is None else seed
        self.recorder = Recorder(f"sim/{scenario.name}/{seed}", start)
        self.rng = random.Random(f"sim/{scenario.name}/{seed}/model")
        self.now = 0.0
        self.outcome = Outcome(pods_total=scenario.replicas)
        self.lb = tr.ingress(self.recorder)
        self.upstream = f"{scenario.namespace}-{scenario.workload}-8000"
        self.arrivals = Arrivals(scenario, random.Random(f"sim/{scenario.name}/{seed}/traffic"))
        self.gateway = Gateway()
        self.balancer = Balancer(scenario.balancer.policy)
        engine = scenario.engine
        args = {
            "max-num-seqs": engine.max_num_seqs,
            "max-num-batched-tokens": engine.max_num_batched_tokens,
            "max-model-len": engine.max_model_len,
        }
        self.fleet = Fleet(scenario, self.recorder, self._template(args))
        self.inflight: dict[int, _InFlight] = {}
        self._rid = 0
        self._faults = sorted(scenario.faults, key=lambda f: f.at_s)
        for slot in range(scenario.replicas):
            self.fleet.create(slot, 1.5 * slot)

    def _template(self, args: dict[str, int]) -> Template:
        rec = self.recorder
        return Template(rec.suffix(10), tuple(sorted(args.items())), rec.uuid())

    # --- the interface the loop drives ------------------------------------------------------

    def advance(self, until: float) -> None:
        """Step the model to offset ``until`` (seconds), emitting records on the way.

        A block of log lines that starts before ``until`` may end up to a second after it (a
        death's traceback and shutdown, a new pod's first events): ``recorder.drain(until)``
        leaves those for the next drain.
        """
        while self.now < until - 1e-9:
            t1 = min(until, self.now + self.scenario.step_s)
            self._tick(self.now, t1)
            self.now = t1

    def pods(self) -> list[PodView]:
        """Return the current pods as the API server shows them."""
        return [self._view(sim) for sim in self.fleet.pods]

    def deployment_args(self) -> dict[str, int]:
        """Return the Deployment template's engine args now."""
        return self.fleet.template.arg_map()

    def set_deployment_args(self, args: dict[str, int]) -> None:
        """Change the template's engine args: a rolling update (maxSurge 0, maxUnavailable 1).

        Keys are vLLM's flags without dashes in front (``max-num-seqs``; ``max_num_seqs`` is
        taken as the same); args not given keep their value. The same args again change nothing.
        """
        given = {key.replace("_", "-"): int(value) for key, value in args.items()}
        merged = {**self.deployment_args(), **given}
        if merged == self.deployment_args():
            return
        self.fleet.template = self._template(merged)
        self._rollout()

    def evict(self, pod_name: str) -> bool:
        """Delete the pod; its ReplicaSet replaces it. False if there is no such pod."""
        sim = next((p for p in self.fleet.pods if p.pod.name == pod_name), None)
        if sim is None:
            return False
        self._fail_inside(sim, self.now, "502")
        self.fleet.delete(sim, self.now)
        return True

    def set_gateway_limit(self, limit: GatewayLimit | None) -> None:
        """Set the gateway's aggregate 429 limit: rate and requests in progress (None: lifted)."""
        self.gateway.set(limit, self.now)

    # --- one step ---------------------------------------------------------------------------

    def _tick(self, t0: float, t1: float) -> None:
        """Advance every part of the model through ``[t0, t1)``."""
        self.fleet.tick(t0, t1)
        self._rollout()
        self._run_faults(t1)
        for t, client in self.arrivals.between(t0, t1):
            self._arrive(t, client)
        for sim in list(self.fleet.pods):
            self._step_engine(sim, t0, t1)
        self._timeouts(t1)
        self._scrapes(t0, t1)
        self._track_serving(t1)

    def _rollout(self) -> None:
        """Let the Deployment controller replace old-template pods, failing what they held."""
        current = self.fleet.template.hash
        if all(p.template.hash == current for p in self.fleet.pods):
            return
        for sim in self.fleet.rollout(self.now):
            if sim.engine is not None:
                self._fail_inside(sim, self.now, "502")

    def _run_faults(self, t1: float) -> None:
        """Crash the replicas whose non-memory fault is due (when they next serve)."""
        for fault in list(self._faults):
            if fault.at_s >= t1:
                break
            sim = next((p for p in self.fleet.pods if p.slot == fault.replica), None)
            if sim is None or sim.state is not State.SERVING:
                continue
            self._faults.remove(fault)
            t = max(fault.at_s, self.now)
            emit.crash_death(self.recorder, sim.pod, t, sim.engine_tag)
            self.outcome.non_oom_deaths += 1
            self._fail_inside(sim, t + 0.5, "502")
            self.fleet.crash(sim, t)

    def _endpoints(self, t: float) -> list[SimPod]:
        lag = self.scenario.balancer.endpoint_lag_s
        return [
            p
            for p in self.fleet.pods
            if p.state is State.SERVING or (p.died_at is not None and t - p.died_at < lag)
        ]

    def _arrive(self, t: float, client: Client) -> None:
        """Route one request: gateway limit, balancer, then a pod's engine or nginx's answer."""
        client.attempt += 1
        self.outcome.requests += 1
        if not self.gateway.allow(t, len(self.inflight)):
            self._answer(t, client, t, 429, [])
            return
        endpoints = self._endpoints(t)
        if not endpoints:
            self._answer(t, client, t, 503, [])
            return
        sim = self.balancer.pick(endpoints, [p.engine.load if p.engine else 0 for p in endpoints])
        tried: list[tuple[str, str]] = []
        if sim.engine is None:  # died a moment ago: connect() refused, nginx tries the next
            tried.append((sim.pod.addr, "502"))
            alive = [p for p in endpoints if p.engine is not None]
            if not alive:
                self._answer(t + 0.001, client, t, 502, tried, tr.REFUSED)
                return
            sim = self.balancer.pick(alive, [p.engine.load if p.engine else 0 for p in alive])
        assert sim.engine is not None
        if client.prompt >= sim.template.arg_map()["max-model-len"]:
            self._answer(t + 0.01, client, t, 400, [*tried, (sim.pod.addr, "400")])
            return
        output = min(client.output, sim.template.arg_map()["max-model-len"] - client.prompt)
        self._rid += 1
        sim.engine.waiting.append(Sequence(self._rid, client.prompt, output, client.logprobs))
        self.inflight[self._rid] = _InFlight(client, t, sim, tried)

    def _answer(
        self,
        t: float,
        client: Client,
        sent: float,
        status: int,
        tried: list[tuple[str, str]],
        error: str = "",
    ) -> None:
        """Log nginx's answer to one request, count it, and let the client retry a failure."""
        answer = (status, max(0.0, t - sent), error)
        emit.access(
            self.lb, t, client.who, answer, tried, self.upstream, self.scenario.balancer.host
        )
        if status == 429:
            self.outcome.shed_requests += 1
        elif status >= 500:
            self.outcome.failed_requests += 1
        if status == 429 or status >= 500:
            self.arrivals.failed(t, client)

    def _step_engine(self, sim: SimPod, t0: float, t1: float) -> None:
        """Step a serving pod's engine: answer what finished, or kill the pod on OOM."""
        if sim.engine is None:
            return
        result = sim.engine.step(t1 - t0)
        if result.oom is not None:
            t = t0 + (t1 - t0) * self.rng.uniform(0.2, 0.9)
            emit.oom_death(self.recorder, sim.pod, t, sim.engine_tag, result.oom)
            self._count_oom(sim, t)
            self._fail_inside(sim, t + 0.02, "502")
            self.fleet.crash(sim, t)
            return
        for seq, frac in result.finished:
            info = self.inflight.pop(seq.rid, None)
            if info is not None:
                done = t0 + (t1 - t0) * frac
                self._answer(done, info.client, info.at, 200, [*info.tried, (sim.pod.addr, "200")])

    def _count_oom(self, sim: SimPod, t: float) -> None:
        out = self.outcome
        out.deaths += 1
        if out.first_oom_at is None:
            out.first_oom_at = t
        if sim.slot not in out.victim_slots:
            out.victim_slots.add(sim.slot)
            out.victims.append(sim.pod.name)
            out.pods_lost = len(out.victims)

    def _fail_inside(self, sim: SimPod, t: float, upstream_status: str) -> None:
        """Answer 502 to every request inside ``sim``: its connection was reset."""
        rids = [rid for rid, info in self.inflight.items() if info.sim is sim]
        for k, rid in enumerate(rids):
            info = self.inflight.pop(rid)
            tried = [*info.tried, (sim.pod.addr, upstream_status)]
            self._answer(t + 0.001 * k, info.client, info.at, 502, tried, tr.CLOSED)

    def _timeouts(self, t1: float) -> None:
        """Answer 504 to requests without a response after the upstream timeout."""
        limit = self.scenario.balancer.upstream_timeout_s
        late = [rid for rid, info in self.inflight.items() if t1 - info.at >= limit]
        for rid in late:
            info = self.inflight.pop(rid)
            if info.sim.engine is not None:
                info.sim.engine.remove(rid)
            tried = [*info.tried, (info.sim.pod.addr, "504")]
            self._answer(info.at + limit, info.client, info.at, 504, tried, tr.TIMED_OUT)

    def _scrapes(self, t0: float, t1: float) -> None:
        """Emit the periodic stats line, vLLM gauges and framebuffer samples due in the step."""
        rec, model = self.recorder, self.scenario.model.name
        for t in _multiples(FB_EVERY_S, t0, t1):
            for sim in self.fleet.pods:
                emit.framebuffer(rec, sim.pod, t, self._fb_bytes(sim, t))
        for t in _multiples(GAUGES_EVERY_S, t0, t1):
            for sim in self.fleet.pods:
                if sim.engine is not None:
                    emit.gauges(rec, sim.pod, t, sim.engine, model)
        for t in _multiples(STATS_EVERY_S, t0, t1):
            for sim in self.fleet.pods:
                if sim.engine is not None:
                    emit.stats(rec, sim.pod, t, sim.engine, STATS_EVERY_S)

    def _fb_bytes(self, sim: SimPod, t: float) -> float:
        """Return the GPU framebuffer in use: vLLM's reservation, or more under pressure."""
        if sim.engine is not None:  # nvidia-smi: torch's view plus the CUDA context
            reserved = self.scenario.engine.gpu_memory_utilization * self.scenario.gpu.total_mib
            return max((reserved - 300) * emit.MIB, sim.engine.in_use_bytes + 470.0 * emit.MIB)
        if sim.state is State.LOADING:
            into = (t - sim.started_at) / self.scenario.model.load_s
            weights = float(self.scenario.model.weights_gib * 1024**3)
            return 520 * emit.MIB + weights * min(1.0, max(0.0, (into - 0.3) / 0.2))
        return 0.0

    def _track_serving(self, t1: float) -> None:
        out = self.outcome
        if out.first_oom_at is None:
            return
        everyone = len(self.fleet.pods) == self.scenario.replicas and all(
            p.state is State.SERVING for p in self.fleet.pods
        )
        if not everyone:
            out.all_serving_at = None
        elif out.all_serving_at is None:
            out.all_serving_at = t1

    def _view(self, sim: SimPod) -> PodView:
        waiting = {State.CREATING: "ContainerCreating", State.BACKOFF: "CrashLoopBackOff"}
        return PodView(
            name=sim.pod.name,
            uid=sim.pod.uid,
            ip=sim.pod.ip,
            node=sim.pod.node,
            ready=sim.state is State.SERVING,
            phase="Pending" if sim.state is State.CREATING else "Running",
            waiting_reason=waiting.get(sim.state),
            restart_count=sim.restarts,
            engine_args=sim.template.arg_map(),
            template_hash=sim.template.hash,
        )


def _multiples(every: float, t0: float, t1: float) -> list[float]:
    """Return the multiples of ``every`` in ``[t0, t1)``."""
    k = math.ceil(t0 / every - 1e-9)
    out: list[float] = []
    while k * every < t1 - 1e-9:
        out.append(k * every)
        k += 1
    return out
