"""The closed loop: the model's streams through the real detector, containment through the real
actuators and the Kubernetes API stand-in back into the model.

What it checks is the loop's wiring and the outcome's shape, not that containment wins (the
numbers of each run are deterministic; bench/bench_outcome.py measures them over seeds and
the README reports them, wins and losses alike): without containment the default cascade
takes at least two pods and is seen as cascading; with containment the real actuators' writes
reach the stand-ins and change the model; the outcome is counted per client request, each
mode on the same arrivals; a kept run's postmortem counts what the simulator answered in its
span; ``detector simulate --record`` writes streams that ``detector replay`` reads to the same
incident.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from detector.actuators.nginx.config import RateLimit, render_http, render_location
from detector.config import Settings
from detector.sim.cluster import SimCluster, engine_args
from detector.sim.gateway import NginxStandIn
from detector.sim.kube_api import KubeStandIn, Recorded
from detector.sim.loop import STORE, Containment, SimOutcome, simulate
from detector.sim.model import Endpoint
from detector.sim.scenario import load_scenario
from detector.sim.traffic import GatewayLimit

SEED = 7
KEYS = {
    "client_requests", "client_failed", "shed_requests", "goodput_tokens_per_s", "latency_p50_s",
    "latency_p99_s", "pods_total", "pods_lost", "recover_s", "incidents", "actions",
    "left_in_force",
}  # fmt: skip


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the folder that keeps each mode's store (``simulate --keep``), by mode."""
    return tmp_path_factory.mktemp("kept")


@pytest.fixture(scope="module")
def outcomes(kept: Path) -> dict[Containment, SimOutcome]:
    """Run the default scenario once per containment mode (about 15 s each)."""
    scenario = load_scenario("default")
    return {
        m: simulate(scenario, Settings(), mode=m, seed=SEED, workdir=kept / m.value)
        for m in Containment
    }


def test_without_containment_the_default_cascade_loses_pods_and_is_seen(
    outcomes: dict[Containment, SimOutcome],
) -> None:
    off = outcomes[Containment.OFF]
    assert off.pods_lost >= 2 and off.incidents >= 1
    assert off.detect_s is not None and off.detect_s < 60  # cascading, seen from the streams
    assert off.actions == [] and off.shed_requests == 0  # dry-run: nothing reached the cluster
    assert 0 < off.client_failed < off.client_requests


def test_every_mode_counts_the_same_clients_per_request(
    outcomes: dict[Containment, SimOutcome],
) -> None:
    for outcome in outcomes.values():
        assert set(outcome.as_dict()) >= KEYS
        assert outcome.shed_requests <= outcome.client_failed
    arrived = {o.client_requests for o in outcomes.values()}
    assert len(arrived) == 1  # paired: each mode of a seed sees the same arrivals


@pytest.mark.parametrize("mode", [Containment.ON, Containment.PREDICTIVE])
def test_containment_reaches_the_cluster(
    outcomes: dict[Containment, SimOutcome], mode: Containment
) -> None:
    contained = outcomes[mode]
    # the default cascade's long documents are a request class: the gateway refuses it (413)
    # at the first victim, and the run goes on until the rule is lifted again
    assert contained.actions[0].startswith("nginx: client_max_body_size"), contained.actions
    assert contained.contain_s is not None and contained.contain_s < 5
    assert contained.left_in_force == [] and contained.stage == "resolved"


@pytest.mark.parametrize(
    ("mode", "by"), [(Containment.ON, "containment"), (Containment.OFF, "pods")]
)
def test_a_kept_runs_postmortem_counts_what_the_simulator_answered_in_its_span(
    outcomes: dict[Containment, SimOutcome], kept: Path, mode: Containment, by: str
) -> None:
    """The postmortem counts the access lines of its span; the simulator counts its own
    answers in that span (``answered_in_span``): the same figures. On: the 413s of the
    gateway's body-size rule are shed, as the 429s would be; off: the 5xx of a cascade left
    alone, an nginx error-log line no second response. And ``contained`` says who did it: the
    applied quarantine (on), or the pods by themselves (off: dry-run)."""
    outcome = outcomes[mode]
    assert outcome.incident is not None
    url = f"sqlite:///{kept / mode.value / STORE}"
    doc = json.loads(_cli("postmortem", outcome.incident, "-f", "json", "--db", url).stdout)
    impact, ours = doc["impact"], outcome.answered_in_span
    assert ours is not None and (ours["start"], ours["end"]) == (
        impact["span"]["start"],
        impact["span"]["end"],
    )
    counted = (impact["requests"], impact["failed_5xx"], impact["shed_429"])
    assert counted == (ours["responses"], ours["answers_5xx"], ours["shed"])
    # the whole run's attempts hold these answers, and those outside the span or unanswered
    assert outcome.attempts >= ours["responses"] and outcome.attempts_5xx >= ours["answers_5xx"]
    assert outcome.attempts_429 + outcome.attempts_413 >= ours["shed"]
    if mode is Containment.ON:
        assert ours["shed"] == outcome.attempts_413 > 0 and outcome.attempts_429 == 0
    said = {
        "containment": "containment did it (",
        "pods": "the cascade stopped without containment (",
    }
    assert impact["recovered_by"] == by and impact["recovery"].startswith(said[by])


# -- the stand-in's writes reach the model ----------------------------------------------------


def test_a_deployment_patch_and_the_nginx_limit_change_the_model(tmp_path: Path) -> None:
    scenario = load_scenario("default")
    endpoint, kube = Endpoint(scenario, start=0.0, seed=SEED), KubeStandIn()
    gateway = NginxStandIn(tmp_path)
    cluster = SimCluster(endpoint, kube, gateway, scenario)
    endpoint.advance(60.0)
    cluster.sync()
    body = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": [
        "--model", scenario.model.name, "--max-num-seqs=13", "--max-model-len=32768",
    ]}]}}}}  # fmt: skip
    _send(kube, "PATCH", cluster.deployment_path, body)
    limit = RateLimit(zone="detector_llm_vllm_llama", rate_per_min=534, connections=39)
    gateway.http_include.write_text(render_http(limit), encoding="utf-8")
    gateway.location_include.write_text(render_location(limit), encoding="utf-8")
    cluster.apply()
    assert endpoint.deployment_args()["max-num-seqs"] == 13
    assert endpoint.gateway_limit == GatewayLimit(rps=8.9, burst=0, connections=39)
    assert [what.split(" ")[0] for _, what in cluster.writes] == ["PATCH", "nginx:"]
    gateway.location_include.write_text(render_location(None), encoding="utf-8")
    cluster.apply()
    assert endpoint.gateway_limit is None


def test_an_eviction_replaces_the_pod_in_the_model(tmp_path: Path) -> None:
    scenario = load_scenario("default")
    endpoint = Endpoint(scenario, start=0.0, seed=SEED)
    kube = KubeStandIn()
    cluster = SimCluster(endpoint, kube, NginxStandIn(tmp_path), scenario)
    endpoint.advance(60.0)
    cluster.sync()
    victim = endpoint.pods()[0].name
    path = f"/api/v1/namespaces/llm/pods/{victim}/eviction"
    status, _ = _send(kube, "POST", path, {"kind": "Eviction"})
    assert status == 201
    cluster.apply()
    cluster.sync()
    names = [p.name for p in endpoint.pods()]
    assert victim not in names and len(names) == 4
    assert kube.get(f"/api/v1/namespaces/llm/pods/{names[-1]}") is not None


def test_engine_args_read_both_forms() -> None:
    assert engine_args(["--max-num-seqs", "13", "--max-model-len=32768", "--enforce-eager"]) == {
        "max-num-seqs": 13,
        "max-model-len": 32768,
    }


# -- the CLI ------------------------------------------------------------------------------------


def test_simulate_records_streams_that_replay_reads(tmp_path: Path) -> None:
    record = tmp_path / "streams"
    done = _cli("simulate", "non-oom", "--containment", "off", "--json",
                "--seed", str(SEED), "--record", str(record))  # fmt: skip
    outcome = json.loads(done.stdout)
    assert outcome["pods_lost"] == 0 and outcome["verdict"] is not None
    files = sorted(p.name for p in record.iterdir())
    assert files == ["container-logs.jsonl", "gpu-metrics.jsonl", "k8s-events.jsonl",
                     "lb-access.jsonl"]  # fmt: skip
    replayed = _cli("replay", "--json", "--db", f"sqlite:///{tmp_path / 'r.db'}", str(record))
    verdicts = json.loads(replayed.stdout)["verdicts"]
    assert outcome["verdict"] in [v["reason"] for v in verdicts]


def test_an_unknown_scenario_is_one_line_and_exit_2() -> None:
    done = _cli("simulate", "no-such-scenario", check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "default" in done.stderr


def _send(kube: KubeStandIn, method: str, path: str, body: Any) -> tuple[int, Any]:
    """Hand one request to the stand-in as its HTTP handler does, hooks included."""
    request = Recorded(method, path, {}, "application/strategic-merge-patch+json", body)
    status, answer = kube.handle(request)
    for hook in kube.hooks:
        hook(request)
    return status, answer


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETECTOR_")}
    done = subprocess.run(
        [sys.executable, "-m", "detector", *args],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done
