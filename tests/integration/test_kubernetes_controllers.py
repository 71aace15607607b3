"""StatefulSet, Argo Rollout and LeaderWorkerSet actuators at the request level (kube_fake.py).

Each test checks the exact requests the real ``kubernetes`` client sent: a strategic merge
patch naming the container for a StatefulSet, a JSON merge patch carrying the whole
``containers`` list for the custom resources, the resourceVersion precondition, the server-side
dry run first, and the read-back of a write in doubt. API shapes:
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/stateful-set-v1/ ,
https://argoproj.github.io/argo-rollouts/features/specification/ ,
https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/ .
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from kube_fake import MANAGER, MERGE, SMP, FakeKube, Recorded, api, kube

from detector.actuators.base import ActuatorError, Status
from detector.actuators.kubernetes.api import KubeApi
from detector.actuators.kubernetes.controllers import LEADERWORKERSET, ROLLOUT, STATEFULSET
from detector.actuators.kubernetes.templates import (
    ControllerCeilings,
    RolloutRestart,
    WorkloadTarget,
)

__all__ = ["api", "kube"]  # fixtures, used by name
NS = "inference"
STS = f"/apis/apps/v1/namespaces/{NS}/statefulsets/llama"
ROLLOUT_PATH = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/rollouts/llama"
LWS = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"
VLLM_ARGS = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "256"]
SIDECAR = {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"}


def _template() -> dict[str, Any]:
    vllm = {"name": "vllm", "image": "vllm/vllm-openai:v0.6.3", "args": list(VLLM_ARGS)}
    return {
        "metadata": {"labels": {"app": "llama"}},
        "spec": {"containers": [vllm, dict(SIDECAR)]},
    }


def vllm_statefulset(strategy: dict[str, Any] | None = None, replicas: int = 4) -> dict[str, Any]:
    """Return a vLLM StatefulSet (4 replicas) with a log sidecar."""
    spec: dict[str, Any] = {
        "replicas": replicas,
        "serviceName": "llama",
        "selector": {"matchLabels": {"app": "llama"}},
        "template": _template(),
    }
    if strategy is not None:
        spec["updateStrategy"] = strategy
    meta = {"name": "llama", "namespace": NS}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": spec}


def vllm_rollout(strategy: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """Return a vLLM Argo Rollout: a canary that pauses for a promotion at step 2."""
    canary = {"canary": {"steps": [{"setWeight": 25}, {"pause": {}}, {"setWeight": 100}]}}
    body: dict[str, Any] = {
        "replicas": 4,
        "selector": {"matchLabels": {"app": "llama"}},
        "template": _template(),
        "strategy": canary if strategy is None else strategy,
        **spec,
    }
    meta = {"name": "llama", "namespace": NS}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": meta, "spec": body}


def sglang_lws(name: str = "sglang") -> dict[str, Any]:
    """Return a 2-node SGLang LeaderWorkerSet: both templates run the server with its flags."""
    args = ["--model-path", "meta-llama/Llama-3.1-405B-Instruct", "--tp", "16", "--nnodes", "2"]
    args += ["--max-running-requests", "256"]
    server = {"name": "sglang", "image": "lmsysorg/sglang:v0.4.6"}
    server["command"] = ["python3", "-m", "sglang.launch_server"]
    leader = {**server, "args": [*args, "--node-rank", "0"]}
    worker = {**server, "args": [*args, "--node-rank", "1"]}
    metrics = {"name": "metrics", "image": "prom/statsd-exporter:v0.26.0"}
    template = {
        "size": 2,
        "leaderTemplate": {"spec": {"containers": [leader, metrics]}},
        "workerTemplate": {"spec": {"containers": [worker]}},
    }
    meta = {"name": name, "namespace": NS}
    spec = {"replicas": 2, "leaderWorkerTemplate": template}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": spec,
    }


def vllm_ray_lws(rollout_strategy: dict[str, Any]) -> dict[str, Any]:
    """Return a vLLM LeaderWorkerSet on Ray: the leader serves, the workers run ``ray start``."""
    leader = {"name": "vllm", "command": ["vllm"], "args": ["serve", "m", "--max-num-seqs", "256"]}
    worker = {"name": "vllm", "command": ["ray", "start", "--block", "--address=leader:6379"]}
    template = {
        "size": 2,
        "leaderTemplate": {"spec": {"containers": [leader]}},
        "workerTemplate": {"spec": {"containers": [worker]}},
    }
    spec = {"replicas": 3, "leaderWorkerTemplate": template, "rolloutStrategy": rollout_strategy}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "llama", "namespace": NS},
        "spec": spec,
    }


def _sent(kube: FakeKube, method: str, dry_run: bool = False) -> list[Recorded]:
    return [r for r in kube.requests if r.method == method and r.dry_run == dry_run]


def _with_args(container: dict[str, Any], args: list[str]) -> dict[str, Any]:
    return {**container, "args": args}


# -- StatefulSet ---------------------------------------------------------------------------


def test_statefulset_ceilings_are_a_strategic_merge_of_the_container(
    kube: FakeKube, api: KubeApi
) -> None:
    original = kube.get(kube.put(vllm_statefulset()))
    assert original is not None
    actuator = ControllerCeilings(api, WorkloadTarget(STATEFULSET, NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})

    assert plan.target == "kubernetes:statefulsets.apps/inference/llama"
    assert '-containers[vllm].args[--max-num-seqs]: "256"' in plan.diff
    assert '+containers[vllm].args[--max-num-seqs]: "64"' in plan.diff
    assert "updateStrategy" not in plan.diff  # the default already rolls one pod at a time
    assert "RollingUpdate: one pod at a time, highest ordinal first" in plan.summary
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.OK, result.message()
    assert kube.calls() == [("GET", STS, False), ("PATCH", STS, True), ("PATCH", STS, False)]
    dry, real = kube.writes()
    expected = {
        "metadata": {"resourceVersion": original["metadata"]["resourceVersion"]},
        "spec": {
            "template": {"spec": {"containers": [{"name": "vllm", "args": [*VLLM_ARGS[:3], "64"]}]}}
        },
    }
    assert real.body == dry.body == expected
    assert (real.content_type, real.query) == (SMP, {"fieldManager": MANAGER})
    assert dry.query == {"dryRun": "All", "fieldManager": MANAGER}
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    final = kube.get(STS)
    assert final is not None and final["spec"] == original["spec"]


def test_statefulset_partition_is_kept_and_the_plan_names_the_pods_left_behind(
    kube: FakeKube, api: KubeApi
) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"partition": 2, "maxUnavailable": 2}}
    original = kube.get(kube.put(vllm_statefulset(strategy)))
    assert original is not None
    actuator = ControllerCeilings(api, WorkloadTarget(STATEFULSET, NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})

    assert "rollingUpdate.maxUnavailable 2 -> 1 so one pod at a time" in plan.summary
    assert (
        "partition 2: the change reaches pods llama-2 .. llama-3 only; pods llama-0 .. llama-1 "
        "keep the old template even when restarted"
    ) in plan.summary
    assert (
        "kubectl -n inference patch statefulset llama --type merge -p "
        """'{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}'"""
    ) in plan.summary

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    body = _sent(kube, "PATCH")[0].body
    assert body["spec"]["updateStrategy"] == {"rollingUpdate": {"maxUnavailable": 1}}
    live = kube.get(STS)
    assert live is not None
    assert live["spec"]["updateStrategy"]["rollingUpdate"] == {"partition": 2, "maxUnavailable": 1}
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    final = kube.get(STS)
    assert final is not None and final["spec"] == original["spec"]


def test_statefulset_on_delete_says_the_restart_step_rolls_it_out(
    kube: FakeKube, api: KubeApi
) -> None:
    kube.put(vllm_statefulset({"type": "OnDelete"}))
    actuator = ControllerCeilings(api, WorkloadTarget(STATEFULSET, NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})

    assert "updateStrategy OnDelete" in plan.summary
    assert "the stagger_restarts step (one pod at a time) is what rolls it out" in plan.summary
    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert "updateStrategy" not in _sent(kube, "PATCH")[0].body["spec"]


def test_statefulset_conflict_fails_without_clobbering(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_statefulset())
    actuator = ControllerCeilings(api, WorkloadTarget(STATEFULSET, NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})

    def someone_scales(seen: Recorded) -> None:  # between the dry run and the real PATCH
        if seen.method == "PATCH" and seen.dry_run:
            live = kube.get(STS)
            assert live is not None
            live["spec"]["replicas"] = 6
            kube.put(live)

    kube.hooks.append(someone_scales)
    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "conflict", True)
    live = kube.get(STS)
    assert live is not None and live["spec"]["replicas"] == 6
    assert "256" in live["spec"]["template"]["spec"]["containers"][0]["args"]


# -- Argo Rollout --------------------------------------------------------------------------


def test_rollout_ceilings_are_a_merge_patch_with_the_whole_container_list(
    kube: FakeKube, api: KubeApi
) -> None:
    original = kube.get(kube.put(vllm_rollout()))
    assert original is not None
    actuator = ControllerCeilings(api, WorkloadTarget(ROLLOUT, NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})

    assert plan.target == "kubernetes:rollouts.argoproj.io/inference/llama"
    assert "canary maxSurge/maxUnavailable 25%/25% -> 1/0" in plan.summary
    assert "step 2 pauses until promoted (kubectl argo rollouts promote -n inference llama)" in (
        plan.summary
    )
    kube.requests.clear()

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [
        ("GET", ROLLOUT_PATH, False),
        ("PATCH", ROLLOUT_PATH, True),
        ("PATCH", ROLLOUT_PATH, False),
    ]
    dry, real = kube.writes()
    vllm = original["spec"]["template"]["spec"]["containers"][0]
    assert real.body == dry.body
    assert real.body == {
        "metadata": {"resourceVersion": original["metadata"]["resourceVersion"]},
        "spec": {
            "strategy": {"canary": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "spec": {"containers": [_with_args(vllm, [*VLLM_ARGS[:3], "64"]), SIDECAR]}
            },
        },
    }
    assert real.content_type == MERGE
    live = kube.get(ROLLOUT_PATH)
    assert live is not None
    assert (
        live["spec"]["strategy"]["canary"]["steps"]
        == original["spec"]["strategy"]["canary"]["steps"]
    )
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    restore = _sent(kube, "PATCH")[0].body
    assert restore["spec"]["strategy"] == {"canary": {"maxSurge": None, "maxUnavailable": None}}
    final = kube.get(ROLLOUT_PATH)
    assert final is not None and final["spec"] == original["spec"]


def test_rollout_write_in_doubt_is_read_back(kube: FakeKube, api: KubeApi) -> None:
    before = kube.get(kube.put(vllm_rollout()))
    actuator = ControllerCeilings(api, WorkloadTarget(ROLLOUT, NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    kube.fail("PATCH", ROLLOUT_PATH, dry_run=False, sleep_s=2.0)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "timeout", True)
    assert result.error is not None
    assert "a GET after it shows rollouts.argoproj.io inference/llama unchanged" in result.error
    assert [m for m, _, _ in kube.calls()] == ["GET", "PATCH", "PATCH", "GET"]
    assert kube.get(ROLLOUT_PATH) == before


def rollout_pod(name: str, created: str) -> dict[str, Any]:
    """Return a pod of the llama Rollout created at ``created`` (RFC 3339)."""
    meta = {"name": name, "namespace": NS, "creationTimestamp": created}
    meta["labels"] = {"app": "llama", "rollouts-pod-template-hash": "6f7d8c9b5"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": {"phase": "Running"}}


def test_rollout_restart_sets_restart_at_only_for_a_pod_argo_does_not_restart_yet(
    kube: FakeKube, api: KubeApi
) -> None:
    original = kube.get(kube.put(vllm_rollout(restartAt="2025-02-01T00:00:00Z")))
    assert original is not None
    first, second = "llama-6f7d8c9b5-abcde", "llama-6f7d8c9b5-fghij"
    kube.put(rollout_pod(first, "2025-03-01T10:00:00Z"))  # after the old restartAt
    kube.put(rollout_pod(second, "2025-03-01T10:05:00Z"))
    actuator = RolloutRestart(api, NS, "llama")
    plan = actuator.plan_move(first, datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC))
    assert '-spec.restartAt: "2025-02-01T00:00:00Z"' in plan.diff
    assert "created before 2025-03-04T05:06:07Z, one at a time, by eviction" in plan.summary
    kube.requests.clear()

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [
        ("GET", ROLLOUT_PATH, False),
        ("PATCH", ROLLOUT_PATH, True),
        ("PATCH", ROLLOUT_PATH, False),
    ]
    patch = _sent(kube, "PATCH")[0]
    assert patch.content_type == MERGE
    assert patch.body == {
        "metadata": {"resourceVersion": original["metadata"]["resourceVersion"]},
        "spec": {"restartAt": "2025-03-04T05:06:07Z"},
    }
    kube.requests.clear()

    later = actuator.plan_move(second, datetime(2025, 3, 4, 5, 9, tzinfo=UTC))
    assert later.changes == ()
    assert "is restarted by Argo Rollouts under spec.restartAt 2025-03-04T05:06:07Z" in (
        later.summary
    )
    assert actuator.apply(later, dry_run=False).status is Status.UNCHANGED
    gone = actuator.plan_move("llama-6f7d8c9b5-zzzzz", datetime(2025, 3, 4, 5, 9, tzinfo=UTC))
    assert "no longer exists (already replaced): nothing to restart" in gone.summary
    assert kube.writes() == []
    refused = actuator.revert(plan, dry_run=False)
    assert (refused.status, refused.reason) == (Status.FAILED, "irreversible")


@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        (
            {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama-base"}},
            "takes its pod template from Deployment llama-base (spec.workloadRef)",
        ),
        (
            {"strategy": {"blueGreen": {"activeService": "llama", "previewService": "llama-p"}}},
            "uses blueGreen",
        ),
    ],
)
def test_rollouts_the_detector_does_not_patch_say_what_to_do(
    kube: FakeKube, api: KubeApi, spec: dict[str, Any], wanted: str
) -> None:
    rollout = vllm_rollout()
    rollout["spec"].update(copy.deepcopy(spec))
    if "workloadRef" in spec:
        del rollout["spec"]["template"]
    kube.put(rollout)
    actuator = ControllerCeilings(api, WorkloadTarget(ROLLOUT, NS, "llama", "vllm"), "vllm")

    with pytest.raises(ActuatorError) as raised:
        actuator.plan({"max_num_seqs": 64})

    assert raised.value.reason == "manual"
    assert wanted in raised.value.detail
    resource = "deployment llama-base" if "workloadRef" in spec else "rollout llama"
    assert f"kubectl -n inference edit {resource}, set --max-num-seqs=64 in vllm" in (
        raised.value.detail
    )
    assert kube.writes() == []


def test_a_degraded_rollout_fails_verification(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_rollout())
    actuator = ControllerCeilings(api, WorkloadTarget(ROLLOUT, NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    assert actuator.apply(plan, dry_run=False).status is Status.OK
    live = kube.get(ROLLOUT_PATH)
    assert live is not None
    live["status"] = {"phase": "Degraded", "message": "ProgressDeadlineExceeded"}
    kube.put(live)

    checked = actuator.verify(plan)

    assert (checked.status, checked.reason) == (Status.FAILED, "rollout_stalled")
    assert (
        checked.error == "rollouts.argoproj.io inference/llama: Degraded: ProgressDeadlineExceeded"
    )


# -- LeaderWorkerSet -----------------------------------------------------------------------


def test_lws_ceilings_patch_both_templates_with_their_whole_container_lists(
    kube: FakeKube, api: KubeApi
) -> None:
    original = kube.get(kube.put(sglang_lws()))
    assert original is not None
    path = f"{LWS}/sglang"
    workload = WorkloadTarget(LEADERWORKERSET, NS, "sglang", "sglang")
    actuator = ControllerCeilings(api, workload, "sglang")
    plan = actuator.plan({"max_running_requests": 24})

    assert '+leaderTemplate.containers[sglang].args[--max-running-requests]: "24"' in plan.diff
    assert '+workerTemplate.containers[sglang].args[--max-running-requests]: "24"' in plan.diff
    assert plan.summary.startswith(
        "sglang max_running_requests=24 in leaderTemplate container sglang and workerTemplate "
        "container sglang; one group (leader and workers) at a time"
    )
    kube.requests.clear()

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [("GET", path, False), ("PATCH", path, True), ("PATCH", path, False)]
    dry, real = kube.writes()
    templates = original["spec"]["leaderWorkerTemplate"]
    leader, metrics = templates["leaderTemplate"]["spec"]["containers"]
    (worker,) = templates["workerTemplate"]["spec"]["containers"]

    def lowered(container: dict[str, Any]) -> dict[str, Any]:
        args = list(container["args"])
        args[args.index("--max-running-requests") + 1] = "24"
        return _with_args(container, args)

    assert real.body == dry.body
    assert real.body == {
        "metadata": {"resourceVersion": original["metadata"]["resourceVersion"]},
        "spec": {
            "leaderWorkerTemplate": {
                "leaderTemplate": {"spec": {"containers": [lowered(leader), metrics]}},
                "workerTemplate": {"spec": {"containers": [lowered(worker)]}},
            }
        },
    }
    assert real.content_type == MERGE
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    final = kube.get(path)
    assert final is not None and final["spec"] == original["spec"]


def test_lws_ceilings_skip_a_ray_worker_and_roll_one_group_at_a_time(
    kube: FakeKube, api: KubeApi
) -> None:
    strategy = {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 2, "maxSurge": 0, "partition": 1},
    }
    original = kube.get(kube.put(vllm_ray_lws(strategy)))
    assert original is not None
    path = f"{LWS}/llama"
    workload = WorkloadTarget(LEADERWORKERSET, NS, "llama")
    actuator = ControllerCeilings(api, workload, "vllm", rollout="unavailable")
    plan = actuator.plan({"max_num_seqs": 13})

    assert "in leaderTemplate container vllm;" in plan.summary
    assert "maxSurge/maxUnavailable 0/2 -> 0/1 so one group at a time" in plan.summary
    assert "partition 1: the change reaches groups llama-1 .. llama-2 only; groups llama-0" in (
        plan.summary
    )
    assert "workerTemplate container vllm sets none of vllm's ceilings: left as is" in plan.summary

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    body = _sent(kube, "PATCH")[0].body
    assert body["spec"]["rolloutStrategy"] == {"rollingUpdateConfiguration": {"maxUnavailable": 1}}
    assert set(body["spec"]["leaderWorkerTemplate"]) == {"leaderTemplate"}
    (leader,) = body["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
    assert leader["args"] == ["serve", "m", "--max-num-seqs", "13"]
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    final = kube.get(path)
    assert final is not None and final["spec"] == original["spec"]
