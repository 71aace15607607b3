"""The registry's settings and the pure step -> change mappings of every actuator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from detector.actuators.base import ActuatorError, Change, Plan
from detector.actuators.envoy import EnvoyRateLimit
from detector.actuators.kubernetes.gateways import IngressRateLimit
from detector.actuators.triton import QueuePolicy, TritonBatching
from detector.config import (
    ContainmentSettings,
    KongSettings,
    KubernetesSettings,
    NginxGatewaySettings,
    RayServeSettings,
    Settings,
    TritonSettings,
)
from detector.errors import ConfigError
from detector.runbooks.bindings.envoy import envoy_limit_from_step
from detector.runbooks.bindings.kubernetes import (
    ceiling_key_of_plan,
    ceilings_from_step,
    ingress_limit_from_step,
    policy_requests_from_step,
)
from detector.runbooks.bindings.rayserve import ongoing_requests_from_step
from detector.runbooks.bindings.registry import kong_scope, step_actuators
from detector.runbooks.bindings.triton import batching_from_step
from detector.runbooks.definition import Action
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import PlannedStep, planned_step

RUNBOOK = load_runbook(default_runbook_path())
NGINX = NginxGatewaySettings(
    conf_path=Path("/etc/nginx/nginx.conf"),
    http_include=Path("/etc/nginx/detector/http.conf"),
    location_include=Path("/etc/nginx/detector/location.conf"),
)


def step(action: Action, **params: str) -> PlannedStep:
    position = next(i for i, s in enumerate(RUNBOOK.steps, 1) if s.action is action)
    return planned_step(RUNBOOK, position, dict(params), "planned")


def ceiling(engine: str, settings: str, **more: str) -> PlannedStep:
    return step(Action.LOWER_BATCH_CEILING, engine=engine, settings=settings, **more)


# -- step -> change ------------------------------------------------------------------------


def test_vllm_ceilings_come_from_the_rendered_settings() -> None:
    s = ceiling("vllm", "--max-num-seqs=13 --max-num-batched-tokens=4096 --max-model-len=32768")
    assert ceilings_from_step(s) == (
        "vllm",
        {"max_num_seqs": "13", "max_num_batched_tokens": "4096", "max_model_len": "32768"},
    )


def test_tgi_and_sglang_ceilings_by_env_and_flag() -> None:
    tgi = ceiling("tgi", "MAX_CONCURRENT_REQUESTS=8 MAX_BATCH_TOTAL_TOKENS=65536")
    assert ceilings_from_step(tgi) == (
        "tgi",
        {"max_concurrent_requests": "8", "max_batch_total_tokens": "65536"},
    )
    sglang = ceiling("sglang", "", ceiling_param="max_running_requests", new_ceiling="6")
    assert ceilings_from_step(sglang) == ("sglang", {"max_running_requests": "6"})


@pytest.mark.parametrize(
    ("engine", "settings", "match"),
    [
        ("unknown", "max_num_seqs=13 (engine unknown: set by hand)", "unknown engine"),
        ("vllm", "--max-num-seqs=13;rm", "not a vllm ceiling"),
        ("vllm", "--max-running-requests=13", "not a vllm ceiling"),
        ("vllm", "", "sets no ceiling"),
    ],
)
def test_ceilings_refuse_what_the_engine_does_not_read(
    engine: str, settings: str, match: str
) -> None:
    with pytest.raises(ActuatorError, match=match):
        ceilings_from_step(ceiling(engine, settings))


def test_rate_limit_steps_map_to_each_gateway() -> None:
    s = step(Action.ENABLE_RATE_LIMIT, namespace="llm", limit_rps="7", limit_connections="13")
    assert ingress_limit_from_step(s) == IngressRateLimit(rps=7, connections=13)
    assert policy_requests_from_step(s) == 7
    assert envoy_limit_from_step(s) == EnvoyRateLimit(100, 100)
    with pytest.raises(ActuatorError, match=r"limit_rps '0\.5'"):
        ingress_limit_from_step(step(Action.ENABLE_RATE_LIMIT, limit_rps="0.5"))
    with pytest.raises(ActuatorError, match="not a rate limit"):
        ingress_limit_from_step(ceiling("vllm", "--max-num-seqs=1"))


def test_engine_steps_map_to_triton_and_ray_serve() -> None:
    s = ceiling("vllm", "--max-num-seqs=13", new_ceiling="13")
    assert batching_from_step(s) == TritonBatching(13)
    assert batching_from_step(s, max_queue_size=64) == TritonBatching(
        13, default_queue_policy=QueuePolicy(max_queue_size=64)
    )
    assert ongoing_requests_from_step(s) == 13
    with pytest.raises(ActuatorError, match="new_ceiling"):
        ongoing_requests_from_step(ceiling("vllm", "", new_ceiling="unknown"))
    with pytest.raises(ActuatorError, match="not a ceiling"):
        batching_from_step(step(Action.ENABLE_RATE_LIMIT, limit_rps="1"))


def test_a_stored_ceilings_plan_names_its_deployment_container_and_engine() -> None:
    fields = 'containers[tgi].env[MAX_CONCURRENT_REQUESTS]: "8"\n'
    plan = Plan(
        "lower_batch_ceiling",
        "kubernetes:deployments.apps/llm/tgi-mistral",
        (Change("deployments.apps/llm/tgi-mistral", None, fields),),
    )
    assert ceiling_key_of_plan(plan) == ("llm", "tgi-mistral", "tgi", "tgi")
    with pytest.raises(ActuatorError, match=r"is not a deployments\.apps target"):
        ceiling_key_of_plan(Plan("x", "kubernetes:pods/llm", ()))


def test_kong_scopes() -> None:
    assert kong_scope("routes/chat").path == "/routes/chat"
    with pytest.raises(ActuatorError, match="services/NAME"):
        kong_scope("consumers/x")


# -- settings ------------------------------------------------------------------------------


def test_nested_env_settings_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "DETECTOR_CONTAINMENT__KUBERNETES__KUBECONFIG": "/etc/detector/kubeconfig",
        "DETECTOR_CONTAINMENT__KUBERNETES__CONTEXT": "prod",
        "DETECTOR_CONTAINMENT__KUBERNETES__RESTART_METHOD": "delete",
        "DETECTOR_CONTAINMENT__KUBERNETES__INGRESSES": '{"llm/vllm": ["a", "b"]}',
        "DETECTOR_CONTAINMENT__KONG__ADMIN_URL": "http://kong:8001",
        "DETECTOR_CONTAINMENT__KONG__ADMIN_TOKEN": "s3cret-token",
        "DETECTOR_CONTAINMENT__KONG__SCOPES": '["services/llm"]',
        "DETECTOR_CONTAINMENT__KONG__NODES": "3",
        "DETECTOR_CONTAINMENT__TRITON__URLS": '["http://triton-0:8000", "http://triton-1:8000"]',
        "DETECTOR_CONTAINMENT__TRITON__MODEL": "llm",
        "DETECTOR_CONTAINMENT__RATE_LIMIT_GATEWAY": "kong",
        "DETECTOR_CONTAINMENT__BATCH_CEILING_TARGET": "triton",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    c = Settings().containment
    assert c.kubernetes is not None and c.kong is not None and c.triton is not None
    assert (c.kubernetes.kubeconfig, c.kubernetes.context) == (
        Path("/etc/detector/kubeconfig"),
        "prod",
    )
    assert c.kubernetes.restart_method == "delete"
    assert c.kubernetes.ingresses == {"llm/vllm": ["a", "b"]}
    assert (c.kong.nodes, c.kong.scopes) == (3, ["services/llm"])
    assert "s3cret" not in repr(c)
    assert c.triton.urls == ["http://triton-0:8000", "http://triton-1:8000"]
    assert (c.rate_limit_driver(), c.batch_ceiling_driver()) == ("kong", "triton")


def _kong() -> KongSettings:
    return KongSettings(admin_url="http://kong:8001", scopes=["services/llm"])


def _kube() -> KubernetesSettings:
    return KubernetesSettings(kubeconfig=Path("/nonexistent/kubeconfig"))


@pytest.mark.parametrize(
    ("given", "gateway", "target"),
    [
        ({}, None, None),
        ({"nginx": NGINX}, "nginx", None),
        ({"kubernetes": _kube()}, "ingress-nginx", "kubernetes"),
        ({"kubernetes": _kube(), "kong": _kong()}, "kong", "kubernetes"),
        (
            {"kubernetes": _kube(), "rate_limit_gateway": "envoy-gateway"},
            "envoy-gateway",
            "kubernetes",
        ),
        ({"nginx": NGINX, "kong": _kong(), "rate_limit_gateway": "nginx"}, "nginx", None),
        ({"triton": TritonSettings(urls=["http://t:8000"], model="m")}, None, "triton"),
    ],
)
def test_the_driven_targets(given: dict[str, Any], gateway: str | None, target: str | None) -> None:
    c = ContainmentSettings(**given)
    assert (c.rate_limit_driver(), c.batch_ceiling_driver()) == (gateway, target)


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"rate_limit_gateway": "kong"}, "'kong' is not configured"),
        ({"rate_limit_gateway": "ingress-nginx"}, r"set containment.kubernetes"),
        ({"nginx": NGINX, "kong": _kong()}, "name the one enable_rate_limit drives"),
        ({"batch_ceiling_target": "rayserve"}, "'rayserve' is not configured"),
        (
            {
                "triton": TritonSettings(urls=["http://t:8000"], model="m"),
                "rayserve": RayServeSettings(url="http://ray:8265", app="a", deployment="d"),
            },
            "name the one lower_batch_ceiling drives",
        ),
    ],
)
def test_impossible_combinations_fail_at_load(given: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        ContainmentSettings(**given)


@pytest.mark.parametrize(
    ("model", "kwargs", "match"),
    [
        (KubernetesSettings, {"containers": {"vllm": "c"}}, "namespace/workload"),
        (KubernetesSettings, {"context": "prod"}, "needs a kubeconfig"),
        (KongSettings, {"admin_url": "http://k:8001"}, "one at least"),
        (KongSettings, {"admin_url": "http://k:8001", "scopes": ["llm"]}, "services/NAME"),
        (TritonSettings, {"urls": ["http://t:8000"]}, "model or models"),
        (TritonSettings, {"urls": [], "model": "m"}, "at least 1"),
        (RayServeSettings, {"url": "http://r:8265", "app": "a"}, "together"),
        (RayServeSettings, {"url": "http://r", "deployments": {"a/b": "x"}}, "APP/DEPLOYMENT"),
    ],
)
def test_target_settings_are_checked(model: type, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        model(**kwargs)


def test_registry_by_configuration() -> None:
    assert step_actuators(Settings()) == {}
    both = ContainmentSettings(nginx=NGINX, kong=_kong(), rate_limit_gateway="kong")
    registry = step_actuators(Settings(containment=both))
    assert set(registry) == {"enable_rate_limit"}
    assert type(registry["enable_rate_limit"]).__name__ == "KeyedBinding"
    bad = ContainmentSettings(kong=KongSettings(admin_url="ftp://kong", scopes=["services/llm"]))
    with pytest.raises(ConfigError, match="not an http"):
        step_actuators(Settings(containment=bad))
    with pytest.raises(ConfigError, match="cannot load /nonexistent/kubeconfig"):
        step_actuators(Settings(containment=ContainmentSettings(kubernetes=_kube())))
