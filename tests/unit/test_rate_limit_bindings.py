"""Each gateway gets the planned 429 step as it can enforce it: the aggregate, or per client.

Aggregate limiters (plain nginx on one key, Kong by service, Envoy and Envoy Gateway divided
by their replicas) get the aggregate budget; ingress-nginx gets the per-client values and its
plan says what they bound. Pure: planned steps in, actuator requests out (Kubernetes through a
stub API that serves a few objects).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from detector.actuators.envoy import EnvoyRateLimit
from detector.actuators.kong import KongLimit
from detector.actuators.kubernetes.api import KubeApi, ObjectRef
from detector.actuators.kubernetes.gateways import (
    EnvoyGatewayRateLimit,
    IngressNginxAdmission,
    IngressNginxRateLimit,
    IngressRateLimit,
)
from detector.actuators.nginx.config import RateLimit
from detector.config import KubernetesSettings
from detector.runbooks.bindings.envoy import envoy_limit_from_step
from detector.runbooks.bindings.kong import limit_from_step
from detector.runbooks.bindings.kubernetes import (
    gateway_policies,
    ingress_admission,
    ingress_bound_note,
    ingress_limit_from_step,
    ingress_limits,
    policy_limit_from_step,
    policy_requests_from_step,
)
from detector.runbooks.bindings.nginx import rate_limit_from_step
from detector.runbooks.definition import Action
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import PlannedStep, planned_step
from detector.runbooks.rate_limits import AggregateLimit, aggregate_limit

# The bundled cascade's step: 0.8/s for all clients, 80 clients at 1 r/s each.
CASCADE = {
    "namespace": "llm",
    "ingress": "vllm-llama",
    "aggregate_budget_rps": "0.8",
    "aggregate_limit_rpm": "48",
    "aggregate_connections": "13",
    "limit_rps": "1",
    "limit_connections": "1",
    "per_client_rps": "1",
    "per_client_connections": "1",
    "clients_seen": "80",
    "aggregate_bound_rps": "80",
    "aggregate_bound_connections": "80",
}


def step(params: dict[str, str], action: Action = Action.ENABLE_RATE_LIMIT) -> PlannedStep:
    runbook = load_runbook(default_runbook_path())
    position = next(i for i, s in enumerate(runbook.steps, 1) if s.action is action)
    return planned_step(runbook, position, params, "planned")


def lifted(params: dict[str, str], factor: int) -> dict[str, str]:
    """The params after a lift: the per-client values in force times ``factor``."""
    rps, conns = int(params["limit_rps"]) * factor, int(params["limit_connections"]) * factor
    return {**params, "limit_rps": str(rps), "limit_connections": str(conns)}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (CASCADE, AggregateLimit(48, 13)),
        (lifted(CASCADE, 2), AggregateLimit(96, 26)),  # relaxed like the per-client values
        (lifted(CASCADE, 8), AggregateLimit(384, 104)),
        ({"limit_rps": "7", "limit_connections": "13"}, AggregateLimit(420, 13)),  # older step
        ({"limit_rps": "0.5"}, None),
        ({}, None),
    ],
)
def test_aggregate_limit(params: dict[str, str], expected: AggregateLimit | None) -> None:
    assert aggregate_limit(params) == expected


def test_plain_nginx_enforces_the_budget_on_one_key() -> None:
    limit = rate_limit_from_step(step(CASCADE))
    assert limit == RateLimit(zone="detector_llm_vllm_llama", rate_per_min=48, connections=13)
    assert limit.key == "global" and limit.requests_per_s == 0.8


@pytest.mark.parametrize(
    ("params", "nodes", "policy", "expected"),
    [
        (CASCADE, 1, "local", KongLimit(second=1, minute=48)),
        ({**CASCADE, "aggregate_limit_rpm": "150"}, 1, "local", KongLimit(second=3, minute=150)),
        ({**CASCADE, "aggregate_limit_rpm": "150"}, 2, "local", KongLimit(second=1, minute=75)),
        (
            {**CASCADE, "aggregate_limit_rpm": "150"},
            2,
            "redis",  # one count for all nodes: not divided
            KongLimit(second=3, minute=150, policy="redis"),
        ),
        (lifted(CASCADE, 2), 1, "local", KongLimit(second=2, minute=96)),
    ],
)
def test_kong_limits_the_service_to_the_budget(
    params: dict[str, str], nodes: int, policy: str, expected: KongLimit
) -> None:
    limit = limit_from_step(step(params), nodes=nodes, policy=policy)
    assert limit == expected and limit.limit_by == "service"


def test_envoy_says_what_each_replica_bucket_may_let_through() -> None:
    limit = envoy_limit_from_step(step(CASCADE))
    assert limit == EnvoyRateLimit(aggregate_per_min=48)
    described = replace(limit, replicas=2).describe()
    assert "the aggregate limit 48/min needs each of 2 Envoy replica(s)" in described
    assert "at most 24/min" in described
    old = envoy_limit_from_step(step({"limit_rps": "3"}))
    assert old == EnvoyRateLimit() and "aggregate" not in old.describe()


@pytest.mark.parametrize(
    ("rpm", "replicas", "expected"),
    [
        ("48", 1, (48, "Minute")),  # under 1/s: per minute
        ("48", 2, (24, "Minute")),
        ("600", 2, (5, "Second")),  # 10/s over 2 replicas
        ("150", 1, (2, "Second")),  # 2.5/s: whole seconds, never above the budget
        ("1", 4, (1, "Minute")),
    ],
)
def test_envoy_gateway_divides_the_budget_among_replicas(
    rpm: str, replicas: int, expected: tuple[int, str]
) -> None:
    s = step({**CASCADE, "aggregate_limit_rpm": rpm})
    assert policy_limit_from_step(s, replicas=replicas) == expected


def test_envoy_gateway_requests_per_second_keep_their_meaning() -> None:
    assert policy_requests_from_step(step({"limit_rps": "7", "limit_connections": "13"})) == 7
    assert policy_requests_from_step(step(CASCADE)) == 1  # 48/min: at least 1


def test_ingress_nginx_gets_the_per_client_values_and_says_what_they_bound() -> None:
    s = step(CASCADE)
    assert ingress_limit_from_step(s) == IngressRateLimit(rps=1, connections=1)
    assert ingress_bound_note(s) == (
        "per client: at most 80/s against an aggregate budget of 0.8/s (80 clients seen); "
        "only an aggregate limiter bounds the total"
    )
    assert ingress_bound_note(step({"limit_rps": "2"})) == ""


class StubKube(KubeApi):
    """Serves ``objects`` by (resource label, namespace, name); everything else is absent."""

    def __init__(self, objects: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.timeout_s = 1.0

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        return self.objects.get((ref.kind.label, ref.namespace, ref.name))


def test_plans_carry_the_aggregate_in_their_summary() -> None:
    ingress = {"metadata": {"name": "vllm-llama", "namespace": "llm", "resourceVersion": "7"}}
    configmap = {"data": {"limit-req-status-code": "429", "limit-conn-status-code": "429"}}
    kube = StubKube(
        {
            ("ingresses.networking.k8s.io", "llm", "vllm-llama"): ingress,
            ("configmaps", "ingress-nginx", "ingress-nginx-controller"): configmap,
        }
    )
    cfg = KubernetesSettings(envoy_gateway_replicas=2)
    plan = ingress_limits(kube, cfg).plan_step(step(CASCADE))
    assert plan.summary == (
        "limit-rps=1, limit-connections=1 (per client IP, per controller replica); per client: "
        "at most 80/s against an aggregate budget of 0.8/s (80 clients seen); only an "
        "aggregate limiter bounds the total"
    )
    policy = gateway_policies(kube, cfg).plan_step(step(CASCADE))
    assert "local rate limit 24 per Minute on HTTPRoute vllm-llama" in policy.summary
    assert "x 2 Envoy replicas = 48 per Minute in all" in policy.summary
    assert isinstance(
        ingress_limits(kube, cfg).actuator(("llm", ("vllm-llama",))), IngressNginxRateLimit
    )
    assert isinstance(
        gateway_policies(kube, cfg).actuator(("llm", "vllm-llama")), EnvoyGatewayRateLimit
    )


def test_ingress_nginx_quarantines_on_the_rate_limits_ingresses() -> None:
    ingress = {"metadata": {"name": "vllm-llama", "namespace": "llm", "resourceVersion": "7"}}
    kube = StubKube({("ingresses.networking.k8s.io", "llm", "vllm-llama"): ingress})
    cfg = KubernetesSettings(ingresses={"llm/vllm-llama": ["public", "internal"]})
    binding = ingress_admission(kube, cfg)
    quarantine = step(
        {"namespace": "llm", "ingress": "vllm-llama", "max_body_bytes": "49152"},
        Action.QUARANTINE_REQUESTS,
    )
    assert binding.key_of_step(quarantine) == ("llm", ("public", "internal"))
    alone = ingress_admission(kube, KubernetesSettings()).plan_step(quarantine)
    assert alone.target == "kubernetes:ingresses.networking.k8s.io/llm/vllm-llama"
    assert [c.after for c in alone.changes] == [
        'metadata.annotations[nginx.ingress.kubernetes.io/proxy-body-size]: "48k"\n'
    ]
    assert isinstance(binding.actuator(("llm", ("public",))), IngressNginxAdmission)
