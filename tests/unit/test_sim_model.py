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
from detector.lab.recorder import Recorder
from detector.sim.engine import Engine, Sequence, physics
from detector.sim.model import Endpoint
from detector.sim.pods import BACKOFF_RESET_S, next_backoff
from detector.sim.scenario import Scenario, load_scenario, scenario_names
from detector.sim.traffic import Arrivals, Balancer, Client, Gateway, GatewayLimit

START = 1741942800.0
ARGS = {"max-num-seqs": 256, "max-num-batched-tokens": 8192, "max-model-len": 32768}


def _quiet(**update: object) -> Scenario:
    """Return a small scenario: 4 replicas, 4 short requests a second once they serve."""
    doc: dict[str, object] = {
        "name": "quiet",
        "description": "test",
        "duration_s": 300,
        "traffic": {"rps": [[0, 0], [55, 0], [56, 4]]},
        **update,
    }
    return Scenario.model_validate(doc)


def _access(ep: Endpoint) -> list[str]:
    """Return the ingress access lines recorded so far (log text)."""
    rows = ep.recorder.files.get("lb-access.jsonl", [])
    return [json.loads(text)["log"] for _, _, text in rows]


# --- physics -----------------------------------------------------------------------------------


def test_llama_kv_is_128_kib_per_token_and_grows_with_every_token() -> None:
    phys = physics(_quiet(), ARGS)
    assert phys.kv_bytes_per_token == 131_072
    engine = Engine(phys, 256, 8192)
    engine.waiting.append(Sequence(1, prompt=4000, output=100))
    engine.step(0.5)  # 15,000 prompt tokens a second: the prompt is prefilled in one step
    assert engine.kv_bytes() == 4000 * 131_072
    engine.step(0.5)  # decoding at 40 tokens/s: 20 more
    assert engine.kv_bytes() == pytest.approx(4020 * 131_072)


def test_the_kv_pool_matches_vllms_own_figure_for_llama_on_an_h100() -> None:
    """vLLM 0.10 logs ``GPU KV cache size: 443,024 tokens`` for this model and GPU."""
    tokens = physics(_quiet(), ARGS).kv_pool_tokens
    assert abs(tokens - 443_024) / 443_024 < 0.01


def test_an_allocation_past_the_gpu_kills_the_engine() -> None:
    phys = physics(_quiet(), ARGS)
    engine = Engine(phys, 256, 8192)
    for rid in range(17):  # 17 x 31k tokens = 64.3 GiB of KV on top of 15 GiB of weights
        engine.running.append(Sequence(rid, prompt=31_000, output=500, prefilled=31_000))
    result = engine.step(0.5)
    assert result.oom is not None
    assert result.in_use_bytes > phys.capacity_bytes


def test_ceilings_sized_for_the_kv_pool_survive_the_default_burst() -> None:
    scenario = load_scenario("default")
    engine = scenario.engine.model_copy(update={"max_num_seqs": 13})
    ep = Endpoint(scenario.model_copy(update={"engine": engine}), start=START)
    ep.advance(600)
    assert ep.outcome.deaths == 0


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
    reasons = [json.loads(t)["reason"] for _, _, t in ep.recorder.files["k8s-events.jsonl"]]
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
    assert ep.outcome.failed_requests == ep.outcome.requests > 0


def test_a_dying_pods_requests_in_flight_get_502_with_its_address() -> None:
    ep = Endpoint(load_scenario("single-oversized"), start=START)
    ep.advance(310)
    assert ep.outcome.deaths == 1
    victim = next(sim.pod for sim in ep.fleet.pods if sim.pod.name == ep.outcome.victims[0])
    bad = [line for line in _access(ep) if '" 502 ' in line]
    assert bad
    for line in bad:
        addr, _, _, status = line.split("] [] ")[1].split()[:4]
        assert (addr, status) == (victim.addr, "502")


def test_the_gateway_limit_sheds_with_429_above_its_rate() -> None:
    gateway = Gateway()
    gateway.set(GatewayLimit(5.0), 0.0)
    allowed = sum(gateway.allow(i / 20) for i in range(200))  # 20 a second for 10 s
    assert allowed == 50  # nginx, burst 0: one every 1/rate s from the first
    gateway.set(GatewayLimit(5.0, burst=10), 0.0)
    assert sum(gateway.allow(0.0) for _ in range(20)) == 1 + 10  # a tight burst: 1 + burst
    ep = Endpoint(_quiet(), start=START)
    ep.advance(60)
    ep.set_gateway_limit(GatewayLimit(1.0))
    ep.advance(120)
    shed = ep.outcome.shed_requests
    assert shed > 100 and ep.outcome.failed_requests == 0
    assert sum('" 429 ' in line for line in _access(ep)) == shed
    ep.set_gateway_limit(None)
    ep.advance(150)
    assert ep.outcome.shed_requests == shed


def test_the_gateway_connection_limit_sheds_what_is_over_the_requests_in_progress() -> None:
    gateway = Gateway()
    gateway.set(GatewayLimit(1000.0, burst=1000, connections=3), 0.0)
    assert [gateway.allow(0.0, in_progress=n) for n in range(5)] == [True] * 3 + [False] * 2


def test_a_failed_client_retries_with_back_off_as_new_requests_up_to_its_attempts() -> None:
    arrivals = Arrivals(_quiet(clients={"max_attempts": 3, "backoff_s": 2.0}), random.Random(1))
    client = Client(("203.0.113.9", "curl/8.5.0"), 100, 10, False, max_attempts=3, attempt=1)
    arrivals.failed(10.0, client)
    (t, _, again), *_ = arrivals.retries
    assert again is client and 11.0 <= t <= 12.0  # 2 s x 2^0 x U(0.5, 1)
    assert arrivals.between(10.0, 20.0) == [(t, client)]
    client.attempt = 3
    arrivals.failed(30.0, client)
    assert arrivals.retries == []
    ep = Endpoint(_quiet(traffic={"rps": [[0, 5]]}), start=START)
    ep.advance(30)  # nothing serves yet: every client tries three times
    assert ep.outcome.requests > 2 * 5 * 25


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
    ep.advance(305)
    waiting = [p for p in ep.pods() if p.waiting_reason == "CrashLoopBackOff"]
    assert len(waiting) == 1 and not waiting[0].ready and waiting[0].phase == "Running"
    ep.advance(320)
    assert [p.restart_count for p in ep.pods() if p.name == waiting[0].name] == [1]


# --- scenarios -------------------------------------------------------------------------------


def test_the_shipped_scenarios_load() -> None:
    assert {"default", "slow-ramp", "single-oversized", "non-oom"} <= set(scenario_names())
    for name in scenario_names():
        assert load_scenario(name).name == name


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
    with pytest.raises(ConfigError, match="one of default"):
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


def test_a_single_oversized_request_never_reaches_cascading(tmp_path: Path) -> None:
    stages = _stages(_replay(tmp_path, "single-oversized"))
    assert stages and stages[0].startswith("stage -> suspected")
    assert not any(stage.startswith("stage -> cascading") for stage in stages)
