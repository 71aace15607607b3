"""The registry built from env settings acts through the HTTP admin APIs, only when armed.

The fakes of test_http_actuators.py (Kong Admin API, Triton, Ray Serve, Envoy admin) serve on
loopback ports. ``detector replay`` of examples/cascade with Triton as the batch-ceiling target
and Kong as the rate-limit gateway must reload the model with the computed ceiling and create
the plugin at the computed rate; Ray Serve and Envoy are driven through the registry's
bindings with a planned step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ceiling_for_any_mechanism
from test_http_actuators import EnvoyFake, FakeServer, KongFake, RayFake, TritonFake

from detector.actuators.base import Status
from detector.config import ContainmentSettings, EnvoySettings, RayServeSettings, Settings
from detector.runbooks.bindings.registry import step_actuators
from detector.runbooks.definition import Action
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import PlannedStep, planned_step

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
KEY = "llm/vllm-llama"  # the workload of examples/cascade


@pytest.fixture
def servers() -> Iterator[dict[str, FakeServer]]:
    fakes: dict[str, Any] = {"kong": KongFake(), "triton": TritonFake()}
    fakes |= {"rayserve": RayFake(), "envoy": EnvoyFake({"local_rate_limit_enabled": "0"})}
    running = {name: FakeServer(fake) for name, fake in fakes.items()}
    yield running
    for server in running.values():
        server.close()


def _replay(tmp_path: Path, servers: dict[str, FakeServer], *, armed: bool) -> dict[str, Any]:
    env = {
        "DETECTOR_DRY_RUN": "false",
        "DETECTOR_CONTAINMENT__TRITON__URLS": json.dumps([servers["triton"].url]),
        "DETECTOR_CONTAINMENT__TRITON__MODELS": json.dumps({KEY: "llm"}),
        "DETECTOR_CONTAINMENT__TRITON__MAX_QUEUE_SIZE": "64",
        "DETECTOR_CONTAINMENT__KONG__ADMIN_URL": servers["kong"].url,
        "DETECTOR_CONTAINMENT__KONG__SCOPES": '["services/llm"]',
    }
    env["DETECTOR_RUNBOOK_PATH"] = ceiling_for_any_mechanism(tmp_path)  # the ceiling's binding
    if armed:
        env["DETECTOR_CONTAINMENT__ARMED_WORKLOADS"] = json.dumps([KEY])
    args = [sys.executable, "-m", "detector", "replay", "--json"]
    args += ["--db", f"sqlite:///{tmp_path / 'store.db'}", str(CASCADE)]
    base = {k: v for k, v in os.environ.items() if not k.startswith("DETECTOR_")}
    done = subprocess.run(args, env={**base, **env}, capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    (incident,) = json.loads(done.stdout)["incidents"]
    return dict(incident)


def test_an_armed_replay_reloads_triton_and_limits_at_kong(
    servers: dict[str, FakeServer], tmp_path: Path
) -> None:
    _replay(tmp_path, servers, armed=True)
    (load,) = servers["triton"].mutations()
    assert load.path == "/v2/repository/models/llm/load"
    config = json.loads(load.body["parameters"]["config"])
    assert config["max_batch_size"] == 13  # the step's computed new_ceiling
    assert config["dynamic_batching"]["preferred_batch_size"] == []  # 16 and 32 exceed it
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 64
    create = servers["kong"].mutations()[0]
    assert (create.method, create.path) == ("POST", "/services/llm/plugins")
    assert create.body == {
        "name": "rate-limiting",
        "enabled": True,
        "config": {"second": 1, "minute": 49, "policy": "local", "limit_by": "service"},
    }  # the aggregate budget 0.817/s = 49/min for the whole service, at most 1 in any second


def test_not_armed_sends_no_mutation(servers: dict[str, FakeServer], tmp_path: Path) -> None:
    _replay(tmp_path, servers, armed=False)
    assert servers["triton"].mutations() == []
    assert servers["kong"].mutations() == []
    assert [c.method for c in servers["triton"].calls] and [c.method for c in servers["kong"].calls]


def _step(action: Action, params: dict[str, str]) -> PlannedStep:
    runbook = load_runbook(default_runbook_path())
    position = next(i for i, s in enumerate(runbook.steps, 1) if s.action is action)
    return planned_step(runbook, position, params, "planned")


def test_rayserve_and_envoy_bindings_act_from_the_step(servers: dict[str, FakeServer]) -> None:
    settings = Settings(
        containment=ContainmentSettings(
            rayserve=RayServeSettings(
                url=servers["rayserve"].url, deployments={KEY: "llm/LLMServer"}
            ),
            envoy=EnvoySettings(admin_urls=[servers["envoy"].url]),
        )
    )
    registry = step_actuators(settings)
    ceiling = _step(
        Action.LOWER_BATCH_CEILING,
        {"namespace": "llm", "workload": "vllm-llama", "engine": "vllm", "new_ceiling": "13"},
    )
    binding = registry[Action.LOWER_BATCH_CEILING.value]
    result = binding.apply(binding.plan_step(ceiling), dry_run=False)
    assert result.status is Status.OK, result
    (put,) = servers["rayserve"].mutations()
    llm = next(a for a in put.body["applications"] if a["name"] == "llm")
    assert llm["deployments"] == [
        {"name": "LLMServer", "num_replicas": 4, "max_ongoing_requests": 13}
    ]

    rate = _step(
        Action.ENABLE_RATE_LIMIT, {"namespace": "llm", "ingress": "vllm-llama", "limit_rps": "3"}
    )
    limiter = registry[Action.ENABLE_RATE_LIMIT.value]
    plan = limiter.plan_step(rate)
    assert limiter.apply(plan, dry_run=False).status is Status.OK
    assert limiter.revert(plan, dry_run=False).status is Status.OK
    modifies = [c.query for c in servers["envoy"].mutations()]
    enabled = {"local_rate_limit_enabled": ["100"], "local_rate_limit_enforced": ["100"]}
    assert modifies == [
        enabled,
        {"local_rate_limit_enabled": [""], "local_rate_limit_enforced": [""]},
    ]
