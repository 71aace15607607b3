"""The Kubernetes actuators at the request level, against the fake API server of kube_fake.py.

Deployment ceilings and restarts, pod evictions, ingress-nginx and Envoy Gateway limits: each
test checks the exact requests the real ``kubernetes`` client sent (method, path, dry run,
body, content type). The other controllers are in test_kubernetes_controllers.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from kube_fake import MANAGER, MERGE, SMP, FakeKube, Recorded, api, kube

from detector.actuators.base import ActuatorError, Status
from detector.actuators.kubernetes.api import KubeApi
from detector.actuators.kubernetes.gateways import (
    EnvoyGatewayRateLimit,
    IngressNginxAdmission,
    IngressNginxRateLimit,
    IngressRateLimit,
)
from detector.actuators.kubernetes.workloads import (
    DeploymentCeilings,
    DeploymentRestart,
    DeploymentTarget,
    PodEvictor,
)
from detector.actuators.nginx.config import AdmissionRule

__all__ = ["api", "kube"]  # fixtures, used by name
NS = "inference"
PROXY_BODY = "nginx.ingress.kubernetes.io/proxy-body-size"
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/llama"
POD = f"/api/v1/namespaces/{NS}/pods/llama-7d9f-abcde"
INGRESS_PUBLIC = f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses/llama-public"
INGRESS_INTERNAL = f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses/llama-internal"
CONFIGMAP = "/api/v1/namespaces/ingress-nginx/configmaps/ingress-nginx-controller"
POLICIES = f"/apis/gateway.envoyproxy.io/v1alpha1/namespaces/{NS}/backendtrafficpolicies"
POLICY = f"{POLICIES}/llama-detector-rate-limit"


# -- objects -------------------------------------------------------------------------------


def vllm_deployment() -> dict[str, Any]:
    """Return a vLLM Deployment with a log sidecar and the default 25% strategy."""
    args = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "256"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama", "namespace": NS, "generation": 7},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "llama"}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
            },
            "template": {
                "metadata": {"labels": {"app": "llama"}, "annotations": {"team": "ml"}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.6.3",
                            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                            "args": [*args, "--gpu-memory-utilization=0.9"],
                        },
                        {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"},
                    ]
                },
            },
        },
    }


def tgi_deployment() -> dict[str, Any]:
    """Return a TGI Deployment configured by env, already rolling one pod down at a time."""
    env = [
        {"name": "MODEL_ID", "value": "mistralai/Mistral-7B-Instruct-v0.3"},
        {"name": "MAX_CONCURRENT_REQUESTS", "value": "128"},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama", "namespace": NS},
        "spec": {
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "spec": {
                    "containers": [
                        {"name": "tgi", "image": "ghcr.io/huggingface/tgi:2.4", "env": env}
                    ]
                }
            },
        },
    }


def pod(uid: str = "3f1c-uid-1") -> dict[str, Any]:
    """Return a crash-looping pod of the llama Deployment."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llama-7d9f-abcde", "namespace": NS, "uid": uid},
        "spec": {"nodeName": "gpu-node-3"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "vllm", "restartCount": 5}],
        },
    }


def ingress(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Return an Ingress served by ingress-nginx."""
    meta = {"name": name, "namespace": NS, "annotations": annotations or {}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta}


def controller_configmap(data: dict[str, str]) -> dict[str, Any]:
    """Return the ingress-nginx controller ConfigMap."""
    meta = {"name": "ingress-nginx-controller", "namespace": "ingress-nginx"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _sent(kube: FakeKube, method: str, dry_run: bool = False) -> list[Recorded]:
    return [r for r in kube.requests if r.method == method and r.dry_run == dry_run]


# -- Deployment ceilings ------------------------------------------------------------------


def test_vllm_ceilings_apply_and_revert_send_exact_patches(kube: FakeKube, api: KubeApi) -> None:
    original = kube.get(kube.put(vllm_deployment()))
    assert original is not None
    rv0 = original["metadata"]["resourceVersion"]
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64, "max_model_len": 8192})

    assert '-containers[vllm].args[--max-num-seqs]: "256"' in plan.diff
    assert '+containers[vllm].args[--max-num-seqs]: "64"' in plan.diff
    assert '+containers[vllm].args[--max-model-len]: "8192"' in plan.diff
    assert '+spec.strategy: {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}' in plan.diff
    assert "was RollingUpdate maxSurge=25% maxUnavailable=25%" in plan.summary
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.OK, result.message()
    assert kube.calls() == [
        ("GET", DEPLOY, False),
        ("PATCH", DEPLOY, True),
        ("PATCH", DEPLOY, False),
    ]
    dry, real = kube.writes()
    expected = {
        "metadata": {"resourceVersion": rv0},
        "spec": {
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "args": [
                                "--model",
                                "meta-llama/Llama-3.1-8B-Instruct",
                                "--max-num-seqs",
                                "64",
                                "--gpu-memory-utilization=0.9",
                                "--max-model-len=8192",
                            ],
                        }
                    ]
                }
            },
        },
    }
    assert real.body == dry.body == expected
    assert real.content_type == SMP
    assert real.query == {"fieldManager": MANAGER}
    assert dry.query == {"dryRun": "All", "fieldManager": MANAGER}
    live = kube.get(DEPLOY)
    assert live is not None
    assert live["spec"]["template"]["spec"]["containers"][1] == {
        "name": "log-shipper",
        "image": "fluent/fluent-bit:3.0",
    }
    kube.requests.clear()

    reverted = actuator.revert(plan, dry_run=False)

    assert reverted.status is Status.OK, reverted.message()
    restore = _sent(kube, "PATCH")[0].body
    assert restore["spec"]["strategy"] == {
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}
    }
    final = kube.get(DEPLOY)
    assert final is not None
    assert final["spec"] == original["spec"]


def test_dry_run_records_the_exact_patch_and_only_reads(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 32})
    kube.requests.clear()

    dry = actuator.apply(plan)

    assert dry.status is Status.DRY_RUN
    assert dry.diff == plan.diff
    assert kube.calls() == [("GET", DEPLOY, False)]
    prefix = f"would send: PATCH {DEPLOY} ({SMP}) "
    recorded = json.loads(dry.summary.split(prefix, 1)[1])
    assert [r.body for r in actuator.requests(plan)] == [recorded]
    actuator.apply(plan, dry_run=False)
    assert _sent(kube, "PATCH")[0].body == recorded


def test_repeated_apply_changes_nothing(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 32})
    assert actuator.apply(plan, dry_run=False).status is Status.OK
    kube.requests.clear()

    again = actuator.apply(plan, dry_run=False)

    assert again.status is Status.UNCHANGED
    assert kube.calls() == [("GET", DEPLOY, False)]
    assert actuator.verify(plan).status is Status.OK


def test_tgi_env_ceilings_keep_the_strategy_and_revert_removes_new_env(
    kube: FakeKube, api: KubeApi
) -> None:
    original = kube.get(kube.put(tgi_deployment()))
    assert original is not None
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama"), "tgi")
    plan = actuator.plan({"max_concurrent_requests": 32, "max_batch_total_tokens": 65536})
    assert "one pod at a time, strategy unchanged" in plan.summary
    assert " spec.strategy:" in plan.diff  # shown as context, not changed

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    body = _sent(kube, "PATCH")[0].body
    assert "strategy" not in body["spec"]
    assert body["spec"]["template"]["spec"]["containers"] == [
        {
            "name": "tgi",
            "env": [
                {"name": "MAX_CONCURRENT_REQUESTS", "value": "32"},
                {"name": "MAX_BATCH_TOTAL_TOKENS", "value": "65536"},
            ],
        }
    ]
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    assert _sent(kube, "PATCH")[0].body["spec"]["template"]["spec"]["containers"] == [
        {
            "name": "tgi",
            "env": [
                {"name": "MAX_CONCURRENT_REQUESTS", "value": "128"},
                {"name": "MAX_BATCH_TOTAL_TOKENS", "$patch": "delete"},
            ],
        }
    ]
    final = kube.get(DEPLOY)
    assert final is not None
    assert final["spec"] == original["spec"]


def test_conflict_from_a_concurrent_change_fails_without_clobbering(
    kube: FakeKube, api: KubeApi
) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})

    def someone_edits(seen: Recorded) -> None:  # between the dry run and the real PATCH
        if seen.method == "PATCH" and seen.dry_run:
            live = kube.get(DEPLOY)
            assert live is not None
            live["spec"]["replicas"] = 6
            kube.put(live)

    kube.hooks.append(someone_edits)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.FAILED
    assert result.reason == "conflict"
    assert result.error is not None
    assert "patch deployments.apps inference/llama: 409 Conflict" in result.error
    assert "the object has been modified" in result.error
    assert result.restored is True
    assert kube.calls() == [
        ("GET", DEPLOY, False),
        ("PATCH", DEPLOY, True),
        ("PATCH", DEPLOY, False),
    ]
    live = kube.get(DEPLOY)
    assert live is not None
    assert live["spec"]["replicas"] == 6
    assert "256" in live["spec"]["template"]["spec"]["containers"][0]["args"]


def test_forbidden_stops_at_the_server_side_dry_run(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    message = (
        'deployments.apps "llama" is forbidden: User "system:serviceaccount:gpu-oom-detector:'
        'gpu-oom-detector" cannot patch resource "deployments" in API group "apps" in the '
        'namespace "inference"'
    )
    kube.fail("PATCH", DEPLOY, 403, reason="Forbidden", message=message)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "forbidden", True)
    assert result.error is not None
    assert result.error.startswith("patch deployments.apps inference/llama: 403 Forbidden")
    assert "cannot patch resource" in result.error
    assert kube.calls() == [("GET", DEPLOY, False), ("PATCH", DEPLOY, True)]


def test_timeout_that_did_not_land_is_read_back_and_reported(kube: FakeKube, api: KubeApi) -> None:
    before = kube.get(kube.put(vllm_deployment()))
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    kube.fail("PATCH", DEPLOY, dry_run=False, sleep_s=2.0)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "timeout", True)
    assert result.error is not None
    assert "patch deployments.apps inference/llama: no answer within 1 s" in result.error
    assert "a GET after it shows deployments.apps inference/llama unchanged" in result.error
    assert kube.calls() == [
        ("GET", DEPLOY, False),
        ("PATCH", DEPLOY, True),
        ("PATCH", DEPLOY, False),
        ("GET", DEPLOY, False),
    ]
    assert kube.get(DEPLOY) == before


def test_timeout_that_landed_counts_as_done(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    kube.fail("PATCH", DEPLOY, dry_run=False, sleep_s=1.5, handle=True)

    def land_early(seen: Recorded) -> None:  # the write is stored before the slow answer
        if seen.method == "PATCH" and seen.dry_run:
            live = kube.get(DEPLOY)
            assert live is not None
            live["spec"]["template"]["spec"]["containers"][0]["args"][3] = "64"
            live["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
            kube.put(live)

    kube.hooks.append(land_early)

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.OK, result.message()
    assert [r.method for r in kube.requests][-2:] == ["PATCH", "GET"]


def test_missing_deployment_is_not_found(kube: FakeKube, api: KubeApi) -> None:
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    with pytest.raises(ActuatorError) as raised:
        actuator.plan({"max_num_seqs": 64})
    assert raised.value.reason == "not_found"
    assert "deployments.apps inference/llama" in str(raised.value)

    kube.put(vllm_deployment())
    plan = actuator.plan({"max_num_seqs": 64})
    del kube.objects[DEPLOY]
    result = actuator.apply(plan, dry_run=False)
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "not_found", True)
    assert result.error == "get deployments.apps inference/llama: 404 Not Found"
    assert kube.writes() == []


def test_verify_reports_drift_after_someone_changes_a_ceiling(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    actuator.apply(plan, dry_run=False)
    live = kube.get(DEPLOY)
    assert live is not None
    live["spec"]["template"]["spec"]["containers"][0]["args"][3] = "512"
    kube.put(live)

    checked = actuator.verify(plan)

    assert (checked.status, checked.reason) == (Status.FAILED, "drift")
    assert '+containers[vllm].args[--max-num-seqs]: "64"' in checked.diff


def test_rolling_restart_annotation_and_its_revert(kube: FakeKube, api: KubeApi) -> None:
    original = kube.get(kube.put(vllm_deployment()))
    assert original is not None
    actuator = DeploymentRestart(api, DeploymentTarget(NS, "llama"), rollout="unavailable")
    plan = actuator.plan(datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC))

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert _sent(kube, "PATCH")[0].body == {
        "metadata": {"resourceVersion": original["metadata"]["resourceVersion"]},
        "spec": {
            "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "annotations": {"kubectl.kubernetes.io/restartedAt": "2025-03-04T05:06:07Z"}
                }
            },
        },
    }
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    body = _sent(kube, "PATCH")[0].body
    annotations = body["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"kubectl.kubernetes.io/restartedAt": None}
    final = kube.get(DEPLOY)
    assert final is not None
    assert final["spec"] == original["spec"]


# -- pods ----------------------------------------------------------------------------------


def test_eviction_goes_through_the_eviction_api(kube: FakeKube, api: KubeApi) -> None:
    kube.put(pod())
    actuator = PodEvictor(api, NS)
    plan = actuator.plan("llama-7d9f-abcde")
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.OK, result.message()
    assert kube.calls() == [
        ("GET", POD, False),
        ("POST", f"{POD}/eviction", True),
        ("POST", f"{POD}/eviction", False),
    ]
    assert _sent(kube, "POST")[0].body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "llama-7d9f-abcde", "namespace": NS},
        "deleteOptions": {"preconditions": {"uid": "3f1c-uid-1"}},
    }
    assert _sent(kube, "POST")[0].content_type in (None, "application/json")
    assert kube.get(POD) is None

    kube.put(pod(uid="new-uid-2"))  # a StatefulSet would re-create it under the same name
    kube.requests.clear()
    assert actuator.apply(plan, dry_run=False).status is Status.UNCHANGED
    assert kube.writes() == []
    refused = actuator.revert(plan, dry_run=False)
    assert (refused.status, refused.reason) == (Status.FAILED, "irreversible")


def test_eviction_blocked_by_a_pod_disruption_budget(kube: FakeKube, api: KubeApi) -> None:
    kube.put(pod())
    actuator = PodEvictor(api, NS)
    plan = actuator.plan("llama-7d9f-abcde")
    cause = "The disruption budget llama-pdb needs 3 healthy pods and has 3 currently"
    kube.fail(
        "POST",
        f"{POD}/eviction",
        429,
        reason="TooManyRequests",
        message="Cannot evict pod as it would violate the pod's disruption budget.",
        details={"causes": [{"reason": "DisruptionBudget", "message": cause}]},
    )

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "pdb_blocked", True)
    assert result.error is not None
    assert "evict pods inference/llama-7d9f-abcde: blocked by PodDisruptionBudget" in result.error
    assert "inference/llama-pdb (429" in result.error
    assert cause in result.error
    assert [r.dry_run for r in _sent(kube, "POST", True)] == [True]
    assert _sent(kube, "POST") == []
    assert kube.get(POD) is not None


def test_delete_mode_sends_uid_precondition_and_grace_period(kube: FakeKube, api: KubeApi) -> None:
    kube.put(pod())
    actuator = PodEvictor(api, NS, mode="delete", grace_period_s=30)
    plan = actuator.plan("llama-7d9f-abcde")
    assert "PodDisruptionBudgets NOT consulted" in plan.summary
    kube.requests.clear()

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [("GET", POD, False), ("DELETE", POD, True), ("DELETE", POD, False)]
    assert _sent(kube, "DELETE")[0].body == {
        "preconditions": {"uid": "3f1c-uid-1"},
        "gracePeriodSeconds": 30,
    }


# -- ingress-nginx -------------------------------------------------------------------------


def test_second_ingress_conflict_reverts_the_first(kube: FakeKube, api: KubeApi) -> None:
    public = kube.get(kube.put(ingress("llama-public", {"owner": "ml"})))
    kube.put(ingress("llama-internal"))
    kube.put(controller_configmap({"use-forwarded-headers": "true"}))
    actuator = IngressNginxRateLimit(api, NS, ["llama-public", "llama-internal"])
    plan = actuator.plan(IngressRateLimit(rps=5, burst_multiplier=2))
    assert "limit-rps=5, limit-burst-multiplier=2 (per client IP" in plan.summary
    assert "answers over-limit requests with 503, not 429" in plan.summary
    assert "ingress-nginx/ingress-nginx-controller" in plan.summary
    kube.fail("PATCH", INGRESS_INTERNAL, 409, reason="Conflict", message="changed", dry_run=False)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "conflict", True)
    assert result.error is not None
    assert "patch ingresses.networking.k8s.io inference/llama-internal: 409" in result.error
    assert "previous content restored" in result.error
    assert kube.calls() == [
        ("GET", INGRESS_PUBLIC, False),
        ("GET", INGRESS_INTERNAL, False),
        ("PATCH", INGRESS_PUBLIC, True),
        ("PATCH", INGRESS_INTERNAL, True),
        ("PATCH", INGRESS_PUBLIC, False),
        ("PATCH", INGRESS_INTERNAL, False),
        ("PATCH", INGRESS_PUBLIC, False),
    ]
    applied, _, restored = _sent(kube, "PATCH")
    limits = {
        "nginx.ingress.kubernetes.io/limit-rps": "5",
        "nginx.ingress.kubernetes.io/limit-burst-multiplier": "2",
    }
    assert applied.body["metadata"]["annotations"] == limits
    assert restored.body["metadata"]["annotations"] == {key: None for key in limits}
    assert (
        restored.body["metadata"]["resourceVersion"] != applied.body["metadata"]["resourceVersion"]
    )
    final = kube.get(INGRESS_PUBLIC)
    assert public is not None and final is not None
    assert final["metadata"]["annotations"] == public["metadata"]["annotations"]


def test_ingress_limits_apply_and_revert_exactly(kube: FakeKube, api: KubeApi) -> None:
    existing = {"nginx.ingress.kubernetes.io/limit-connections": "50", "owner": "ml"}
    original = kube.get(kube.put(ingress("llama-public", existing)))
    kube.put(controller_configmap({"limit-req-status-code": "429"}))
    actuator = IngressNginxRateLimit(api, NS, ["llama-public"])
    plan = actuator.plan(IngressRateLimit(rps=10))
    assert "503" not in plan.summary

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert actuator.revert(plan, dry_run=False).status is Status.OK

    patches = _sent(kube, "PATCH")
    assert [p.content_type for p in patches] == [SMP, SMP]
    assert patches[1].body["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/limit-rps": None
    }
    final = kube.get(INGRESS_PUBLIC)
    assert original is not None and final is not None
    assert final["metadata"]["annotations"] == original["metadata"]["annotations"]


def test_ingress_quarantine_sets_proxy_body_size_and_restores_each_ingress(
    kube: FakeKube, api: KubeApi
) -> None:
    limited = {"nginx.ingress.kubernetes.io/limit-rps": "5", "owner": "ml"}
    public = kube.get(kube.put(ingress("llama-public", {**limited, PROXY_BODY: "8m"})))
    internal = kube.get(kube.put(ingress("llama-internal", limited)))
    actuator = IngressNginxAdmission(api, NS, ["llama-public", "llama-internal"])
    plan = actuator.plan(AdmissionRule(48 * 1024 + 100))
    assert plan.summary == "proxy-body-size 48k: larger requests get 413 (ingress-nginx)"

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    for path in (INGRESS_PUBLIC, INGRESS_INTERNAL):
        now = kube.get(path)
        assert now is not None
        assert now["metadata"]["annotations"] == {**limited, PROXY_BODY: "48k"}
    assert actuator.verify(plan).status is Status.OK
    assert actuator.revert(plan, dry_run=False).status is Status.OK

    patches = _sent(kube, "PATCH")
    assert [p.body["metadata"]["annotations"] for p in patches] == [
        {PROXY_BODY: "48k"},
        {PROXY_BODY: "48k"},
        {PROXY_BODY: "8m"},  # the value the Ingress had
        {PROXY_BODY: None},  # none before: the controller's default again
    ]
    for path, before in ((INGRESS_PUBLIC, public), (INGRESS_INTERNAL, internal)):
        final = kube.get(path)
        assert before is not None and final is not None
        assert final["metadata"]["annotations"] == before["metadata"]["annotations"]


def test_unreadable_controller_configmap_is_a_note_not_a_failure(
    kube: FakeKube, api: KubeApi
) -> None:
    kube.put(ingress("llama-public"))
    kube.put(controller_configmap({}))
    kube.fail("GET", CONFIGMAP, 403, reason="Forbidden", message="forbidden")
    actuator = IngressNginxRateLimit(api, NS, ["llama-public"])

    plan = actuator.plan(IngressRateLimit(connections=20))

    assert "could not read ConfigMap ingress-nginx/ingress-nginx-controller (forbidden)" in (
        plan.summary
    )
    result = actuator.apply(plan, dry_run=False)
    assert result.status is Status.OK
    assert "could not read ConfigMap" in result.message()


# -- Envoy Gateway -------------------------------------------------------------------------


def test_backend_traffic_policy_created_then_deleted(kube: FakeKube, api: KubeApi) -> None:
    actuator = EnvoyGatewayRateLimit(api, NS, "llama")
    plan = actuator.plan(20, "Second")
    kube.requests.clear()

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [
        ("GET", POLICY, False),
        ("POST", POLICIES, True),
        ("POST", POLICIES, False),
    ]
    assert _sent(kube, "POST")[0].body == {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "BackendTrafficPolicy",
        "metadata": {
            "name": "llama-detector-rate-limit",
            "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": MANAGER},
        },
        "spec": {
            "targetRefs": [
                {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llama"}
            ],
            "rateLimit": {
                "type": "Local",
                "local": {"rules": [{"limit": {"requests": 20, "unit": "Second"}}]},
            },
        },
    }
    created = kube.get(POLICY)
    assert created is not None
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [
        ("GET", POLICY, False),
        ("DELETE", POLICY, True),
        ("DELETE", POLICY, False),
    ]
    assert _sent(kube, "DELETE")[0].body == {
        "preconditions": {
            "uid": created["metadata"]["uid"],
            "resourceVersion": created["metadata"]["resourceVersion"],
        }
    }
    assert kube.get(POLICY) is None


def test_existing_policy_gets_a_merge_patch_and_its_rate_limit_back(
    kube: FakeKube, api: KubeApi
) -> None:
    user_policy = {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "BackendTrafficPolicy",
        "metadata": {"name": "llama-traffic", "namespace": NS},
        "spec": {
            "targetRefs": [
                {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llama"}
            ],
            "timeout": {"http": {"requestTimeout": "300s"}},
        },
    }
    original = kube.get(kube.put(user_policy))
    path = f"{POLICIES}/llama-traffic"
    actuator = EnvoyGatewayRateLimit(api, NS, "llama", policy="llama-traffic")
    plan = actuator.plan(5, "Second")
    assert "existing policy llama-traffic" in plan.summary

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    applied = _sent(kube, "PATCH")[0]
    assert applied.content_type == MERGE
    assert applied.body["spec"] == {
        "rateLimit": {
            "type": "Local",
            "local": {"rules": [{"limit": {"requests": 5, "unit": "Second"}}]},
        }
    }
    live = kube.get(path)
    assert live is not None
    live["status"] = {
        "ancestors": [
            {"conditions": [{"type": "Accepted", "status": "False", "reason": "Conflicted"}]}
        ]
    }
    kube.put(live)
    checked = actuator.verify(plan)
    assert (checked.status, checked.reason) == (Status.FAILED, "not_accepted")

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    assert _sent(kube, "PATCH")[1].body["spec"] == {"rateLimit": None}
    final = kube.get(path)
    assert original is not None and final is not None
    assert final["spec"] == original["spec"]
