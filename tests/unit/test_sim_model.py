"""The endpoint simulator against known numbers: KV growth, back-off, balancer, gateway, rollouts.

Known numbers: Llama-3.1-8B in bf16 holds 2 x 32 layers x 8 KV heads x 128 x 2 bytes =
131,072 bytes (128 KiB) per token (https://huggingface.co/meta-llama/Llama-3.1-8B config.json);
the kubelet's restart back-off is 10 s doubling to a 300 s cap, reset after 10 min running
(https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-restarts).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ConfigError
from detector.events.engine_lines import parse_engine_line
from detector.lab.recorder import Recorder
from detector.sim import emit_sglang
from detector.sim.engine import Engine, Sequence
from detector.sim.memory import physics
from detector.sim.model import Endpoint
from detector.sim.pods import BACKOFF_RESET_S, next_backoff
from detector.sim.scenario import Scenario, load_scenario, scenario_names
from detector.sim.traffic import CUT, Arrivals, Balancer, Client, Gateway, GatewayLimit

START = 1741942800.0
ARGS = {"max-num-seqs": 256, "max-num-batched-tokens": 8192, "max-model-len": 32768}


def _quiet(**update: object) -> Scenario:
    """Return a small scenario: 4 replicas, 4 short requests a second once they serve."""
    doc: dict[str, object] = {
        "name": "quiet",
        "description": "test",
        "duration_s": 300,
        "traffic": {"rps": [[0, 0], [55, 0], [56, 4]]},
        "model": {"load_s": [40, 45]},
        **update,
    }
    return Scenario.model_validate(doc)


def _access(ep: Endpoint) -> list[str]:
    """Return the ingress access lines recorded so far (log text)."""
    rows = ep.recorder.files.get("lb-access.jsonl", [])
    return [json.loads(text)["log"] for _, _, text in rows]


# --- physics -----------------------------------------------------------------------------------


def _engine(scenario: Scenario | None = None, **args: int) -> Engine:
    phys = physics(scenario or _quiet(), {**ARGS, **args})
    return Engine(phys, {**ARGS, **args}["max-num-seqs"], 8192)


def test_llama_kv_is_128_kib_per_token_and_grows_with_every_token() -> None:
    engine = _engine()
    assert engine.phys.kv_bytes_per_token == 131_072
    engine.waiting.append(Sequence(1, prompt=4000, output=100))
    engine.step(0.5)  # 15,000 prompt tokens a second: the prompt is prefilled in one step
    assert engine.running[0].computed == 4000 and engine.running[0].blocks == 250
    engine.step(1.5)  # one token per iteration of ~10 ms: the whole output is decoded
    assert not engine.running and engine.generation_tokens == pytest.approx(100)


def test_the_kv_pool_matches_vllms_own_figure_for_llama_on_an_h100() -> None:
    """vLLM 0.10 logs ``GPU KV cache size: 443,024 tokens`` for this model and GPU."""
    tokens = physics(_quiet(), ARGS).kv_pool_tokens
    assert abs(tokens - 443_024) / 443_024 < 0.01


def test_a_full_kv_pool_preempts_the_newest_and_recomputes_it_never_ooms() -> None:
    """vLLM V1: no block for a running request -> the newest is preempted to the waiting front."""
    engine = _engine()
    pool = engine.phys.kv_pool_tokens
    for rid in range(20):  # 20 x 31k prompts: far more than the pool's ~443k tokens
        engine.waiting.append(Sequence(rid, prompt=31_000, output=2000))
    admitted: set[int] = set()
    for _ in range(400):
        result = engine.step(0.5)
        assert result.oom is None
        held = sum(s.blocks for s in engine.running) * engine.phys.block_size
        assert held <= pool
        admitted |= {s.rid for s in engine.running}
    assert engine.preemptions > 0
    assert len(admitted) > pool // 33_000  # more ran than fit at once: the preempted came back
    again = [s for s in engine.waiting if s.preempted] + [s for s in engine.running if s.preempted]
    assert all(s.computed <= s.target for s in again)


def test_a_preempted_request_goes_back_to_the_front_with_nothing_computed() -> None:
    engine = _engine()
    blocks = engine.phys.kv_pool_tokens // 16 // 2  # two decoding requests fill the pool
    engine.running = [
        Sequence(rid, blocks * 16 - 1, 100, generated=1, computed=blocks * 16, blocks=blocks)
        for rid in (1, 2)
    ]
    engine.waiting.append(Sequence(3, 100, 10))
    assert engine.step(0.5).oom is None
    assert [s.rid for s in engine.running] == [1]
    assert [s.rid for s in engine.waiting] == [2, 3]  # the newest, at the front
    assert engine.waiting[0].computed == 0 and engine.waiting[0].blocks == 0
    assert engine.preemptions == 1


def test_sglang_retracts_the_request_with_the_fewest_output_tokens_to_the_back() -> None:
    """SGLang's ``retract_decode``: fewest output tokens first, ties the longest prompt."""
    engine = _engine(_quiet(engine={"kind": "sglang"}))
    pool = engine.phys.kv_pool_tokens
    assert engine.phys.block_size == 1 and pool > 400_000
    each = pool // 10 - 5  # ten decoding requests that fill the pool but for 50 tokens
    prompts = [each - 20 - k for k in range(10)]
    engine.running = [
        Sequence(k, prompts[k], 5000, generated=20 + k % 3, computed=each, blocks=each)
        for k in range(10)
    ]
    engine.waiting.append(Sequence(99, 100, 10))
    assert engine.step(0.5).oom is None
    assert sum(s.blocks for s in engine.running) <= pool
    retracted = [s.rid for s in engine.waiting if s.preempted]
    assert retracted and engine.waiting[-1].preempted  # to the back of the queue
    assert retracted[0] == 0  # fewest output tokens (20), then the longest prompt
    n, old, new = engine.retractions[0]
    assert n == len(retracted) and old == pytest.approx(0.7) and 0 < new <= 1
    lines: list[str] = []
    rec = Recorder("x", START)
    pod = rec.pod("llm", "sg-abc", "node-1", "10.0.0.9", "sglang", "img")
    emit_sglang.retractions(rec, pod, 1.0, engine)
    lines = [json.loads(t)["log"] for _, _, t in rec.files["container-logs.jsonl"]]
    parsed = [parse_engine_line(line) for line in lines]
    assert parsed and all(p is not None and p[1]["engine"] == "sglang" for p in parsed)


def test_sglang_admits_by_its_token_ratio_not_just_the_free_pool() -> None:
    engine = _engine(_quiet(engine={"kind": "sglang"}))
    free = engine.free_blocks
    engine.running = [Sequence(0, 100, 10_000, computed=100, generated=1, blocks=101)]
    reserve = min(10_000 - 1, 4096) * engine.new_token_ratio  # CLIP_MAX_NEW_TOKENS
    engine.waiting.append(Sequence(1, prompt=int(free - reserve) + 10, output=1))
    engine.step(0.5)
    assert [s.rid for s in engine.waiting] == [1]  # it fits the pool but not the reserve


def test_an_sglang_pod_logs_what_the_detector_reads() -> None:
    scenario = _quiet(engine={"kind": "sglang"})
    ep = Endpoint(scenario, start=START)
    ep.advance(120)
    lines = [json.loads(t)["log"] for _, _, t in ep.recorder.files["container-logs.jsonl"]]
    kinds = {p[0].value for p in map(parse_engine_line, lines) if p is not None}
    assert kinds == {"engine_config", "engine_pressure"}
    pool = next(p[1] for p in map(parse_engine_line, lines) if p and "kv_cache_tokens" in p[1])
    assert pool["kv_cache_tokens"] == physics(scenario, ARGS).kv_pool_tokens
    names = {json.loads(t)["name"] for _, _, t in ep.recorder.files["gpu-metrics.jsonl"]}
    assert {"sglang:token_usage", "sglang:num_running_reqs"} <= names
    assert ep.pods()[0].engine_args["max-num-seqs"] == 256


def test_prompt_logprobs_over_a_chunk_pass_the_headroom_the_profile_left() -> None:
    """vllm#5907 / PR #52054: [scheduled tokens, vocab] logits and log_softmax, never profiled."""
    tight = _quiet(engine={"gpu_memory_utilization": 0.95})
    engine = _engine(tight)
    engine.waiting.append(Sequence(1, prompt=12_000, output=1, prompt_logprobs=True))
    result = engine.step(0.5)
    assert result.oom is not None and result.oom.cause == "prompt_logprobs"
    plain = _engine(tight)
    plain.waiting.append(Sequence(1, prompt=12_000, output=1))
    assert plain.step(0.5).oom is None  # the same prompt without logprobs is fine


@pytest.mark.parametrize(
    ("name", "frame"),
    [("single-oversized", "in _get_prompt_logprobs_dict"), ("long-prompt-burst", "llama.py")],
)
def test_the_oom_traceback_shows_where_the_unprofiled_allocation_failed(
    name: str, frame: str
) -> None:
    ep = Endpoint(load_scenario(name), start=START)
    ep.advance(ep.scenario.duration_s)
    lines = [json.loads(t)["log"] for _, _, t in ep.recorder.files["container-logs.jsonl"]]
    oom = next(i for i, line in enumerate(lines) if "torch.OutOfMemoryError" in line)
    assert any(frame in line for line in lines[oom - 6 : oom])


def test_without_paged_attention_batch_times_length_is_the_memory() -> None:
    unpaged = _quiet(engine={"kind": "unpaged", "max_num_seqs": 32})
    engine = _engine(unpaged, **{"max-num-seqs": 32})
    assert engine.phys.kv_pool_tokens == 0
    for rid in range(17):  # 17 x 31k tokens = 64.3 GiB of KV on top of 15 GiB of weights
        engine.running.append(Sequence(rid, prompt=31_000, output=500, computed=31_000))
    result = engine.step(0.5)
    assert result.oom is not None and result.oom.cause == "kv_cache"


def test_decode_slows_as_the_batch_grows() -> None:
    def tokens_per_s(batch: int) -> float:
        engine = _engine()
        engine.running = [Sequence(i, 10, 10_000, computed=10, blocks=1) for i in range(batch)]
        engine.step(1.0)
        return engine.generation_tokens / batch

    assert tokens_per_s(1) > 2 * tokens_per_s(256) > 0


def test_a_busy_fleet_preempts_and_loses_no_pod() -> None:
    ep = Endpoint(load_scenario("busy-no-trigger"), start=START)
    ep.advance(ep.scenario.duration_s)
    assert ep.outcome.deaths == 0 and ep.outcome.non_oom_deaths == 0
    preemptions = [
        float(json.loads(text)["value"])
        for _, _, text in ep.recorder.files["gpu-metrics.jsonl"]
        if '"vllm:num_preemptions_total"' in text
    ]
    assert preemptions and max(preemptions) > 0


# --- Kubernetes ------------------------------------------------------------------------------


def test_restart_back_off_doubles_from_10_s_to_a_5_min_cap() -> None:
    delays, backoff = [], 10.0
    for _ in range(7):
        delay, backoff = next_backoff(backoff, ran_s=50.0)
        delays.append(delay)
    assert delays == [10, 20, 40, 80, 160, 300, 300]
    assert next_backoff(300.0, ran_s=BACKOFF_RESET_S)[0] == 10


def test_a_rolling_update_replaces_one_pod_at_a_time_with_the_new_args() -> None:
    ep = Endpoint(_quiet(), start=START)
    ep.advance(60)
    before = {p.name for p in ep.pods()}
    assert all(p.ready for p in ep.pods())
    ep.set_deployment_args({"max-num-seqs": 13})
    assert ep.deployment_args()["max-num-seqs"] == 13
    new_hash = ep.fleet.template.hash
    for t in range(61, 400):
        ep.advance(float(t))
        pods = ep.pods()
        assert len(pods) == 4
        assert sum(1 for p in pods if not p.ready) <= 1
    pods = ep.pods()
    assert all(p.template_hash == new_hash and p.ready for p in pods)
    assert all(p.engine_args["max-num-seqs"] == 13 for p in pods)
    assert not before & {p.name for p in pods}


def test_evict_replaces_the_pod_under_a_new_name_that_loads_weights() -> None:
    ep = Endpoint(_quiet(), start=START)
    ep.advance(60)
    victim = ep.pods()[1]
    assert ep.evict(victim.name)
    assert not ep.evict("no-such-pod")
    names = [p.name for p in ep.pods()]
    assert victim.name not in names and len(names) == 4
    fresh = next(p for p in ep.pods() if not p.ready)
    assert fresh.name.startswith(f"vllm-llama-{victim.template_hash}-")
    ep.advance(90)
    assert not next(p for p in ep.pods() if p.name == fresh.name).ready  # still loading
    ep.advance(120)
    assert all(p.ready for p in ep.pods())
    records = [json.loads(t) for _, _, t in ep.recorder.files["k8s-events.jsonl"]]
    reasons = [r["reason"] for r in records if r.get("kind") != "EndpointSlice"]
    assert "Killing" in reasons


# --- load balancer and gateway --------------------------------------------------------------


def test_round_robin_spreads_evenly_over_ready_pods() -> None:
    balancer, pods = Balancer("round_robin"), ["a", "b", "c", "d"]
    picks = [balancer.pick(pods, [0, 0, 0, 0]) for _ in range(400)]
    assert {p: picks.count(p) for p in pods} == {"a": 100, "b": 100, "c": 100, "d": 100}


def test_least_connections_prefers_the_idle_pod() -> None:
    balancer = Balancer("least_connections")
    assert {balancer.pick(["a", "b", "c"], [7, 0, 3]) for _ in range(10)} == {"b"}


def test_no_ready_pod_is_answered_503_by_nginx_itself() -> None:
    ep = Endpoint(_quiet(traffic={"rps": [[0, 5]]}), start=START)
    ep.advance(30)  # every pod is still loading its weights
    lines = _access(ep)
    assert lines and all(
        '" 503 ' in line and "[llm-vllm-llama-8000] [] - - - -" in line for line in lines
    )
    assert ep.outcome.attempts_5xx == ep.outcome.attempts > 0


def test_a_dead_engines_requests_get_vllms_500_and_the_sdk_retries_them_elsewhere() -> None:
    """vLLM answers 500 (EngineDeadError) to what it held; the retry reaches the next pod."""
    ep = Endpoint(load_scenario("single-oversized"), start=START)
    ep.advance(301)
    assert ep.outcome.deaths >= 1
    victims = {sim.pod.addr for sim in ep.fleet.pods if sim.pod.name in ep.outcome.victims}
    bad = [line for line in _access(ep) if '" 500 ' in line]
    assert bad
    for line in bad:  # the last upstream tried is a victim, and it answered 500
        upstream = line.split("] [] ")[1]
        assert any(upstream.startswith(v) or f", {v}" in upstream for v in victims)
        assert upstream.split()[-2].endswith("500")
    ep.advance(305)
    assert 2 <= ep.outcome.deaths <= 3  # the same request, retried, kills the next pods
    assert len(set(ep.outcome.victims)) == ep.outcome.deaths


def test_the_gateway_limit_sheds_with_429_above_its_rate() -> None:
    gateway = Gateway()
    gateway.set(GatewayLimit(5.0), 0.0)
    allowed = sum(gateway.admit(i / 20) is not None for i in range(200))  # 20 a second for 10 s
    assert allowed == 50  # nginx, burst 0: one every 1/rate s from the first
    gateway.set(GatewayLimit(5.0, burst=10), 0.0)
    assert (
        sum(gateway.admit(0.0) is not None for _ in range(20)) == 1 + 10
    )  # a tight burst: 1 + burst
    ep = Endpoint(_quiet(), start=START)
    ep.advance(60)
    ep.set_gateway_limit(GatewayLimit(1.0))
    ep.advance(120)
    shed = ep.outcome.attempts_429
    assert shed > 100 and ep.outcome.attempts_5xx == 0
    assert sum('" 429 ' in line for line in _access(ep)) == shed
    ep.set_gateway_limit(None)
    ep.advance(150)
    assert ep.outcome.attempts_429 == shed


def test_without_nodelay_the_burst_is_a_queue_served_at_the_rate() -> None:
    gateway = Gateway()
    gateway.set(GatewayLimit(5.0, burst=10, nodelay=False), 0.0)
    waits = [gateway.admit(0.0) for _ in range(12)]
    assert waits[0] == 0.0 and waits[1:11] == [n / 5.0 for n in range(1, 11)]  # excess / rate
    assert waits[11] is None  # over the burst: 429
    # the same requests are refused either way (nginx counts the excess alike); with nodelay
    # the burst reaches the pods at once, queued it reaches them at the rate
    ep = Endpoint(_quiet(), start=START)
    ep.advance(60)
    before = (ep.outcome.attempts, ep.outcome.attempts_429)
    ep.set_gateway_limit(GatewayLimit(1.0, burst=30, nodelay=False))
    ep.advance(70)
    arrived = ep.outcome.attempts - before[0]
    passed = arrived - (ep.outcome.attempts_429 - before[1]) - len(ep.queued)
    assert arrived > 25 and ep.queued  # 4/s arrive
    assert passed <= 1 + 10  # 1/s reach the pods over 10 s, the first one free


def test_the_admission_rule_refuses_larger_bodies_with_413_never_retried() -> None:
    gateway = Gateway()
    gateway.set(GatewayLimit(max_body_bytes=10_000), 0.0)
    assert gateway.admits(10_000) and not gateway.admits(10_001)
    assert gateway.admit(0.0) == 0.0  # no rate limit with it
    poison = {"at_s": 65, "prompt_tokens": 12000, "output_tokens": 1}
    sc = _quiet(traffic={"rps": [[0, 0], [55, 0], [56, 4]], "requests": [poison]})
    ep = Endpoint(sc, start=START)
    ep.advance(60)
    ep.set_gateway_limit(GatewayLimit(max_body_bytes=40_000))
    ep.advance(70)
    refused = [line for line in _access(ep) if '" 413 ' in line]
    assert len(refused) == 1  # the 12k-token request, once: clients do not retry a 413
    assert f" {700 + 4 * 12000} " in refused[0]  # its $request_length


def test_each_gateway_replica_enforces_the_limit_in_its_own_zone() -> None:
    one = Endpoint(_quiet(), start=START)
    two = Endpoint(_quiet(balancer={"gateway_replicas": 2}), start=START)
    for ep in (one, two):
        ep.advance(60)
        ep.set_gateway_limit(GatewayLimit(1.0))
        ep.advance(120)
    passed = [ep.outcome.attempts - ep.outcome.attempts_429 for ep in (one, two)]
    assert passed[1] > 1.6 * passed[0]  # two nginx zones let about twice the rate through


def test_the_gateway_connection_limit_sheds_what_is_over_the_requests_in_progress() -> None:
    gateway = Gateway()
    gateway.set(GatewayLimit(1000.0, burst=1000, connections=3), 0.0)
    allowed = []
    for n in range(5):
        gateway.in_progress = n
        allowed.append(gateway.admit(0.0) is not None)
    assert allowed == [True] * 3 + [False] * 2


def test_clients_retry_as_the_openai_sdk_does() -> None:
    """``max_retries`` 2; 408/409/429/5xx retried after min(0.5 x 2^n, 8) s x U(0.75, 1)."""
    arrivals = Arrivals(_quiet(), random.Random(1), random.Random(2))
    client = Client(1, ("203.0.113.9", "curl/8.5.0"), 100, 10, attempt=1)
    arrivals.answered(10.0, client, 500)
    (t, _, again), *_ = arrivals.retries
    assert again is client and 10.375 <= t <= 10.5
    assert arrivals.between(10.0, 20.0) == [(t, client)]
    client.attempt = 3
    arrivals.answered(30.0, client, 503)
    assert arrivals.retries == [] and client.final == 503
    for status, final in ((400, 400), (413, 413), (200, 200)):
        fresh = Client(2, ("203.0.113.9", "curl/8.5.0"), 100, 10, attempt=1)
        arrivals.answered(40.0, fresh, status)
        assert fresh.final == final and arrivals.retries == []
    cut = Client(3, ("203.0.113.9", "curl/8.5.0"), 100, 10, stream=True, attempt=1)
    arrivals.answered(50.0, cut, 200, cut=True)
    assert cut.final == CUT and arrivals.retries == []  # a broken stream is never retried
    ep = Endpoint(_quiet(traffic={"rps": [[0, 5]]}), start=START)
    ep.advance(30)  # nothing serves yet: every client tries three times
    assert ep.outcome.attempts > 2 * 5 * 25


def test_every_mode_of_a_seed_sees_the_same_clients() -> None:
    """The arrivals have their own generator: a gateway limit changes no client's arrival."""

    def clients(limit: GatewayLimit | None) -> list[tuple[float, int, int]]:
        ep = Endpoint(load_scenario("single-oversized"), start=START, seed=5)
        ep.advance(200)
        ep.set_gateway_limit(limit)
        ep.advance(400)
        return [(c.first_at, c.prompt, c.output) for c in ep.arrivals.clients]

    assert clients(None) == clients(GatewayLimit(2.0, connections=4))


def test_a_zombie_engine_stays_ready_and_its_requests_time_out() -> None:
    """vllm#39863: the core is dead, ``/health`` answers 200, requests wait for a timeout."""
    scenario = load_scenario("single-oversized")
    scenario = scenario.model_copy(update={"pods": scenario.pods.model_copy(
        update={"zombie_share": 1.0})})  # fmt: skip
    ep = Endpoint(scenario, start=START)
    ep.advance(301)
    (victim,) = [p for p in ep.fleet.pods if p.engine is not None and p.engine.dead]
    lines = [json.loads(t)["log"] for _, _, t in ep.recorder.files["container-logs.jsonl"]]
    assert any("torch.OutOfMemoryError" in line for line in lines)
    assert not any("EngineDeadError" in line or "Shutting down" in line for line in lines)
    ep.advance(400)
    assert victim in ep.fleet.pods and victim.ready and victim.restarts == 0
    assert any('" 504 ' in line and victim.pod.addr in line for line in _access(ep))


def test_a_liveness_probe_too_slow_under_load_restarts_the_container() -> None:
    ep = Endpoint(load_scenario("probe-restarts"), start=START)
    ep.advance(ep.scenario.duration_s)
    assert ep.outcome.non_oom_deaths > 0 and ep.outcome.deaths == 0
    records = [json.loads(t) for _, _, t in ep.recorder.files["k8s-events.jsonl"]]
    reasons = [r["message"] for r in records if r.get("kind") != "EndpointSlice"]
    assert any("failed liveness probe, will be restarted" in m for m in reasons)
    assert any("context deadline exceeded" in m for m in reasons)


# --- records ---------------------------------------------------------------------------------


def test_same_seed_same_records_and_another_seed_others() -> None:
    def run(seed: int) -> list[tuple[str, float, str]]:
        ep = Endpoint(load_scenario("single-oversized"), start=START, seed=seed)
        ep.advance(320)
        return ep.recorder.drain(320)

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_drain_returns_and_removes_records_up_to_an_offset_in_order() -> None:
    rec = Recorder("x", START)
    rec.put("b.jsonl", 2.0, {"n": 1})
    rec.put("a.jsonl", 1.0, {"n": 2})
    rec.put("a.jsonl", 3.0, {"n": 3})
    assert rec.drain(2.0) == [("a.jsonl", 1.0, '{"n":2}'), ("b.jsonl", 2.0, '{"n":1}')]
    assert rec.drain(2.5) == []
    assert rec.drain(10.0) == [("a.jsonl", 3.0, '{"n":3}')]


def test_pod_views_show_crash_loop_back_off_after_an_oom() -> None:
    ep = Endpoint(load_scenario("single-oversized"), start=START)
    ep.advance(300.5)
    waiting = [p for p in ep.pods() if p.waiting_reason == "CrashLoopBackOff"]
    assert waiting and not waiting[0].ready and waiting[0].phase == "Running"
    ep.advance(320)
    assert [p.restart_count for p in ep.pods() if p.name == waiting[0].name] == [1]


# --- scenarios -------------------------------------------------------------------------------


def test_the_shipped_scenarios_load() -> None:
    assert {
        "default", "poison-request", "long-prompt-burst", "load-shift", "no-paged-attention",
        "busy-no-trigger", "probe-restarts", "non-oom", "single-oversized",
    } <= set(scenario_names())  # fmt: skip
    for name in scenario_names():
        assert load_scenario(name).name == name


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("poison-request", "prompt_logprobs"),
        ("single-oversized", "prompt_logprobs"),
        ("long-prompt-burst", "long_context"),
        ("default", "long_context"),
        ("load-shift", "long_context"),
        ("no-paged-attention", "kv_cache"),
    ],
)
def test_each_oom_scenario_cascades_without_containment_for_its_own_reason(
    name: str, cause: str
) -> None:
    """The model alone is containment off: at least two replicas die, of the scenario's cause."""
    ep = Endpoint(load_scenario(name), start=START)
    ep.advance(ep.scenario.duration_s)
    assert ep.outcome.pods_lost >= 2
    assert set(ep.outcome.oom_causes) == {cause}


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("name: x\ndescription: y\nduration_s: 10\nreplica: 3\n", "replica: unknown key"),
        (
            "name: x\ndescription: y\nduration_s: 10\nengine: {max_num_seqs: 0}\n",
            "engine.max_num_seqs",
        ),
        ("name: x\ndescription: y\n", "duration_s"),
    ],
)
def test_a_bad_scenario_is_one_line_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_scenario_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"one of .*default"):
        load_scenario("nope")


# --- end to end with the real detector (no actuation) ---------------------------------------


def _replay(tmp_path: Path, name: str) -> dict[str, Any]:
    ep = Endpoint(load_scenario(name), start=START)
    ep.advance(ep.scenario.duration_s)
    ep.recorder.write(tmp_path / name)
    db = f"sqlite:///{tmp_path / name}.db"
    cmd = [sys.executable, "-m", "detector", "replay", "--json", "--db", db, str(tmp_path / name)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _stages(doc: dict[str, Any]) -> list[str]:
    return [
        entry["message"]
        for incident in doc["incidents"]
        if incident["pattern"] == "gpu_oom_cascade"
        for entry in incident["timeline"]
        if entry["kind"] == "stage"
    ]


def test_the_default_cascade_reaches_cascading_in_the_detector(tmp_path: Path) -> None:
    stages = _stages(_replay(tmp_path, "default"))
    assert any(stage.startswith("stage -> cascading") for stage in stages)


def test_a_kernel_fault_is_never_a_gpu_oom_cascade(tmp_path: Path) -> None:
    assert _stages(_replay(tmp_path, "non-oom")) == []
