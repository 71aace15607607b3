"""The pure parts of the HTTP actuators: views of API objects and the request bodies built."""

from __future__ import annotations

import json
from typing import Any

import pytest

from detector.actuators.base import ActuatorError
from detector.actuators.envoy import (
    EnvoyRateLimit,
    EnvoyRuntimeKeys,
    admin_values,
    modify_params,
)
from detector.actuators.kong import (
    KongLimit,
    KongScope,
    create_body,
    find_plugin,
    patch_body,
    plugin_view,
)
from detector.actuators.rayserve import (
    app_config,
    deployment_view,
    put_body,
    with_deployment,
)
from detector.actuators.triton import (
    QueuePolicy,
    TritonBatching,
    config_view,
    desired_view,
    load_body,
    merged_config,
)
from detector.runbooks.bindings.kong import limit_from_step
from detector.runbooks.definition import Action, Check, OnFailure, Verify
from detector.runbooks.planner import PlannedStep


def reason(call: Any) -> str:
    with pytest.raises(ActuatorError) as raised:
        call()
    return raised.value.reason


# Kong ---------------------------------------------------------------------------------------


def test_kong_limit_view_and_bodies() -> None:
    view = KongLimit(second=40).view()
    assert view == {
        "enabled": True,
        "config": {"second": 40, "minute": None, "policy": "local", "limit_by": "service"},
    }
    assert create_body(view) == {
        "name": "rate-limiting",
        "enabled": True,
        "config": {"second": 40, "policy": "local", "limit_by": "service"},  # nulls left out
    }
    assert patch_body(view) == {"enabled": True, "config": view["config"]}  # nulls clear
    assert KongLimit(second=5, minute=200).describe() == (
        "rate-limiting 5/s 200/min by service (policy local)"
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"second": None},
        {"second": 0},
        {"second": True},
        {"second": 10, "minute": 5},  # Kong: minute may not be lower than second
        {"second": 1, "policy": "memory"},
        {"second": 1, "limit_by": "everyone"},
    ],
)
def test_kong_limit_rejects(kwargs: dict[str, Any]) -> None:
    assert reason(lambda: KongLimit(**kwargs)) == "invalid_request"


def test_kong_scope_paths() -> None:
    scope = KongScope("routes", "chat/v1")
    assert (scope.path, scope.label) == ("/routes/chat%2Fv1", "routes/chat/v1")
    assert scope.target == "routes/chat/v1/plugins/rate-limiting"
    assert reason(lambda: KongScope("consumers", "x")) == "invalid_request"  # type: ignore[arg-type]


def test_kong_find_plugin_skips_other_plugins_and_consumer_scoped_ones() -> None:
    mine = {"id": "p3", "name": "rate-limiting", "consumer": None, "config": {}}
    plugins = [
        {"id": "p1", "name": "key-auth", "consumer": None},
        {"id": "p2", "name": "rate-limiting", "consumer": {"id": "c1"}},
        {"id": "p4", "name": "rate-limiting", "consumer": None, "consumer_group": {"id": "g"}},
        mine,
    ]
    assert find_plugin(plugins) is mine
    assert find_plugin([]) is None


def test_kong_plugin_view_keeps_only_managed_fields() -> None:
    plugin = {
        "enabled": False,
        "config": {"minute": 600, "hour": 10000, "policy": "cluster", "limit_by": "consumer"},
    }
    assert plugin_view(plugin) == {
        "enabled": False,
        "config": {"second": None, "minute": 600, "policy": "cluster", "limit_by": "consumer"},
    }
    assert plugin_view(None) is None


def step(params: dict[str, str], action: Action = Action.ENABLE_RATE_LIMIT) -> PlannedStep:
    return PlannedStep(
        position=2,
        step_id=action.value,
        action=action,
        title="t",
        params=params,
        approval="auto",
        status="planned",
        verify=Verify(deadline_s=60, checks=(Check.ERRORS_FALL,)),
        on_failure=OnFailure.ESCALATE,
        cooldown_s=0,
        basis="",
    )


def test_kong_limit_from_step_divides_a_local_limit_among_nodes() -> None:
    assert limit_from_step(step({"limit_rps": "90"})).second == 90
    assert limit_from_step(step({"limit_rps": "90"}), nodes=4).second == 22
    assert limit_from_step(step({"limit_rps": "2"}), nodes=4).second == 1  # never under 1
    assert limit_from_step(step({"limit_rps": "90"}), nodes=4, policy="redis").second == 90
    assert reason(lambda: limit_from_step(step({}))) == "invalid_request"
    lower = step({"limit_rps": "9"}, Action.LOWER_BATCH_CEILING)
    assert reason(lambda: limit_from_step(lower)) == "invalid_request"


# Envoy --------------------------------------------------------------------------------------

RUNTIME = {
    "layers": ["static_layer", "admin"],
    "entries": {
        "local_rate_limit_enabled": {"final_value": "0", "layer_values": ["0", ""]},
        "local_rate_limit_enforced": {"final_value": "50", "layer_values": ["", "50"]},
    },
}
KEYS = ("local_rate_limit_enabled", "local_rate_limit_enforced", "absent_key")


def test_envoy_admin_values_read_the_admin_layer_only() -> None:
    assert admin_values(RUNTIME, KEYS, "admin") == {
        "local_rate_limit_enabled": None,  # set on disk, not overridden
        "local_rate_limit_enforced": "50",
        "absent_key": None,
    }
    assert reason(lambda: admin_values(RUNTIME, KEYS, "rtds")) == "no_admin_layer"
    assert reason(lambda: admin_values({"layers": []}, KEYS, "admin")) == "bad_response"


def test_envoy_modify_params_send_changes_only_and_empty_removes() -> None:
    current = {"a": None, "b": "50", "c": "100"}
    desired = {"a": "100", "b": None, "c": "100"}
    assert modify_params(current, desired) == {"a": "100", "b": ""}
    assert modify_params(desired, desired) == {}


def test_envoy_values_checked() -> None:
    assert EnvoyRateLimit(100, 0).describe().startswith("local rate limit enabled 100%")
    assert reason(lambda: EnvoyRateLimit(101)) == "invalid_request"
    assert reason(lambda: EnvoyRateLimit(enforced_percent=-1)) == "invalid_request"
    assert reason(lambda: EnvoyRuntimeKeys("a b", "c")) == "invalid_request"
    assert reason(lambda: EnvoyRuntimeKeys("same", "same")) == "invalid_request"


# Triton -------------------------------------------------------------------------------------

CONFIG: dict[str, Any] = {
    "name": "llm",
    "max_batch_size": 32,
    "dynamic_batching": {
        "preferred_batch_size": [4, 16, 32],
        "max_queue_delay_microseconds": "5000",  # protobuf JSON writes uint64 as a string
        "preserve_ordering": False,
    },
    "instance_group": [{"kind": "KIND_GPU", "count": 1}],
}


def test_triton_config_view_normalizes_64_bit_numbers() -> None:
    assert config_view(CONFIG) == {
        "max_batch_size": 32,
        "dynamic_batching": {
            "max_queue_delay_microseconds": 5000,
            "preferred_batch_size": [4, 16, 32],
        },
    }
    assert config_view({"max_batch_size": 8}) == {"max_batch_size": 8, "dynamic_batching": None}


def test_triton_desired_view_drops_preferred_sizes_over_the_new_max() -> None:
    batching = TritonBatching(max_batch_size=8, default_queue_policy=QueuePolicy(64))
    assert desired_view(config_view(CONFIG), batching) == {
        "max_batch_size": 8,
        "dynamic_batching": {
            "max_queue_delay_microseconds": 5000,
            "preferred_batch_size": [4],
            "default_queue_policy": {
                "max_queue_size": 64,
                "timeout_action": "REJECT",
                "default_timeout_microseconds": 0,
                "allow_timeout_override": False,
            },
        },
    }
    explicit = TritonBatching(8, max_queue_delay_microseconds=100, preferred_batch_size=(2, 8))
    assert desired_view(config_view(CONFIG), explicit)["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100,
        "preferred_batch_size": [2, 8],
    }


def test_triton_refuses_a_model_without_batching_and_bad_ceilings() -> None:
    no_batch = {"max_batch_size": 0, "dynamic_batching": None}
    assert reason(lambda: desired_view(no_batch, TritonBatching(4))) == "invalid_request"
    assert reason(lambda: TritonBatching(0)) == "invalid_request"
    assert reason(lambda: TritonBatching(4, preferred_batch_size=(8,))) == "invalid_request"
    assert reason(lambda: QueuePolicy(10, timeout_action="DROP")) == "invalid_request"


def test_triton_merged_config_keeps_other_fields_and_removes_what_was_absent() -> None:
    view = {"max_batch_size": 8, "dynamic_batching": {"preferred_batch_size": [4]}}
    merged = merged_config(CONFIG, view)
    assert merged["instance_group"] == CONFIG["instance_group"]
    assert merged["dynamic_batching"] == {"preferred_batch_size": [4], "preserve_ordering": False}
    assert "dynamic_batching" not in merged_config(
        CONFIG, {"max_batch_size": 8, "dynamic_batching": None}
    )
    body = load_body(merged)
    assert list(body) == ["parameters"] and json.loads(body["parameters"]["config"]) == merged


# Ray Serve ----------------------------------------------------------------------------------


def details(*apps: tuple[str, dict[str, Any] | None]) -> dict[str, Any]:
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": 8000},
        "grpc_options": {"port": 9000, "grpc_servicer_functions": []},
        "target_capacity": None,
        "applications": {name: {"deployed_app_config": cfg} for name, cfg in apps},
    }


LLM = {"name": "llm", "import_path": "llm:app", "deployments": [{"name": "A", "num_replicas": 2}]}


def test_rayserve_with_deployment_sets_adds_and_removes() -> None:
    assert with_deployment(LLM, "A", 3)["deployments"] == [
        {"name": "A", "num_replicas": 2, "max_ongoing_requests": 3}
    ]
    added = with_deployment(LLM, "B", 3)
    assert added["deployments"][1] == {"name": "B", "max_ongoing_requests": 3}
    assert with_deployment(added, "B", None) == LLM  # the added entry goes again
    assert LLM["deployments"] == [{"name": "A", "num_replicas": 2}]  # input untouched


def test_rayserve_views_and_put_body() -> None:
    state = details(("llm", LLM), ("embed", {"name": "embed", "import_path": "e:app"}))
    assert deployment_view(state, "llm", "A") == {"max_ongoing_requests": None}
    new = with_deployment(LLM, "A", 3)
    assert put_body(state, "llm", new) == {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": 8000},
        "grpc_options": {"port": 9000, "grpc_servicer_functions": []},
        "applications": [new, {"name": "embed", "import_path": "e:app"}],
    }


def test_rayserve_refuses_missing_and_imperative_applications() -> None:
    state = details(("llm", LLM), ("other", None))
    assert reason(lambda: app_config(state, "nope")) == "not_found"
    assert reason(lambda: app_config(state, "other")) == "not_declarative"
    assert reason(lambda: put_body(state, "llm", LLM)) == "not_declarative"
