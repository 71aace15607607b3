"""The simulated endpoint: replicas, traffic and emission stepped together in event time.

``Endpoint`` is pure and seeded: time is the offset it is advanced to, never a clock, and the
same scenario and seed give the same records. Each random concern draws from its own
generator (arrivals, retry jitter, each replica slot's load times and restarts, the moment of
a death inside a step), so the containment modes of one seed see the same clients. Each step
(``Scenario.step_s``) moves the pods through their lives (``pods``), routes the step's
arrivals through a gateway replica's limit and the load balancer (``traffic``), steps every
serving engine (``engine``) and writes what each shows (``emit``).

The answers, as ingress-nginx and the engines give them: 503 with upstream ``-`` when no
endpoint is Ready; when a vLLM engine dies of OOM, 500 to its requests in flight
(``EngineDeadError`` -> HTTP 500, ``vllm/entrypoints/launcher.py``), while a stream, whose 200
vLLM sends at once (``StreamingResponse``), ends with an error chunk; 502 and cut streams
(``upstream prematurely closed connection``) when the process goes with its connections (a
killed container, SGLang's process tree, a plain server); 502 for a connection refused by a
pod that died less than ``endpoint_lag_s`` ago when no other endpoint is left (otherwise nginx
tries the next one); after ``upstream_timeout_s`` without a byte, 504 (no headers yet) or a
cut stream whose first token never came; 499 when the client's own timeout comes first; 400
for a prompt over ``max-model-len``; 429 from the gateway's rate limit, 413 from its body-size
limit. Every answer goes back to its
client (``Arrivals.answered``), which retries or ends there.

The actuation methods (``set_deployment_args``, ``evict``, ``set_gateway_limit``) act at
``now``, as the Kubernetes API server and the gateway would.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from detector.lab import recorder_traffic as tr
from detector.lab.recorder import Recorder
from detector.sim import emit, emit_sglang
from detector.sim.engine import Sequence
from detector.sim.outcome import Outcome
from detector.sim.pods import Fleet, SimPod, State, Template
from detector.sim.scenario import Scenario
from detector.sim.traffic import (
    Arrivals,
    Balancer,
    Client,
    Gateway,
    GatewayLimit,
    request_bytes,
)

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


@dataclass(slots=True)
class _InFlight:
    """An attempt inside a pod: its client, when nginx sent it, to which upstreams, via which
    gateway replica, and whether its tokens flow (its first token came)."""

    client: Client
    at: float
    sim: SimPod
    tried: list[tuple[str, str]]
    gateway: Gateway
    flowing: bool = False


class Endpoint:
    """A closed-loop LLM serving endpoint (module docstring); ``start``: Unix seconds of 0."""

    def __init__(self, scenario: Scenario, *, start: float, seed: int | None = None) -> None:
        self.scenario = scenario
        seed = scenario.seed if seed is None else seed
        key = f"sim/{scenario.name}/{seed}"
        self.recorder = Recorder(key, start)
        self.rng = random.Random(f"{key}/model")
        self.now = 0.0
        self.outcome = Outcome(pods_total=scenario.replicas)
        self.lbs = [tr.ingress(self.recorder) for _ in range(scenario.balancer.gateway_replicas)]
        self.upstream = f"{scenario.namespace}-{scenario.workload}-8000"
        self.arrivals = Arrivals(
            scenario, random.Random(f"{key}/arrivals"), random.Random(f"{key}/retries")
        )
        self.gateways = [Gateway() for _ in range(scenario.balancer.gateway_replicas)]
        self.balancer = Balancer(scenario.balancer.policy)
        engine = scenario.engine
        args = {
            "max-num-seqs": engine.max_num_seqs,
            "max-num-batched-tokens": engine.max_num_batched_tokens,
            "max-model-len": engine.max_model_len,
        }
        self.fleet = Fleet(scenario, self.recorder, self._template(args), key)
        self.inflight: dict[int, _InFlight] = {}
        # attempts waiting in a gateway's limit_req burst: (passed on at, cid, sent, client)
        self.queued: list[tuple[float, int, float, Client]] = []
        self._rid = 0
        self._turn = 0
        self._faults = sorted(scenario.faults, key=lambda f: f.at_s)
        self._slice: tuple[tuple[str, bool], ...] = ()  # the EndpointSlice last written
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
        self._fail_inside(sim, self.now, killed=True)
        self.fleet.delete(sim, self.now)
        return True

    @property
    def gateway_limit(self) -> GatewayLimit | None:
        """Return the limit every gateway replica enforces (they load the same files)."""
        return self.gateways[0].limit

    def set_gateway_limit(self, limit: GatewayLimit | None) -> None:
        """Set each gateway replica's limit: rate and requests in progress (None: lifted)."""
        for gateway in self.gateways:
            gateway.set(limit, self.now)

    # --- one step ---------------------------------------------------------------------------

    def _tick(self, t0: float, t1: float) -> None:
        """Advance every part of the model through ``[t0, t1)``."""
        self.fleet.tick(t0, t1)
        self._liveness_kills()
        self._rollout()
        self._run_faults(t1)
        for t, client in self.arrivals.between(t0, t1):
            self._pass_queued(t)
            self._arrive(t, client)
        self._pass_queued(t1)
        for sim in list(self.fleet.pods):
            self._step_engine(sim, t0, t1)
        self._timeouts(t1)
        self._scrapes(t0, t1)
        self._track_serving(t1)
        self._publish_endpoints(t1)

    def _publish_endpoints(self, t: float) -> None:
        """Write the Service's EndpointSlice when its endpoints or their readiness changed:
        every pod, Ready as the balancer routes to it (``_endpoints``)."""
        routed = {id(p) for p in self._endpoints(t)}
        now = tuple((p.pod.name, id(p) in routed) for p in self.fleet.pods)
        if now != self._slice:
            self._slice = now
            endpoints = [(p.pod, id(p) in routed) for p in self.fleet.pods]
            self.recorder.endpoint_slice(t, self.scenario.workload, endpoints)

    def _pass_queued(self, until: float) -> None:
        """Pass on the attempts the gateway queued (``limit_req`` without ``nodelay``) whose
        wait ended before ``until``."""
        while self.queued and self.queued[0][0] < until:
            t, _, sent, client = heapq.heappop(self.queued)
            self._route(t, sent, client, self.gateways[client.via])

    def _liveness_kills(self) -> None:
        """Restart the containers the kubelet killed for a failed liveness probe."""
        kills, self.fleet.liveness_kills = self.fleet.liveness_kills, []
        for sim in kills:
            t = max(self.now, sim.probe_at - self.scenario.pods.readiness.period_s)
            self.outcome.non_oom_deaths += 1
            self._count_preemptions(sim)
            self._fail_inside(sim, t, killed=True)
            self.fleet.crash(sim, t)

    def _rollout(self) -> None:
        """Let the Deployment controller replace old-template pods, failing what they held."""
        current = self.fleet.template.hash
        if all(p.template.hash == current for p in self.fleet.pods):
            return
        for sim in self.fleet.rollout(self.now):
            if sim.engine is not None:
                self._count_preemptions(sim)
                self._fail_inside(sim, self.now, killed=True)

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
            self._count_preemptions(sim)
            self._fail_inside(sim, t + 0.5)
            self.fleet.crash(sim, t)

    def _endpoints(self, t: float) -> list[SimPod]:
        lag = self.scenario.balancer.endpoint_lag_s
        return [
            p
            for p in self.fleet.pods
            if (p.state is State.SERVING and p.ready)
            or (p.died_at is not None and p.engine is None and t - p.died_at < lag)
        ]

    def _arrive(self, t: float, client: Client) -> None:
        """Route one attempt: a gateway replica's limit, the balancer, then an engine."""
        client.attempt += 1
        self.outcome.attempts += 1
        self._turn += 1
        client.via = self._turn % len(self.gateways)
        gateway = self.gateways[client.via]
        if not gateway.admits(request_bytes(client)):
            self._answer(t, client, t, 413, [])
            return
        wait = gateway.admit(t)
        if wait is None:
            self._answer(t, client, t, 429, [])
            return
        if wait > 0:  # queued in the gateway's burst: passed on at the rate
            heapq.heappush(self.queued, (t + wait, client.cid, t, client))
            return
        self._route(t, t, client, gateway)

    def _route(self, t: float, sent: float, client: Client, gateway: Gateway) -> None:
        """Pass an attempt sent at ``sent`` on at ``t``: the balancer, then an engine."""
        endpoints = self._endpoints(t)
        if not endpoints:
            self._answer(t, client, sent, 503, [])
            return
        sim = self.balancer.pick(endpoints, [p.engine.load if p.engine else 0 for p in endpoints])
        tried: list[tuple[str, str]] = []
        if sim.engine is None:  # died a moment ago: connect() refused, nginx tries the next
            tried.append((sim.pod.addr, "502"))
            alive = [p for p in endpoints if p.engine is not None]
            if not alive:
                self._answer(t + 0.001, client, sent, 502, tried, tr.REFUSED)
                return
            sim = self.balancer.pick(alive, [p.engine.load if p.engine else 0 for p in alive])
        assert sim.engine is not None
        limit = sim.template.arg_map()["max-model-len"]
        if client.prompt >= limit:
            self._answer(t + 0.01, client, sent, 400, [*tried, (sim.pod.addr, "400")])
            return
        self._rid += 1
        seq = Sequence(
            self._rid,
            client.prompt,
            min(client.output, limit - client.prompt),
            client.logprobs,
            client.prompt_logprobs,
            max_new=min(client.max_tokens, limit - client.prompt),
        )
        sim.engine.waiting.append(seq)
        gateway.in_progress += 1
        self.inflight[self._rid] = _InFlight(client, sent, sim, tried, gateway)

    def _answer(
        self,
        t: float,
        client: Client,
        sent: float,
        status: int,
        tried: list[tuple[str, str]],
        error: str = "",
        *,
        cut: bool = False,
    ) -> None:
        """Log nginx's answer to one attempt, count it, and hand it back to its client."""
        answer = (status, max(0.0, t - sent), error)
        lb = self.lbs[client.via]
        where = (self.upstream, self.scenario.balancer.host)
        emit.access(lb, t, client.who, answer, tried, *where, length=request_bytes(client))
        # counted at the time its record carries: the recorder stamps microseconds
        self.outcome.answer(round((self.recorder.start + t) * 1e6) / 1e6, status)
        self.arrivals.answered(t, client, status, cut=cut, gateway=not tried)

    def _finish(self, rid: int) -> _InFlight | None:
        info = self.inflight.pop(rid, None)
        if info is not None:
            info.gateway.in_progress -= 1
        return info

    def _step_engine(self, sim: SimPod, t0: float, t1: float) -> None:
        """Step a serving pod's engine: answer what finished, or kill the pod on OOM."""
        if sim.engine is None or sim.state is not State.SERVING:
            return
        result = sim.engine.step(t1 - t0)
        if result.oom is not None:
            t = t0 + (t1 - t0) * self.rng.uniform(0.2, 0.9)
            zombie = self.fleet.rngs[sim.slot].random() < self.scenario.pods.zombie_share
            kind = sim.engine.phys.kind
            emit.oom_death(self.recorder, sim.pod, t, sim.engine_tag, result.oom, kind, zombie)
            self._count_oom(sim, t, result.oom.cause)
            if zombie:  # requests inside wait for their timeouts; the pod stays Ready
                sim.engine.dead = True
                return
            self._count_preemptions(sim)
            self._fail_inside(sim, t + 0.02)
            self.fleet.crash(sim, t)
            return
        if sim.engine.retractions:
            emit_sglang.retractions(self.recorder, sim.pod, t1, sim.engine)
        for seq in result.aborted:  # SGLang's last request, out of memory even alone
            info = self._finish(seq.rid)
            if info is not None:
                tried = [*info.tried, (sim.pod.addr, "500")]
                self._answer(t1, info.client, info.at, 500, tried)
        for seq in result.first_tokens:
            info = self.inflight.get(seq.rid)
            if info is not None:
                info.flowing = True
        for seq, frac in result.finished:
            info = self._finish(seq.rid)
            if info is not None:
                done = t0 + (t1 - t0) * frac
                self._answer(done, info.client, info.at, 200, [*info.tried, (sim.pod.addr, "200")])

    def _count_oom(self, sim: SimPod, t: float, cause: str) -> None:
        out = self.outcome
        out.deaths += 1
        out.oom_causes.append(cause)
        if out.first_oom_at is None:
            out.first_oom_at = t
        if sim.slot not in out.victim_slots:
            out.victim_slots.add(sim.slot)
            out.victims.append(sim.pod.name)
            out.pods_lost = len(out.victims)

    def _count_preemptions(self, sim: SimPod) -> None:
        if sim.engine is not None:
            self.outcome.preemptions += sim.engine.preemptions
            sim.engine.preemptions = 0

    def _fail_inside(self, sim: SimPod, t: float, *, killed: bool = False) -> None:
        """Answer every attempt inside ``sim``, which dies at ``t`` (module docstring).

        ``killed``: the process went with its connections (a deleted or restarted container,
        SGLang's process tree, a plain server): 502, streams cut. Otherwise vLLM's engine died
        and its API server answered: 500, and streams (their 200 sent at once) end with an
        error chunk.
        """
        killed = killed or self.scenario.engine.kind != "vllm"
        rids = [rid for rid, info in self.inflight.items() if info.sim is sim]
        for k, rid in enumerate(rids):
            info = self._finish(rid)
            assert info is not None
            at = t + 0.001 * k
            if info.client.stream:
                tried = [*info.tried, (sim.pod.addr, "200")]
                self._answer(at, info.client, info.at, 200, tried, _CUT if killed else "", cut=True)
                continue
            status = 502 if killed else 500
            tried = [*info.tried, (sim.pod.addr, str(status))]
            self._answer(at, info.client, info.at, status, tried, tr.CLOSED if killed else "")

    def _timeouts(self, t1: float) -> None:
        """End the attempts that waited too long for a byte (both timeouts are between reads).

        nginx's ``proxy_read_timeout``: 504 when no headers came; for a stream (200 sent at
        once) whose first token has not come, the 200 is cut. The client's own read timeout,
        when shorter: 499 (the SDK retries it). A stream whose tokens flow never times out.
        """
        nginx_s = self.scenario.balancer.upstream_timeout_s
        client_s = self.scenario.clients.timeout_s
        for rid, info in list(self.inflight.items()):
            if (info.flowing and info.client.stream) or t1 - info.at < min(nginx_s, client_s):
                continue
            self._finish(rid)
            if info.sim.engine is not None:
                info.sim.engine.remove(rid)
            if client_s < nginx_s:
                tried = [*info.tried, (info.sim.pod.addr, "499")]
                self._answer(info.at + client_s, info.client, info.at, 499, tried)
            elif info.client.stream:
                tried = [*info.tried, (info.sim.pod.addr, "200")]
                at = info.at + nginx_s
                self._answer(at, info.client, info.at, 200, tried, _STREAM_TIMED_OUT, cut=True)
            else:
                tried = [*info.tried, (info.sim.pod.addr, "504")]
                self._answer(info.at + nginx_s, info.client, info.at, 504, tried, tr.TIMED_OUT)

    def _scrapes(self, t0: float, t1: float) -> None:
        """Emit the periodic stats line, vLLM gauges and framebuffer samples due in the step."""
        rec, model = self.recorder, self.scenario.model.name
        for t in _multiples(FB_EVERY_S, t0, t1):
            for sim in self.fleet.pods:
                emit.framebuffer(rec, sim.pod, t, self._fb_bytes(sim, t))
        faces = {"vllm": emit, "sglang": emit_sglang}.get(self.scenario.engine.kind)
        serving = [sim for sim in self.fleet.pods if sim.engine is not None]
        if faces is None:  # the unpaged server exports no engine metrics
            return
        for t in _multiples(GAUGES_EVERY_S, t0, t1):
            for sim in serving:
                assert sim.engine is not None
                faces.gauges(rec, sim.pod, t, sim.engine, model)
        for t in _multiples(STATS_EVERY_S, t0, t1):
            for sim in serving:
                assert sim.engine is not None
                faces.stats(rec, sim.pod, t, sim.engine, STATS_EVERY_S)

    def _fb_bytes(self, sim: SimPod, t: float) -> float:
        """Return the GPU framebuffer in use: the engine's, its reservation, or the weights."""
        if sim.engine is not None:  # nvidia-smi: torch's view plus the CUDA context
            return sim.engine.in_use_bytes + 470.0 * emit.MIB
        if sim.state is State.LOADING:
            into = (t - sim.started_at) / max(1.0, sim.ready_at - sim.started_at)
            weights = float(self.scenario.model.weights_gib * 1024**3)
            return 520 * emit.MIB + weights * min(1.0, max(0.0, (into - 0.3) / 0.2))
        return 0.0

    def _track_serving(self, t1: float) -> None:
        out = self.outcome
        if out.first_oom_at is None:
            return
        everyone = len(self.fleet.pods) == self.scenario.replicas and all(
            p.state is State.SERVING and p.ready for p in self.fleet.pods
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
            ready=sim.state is State.SERVING and sim.ready,
            phase="Pending" if sim.state is State.CREATING else "Running",
            waiting_reason=waiting.get(sim.state),
            restart_count=sim.restarts,
            engine_args=sim.template.arg_map(),
            template_hash=sim.template.hash,
        )


_CUT = "upstream prematurely closed connection while reading upstream"
_STREAM_TIMED_OUT = "upstream timed out (110: Connection timed out) while reading upstream"


def _multiples(every: float, t0: float, t1: float) -> list[float]:
    """Return the multiples of ``every`` in ``[t0, t1)``."""
    k = math.ceil(t0 / every - 1e-9)
    out: list[float] = []
    while k * every < t1 - 1e-9:
        out.append(k * every)
        k += 1
    return out
