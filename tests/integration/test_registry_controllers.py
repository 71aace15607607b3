"""Runbook steps on StatefulSets, Argo Rollouts and LeaderWorkerSets through the registry.

The registry is built from settings whose kubeconfig points at the fake API server
(kube_fake.py); each test plans a runbook step as the step machine hands it over (its params:
``namespace``, ``workload``, ``workload_kind`` as the correlator names the workload, the
rendered ``settings``, the restart order ``pods`` and the move's ``pod``), applies it, and
checks the exact requests: which controller the change went to, one pod (one group) per
restart move, and the manual outcome of a step the detector does not make.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import test_kubernetes_actuator
import test_kubernetes_controllers
from kube_fake import (
    MERGE,
    SMP,
    FakeKube,
    Recorded,
    check_every_granted_call,
    kube,
    write_kubeconfig,
)
from test_kubernetes_actuator import pod as deployment_pod
from test_kubernetes_controllers import rollout_pod, sglang_lws, vllm_rollout, vllm_statefulset

from detector.actuators.base import Plan, Status
from detector.config import ContainmentSettings, KubernetesSettings, Settings
from detector.runbooks.bindings.base import StepActuator
from detector.runbooks.bindings.kubernetes import evictions, kube_api
from detector.runbooks.bindings.registry import step_actuators
from detector.runbooks.definition import Action
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import PlannedStep, planned_step

__all__ = ["kube"]  # a fixture, used by name
RUNBOOK = load_runbook(default_runbook_path())
NS = "inference"
STS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments"
ROLLOUT = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/rollouts/llama"
LWS = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets/sglang"
PODS = f"/api/v1/namespaces/{NS}/pods"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


def _settings(tmp_path: Path, url: str, **cfg: Any) -> KubernetesSettings:
    return KubernetesSettings(kubeconfig=write_kubeconfig(tmp_path, url), **cfg)


def _registry(tmp_path: Path, kube: FakeKube, **cfg: Any) -> dict[str, StepActuator]:
    kubernetes = _settings(tmp_path, kube.url, **cfg)
    return step_actuators(Settings(containment=ContainmentSettings(kubernetes=kubernetes)))


def _step(action: Action, **params: str) -> PlannedStep:
    position = next(i for i, s in enumerate(RUNBOOK.steps, 1) if s.action is action)
    return planned_step(RUNBOOK, position, {"namespace": NS, **params}, "planned")


def ceiling_step(kind: str, workload: str, engine: str = "vllm", settings: str = "") -> PlannedStep:
    """Return a planned ``lower_batch_ceiling`` step for ``kind`` ``inference/workload``."""
    settings = settings or "--max-num-seqs=13"
    return _step(
        Action.LOWER_BATCH_CEILING,
        workload=workload,
        workload_kind=kind,
        engine=engine,
        settings=settings,
    )


def restart_move(kind: str, workload: str, order: list[str], pod: str) -> PlannedStep:
    """Return the ``stagger_restarts`` step as the step machine hands over the move of ``pod``."""
    return _step(
        Action.STAGGER_RESTARTS,
        workload=workload,
        workload_kind=kind,
        pods=json.dumps(order),
        pod=pod,
    )


def _pod(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    obj = deployment_pod(uid=f"uid-{name}")
    obj["metadata"].update(name=name, labels=labels or {}, **meta)
    return obj


def _lws_pods(kube: FakeKube, groups: int = 2) -> None:
    """Store an LWS's pods and StatefulSets as its controller makes them (see restarts.py)."""
    for group in range(groups):
        leader = f"sglang-{group}"
        labels = {LWS_NAME: "sglang", "leaderworkerset.sigs.k8s.io/group-index": str(group)}
        kube.put(_pod(leader, {**labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"}))
        annotations = {"leaderworkerset.sigs.k8s.io/leader-name": leader}
        worker = {**labels, "leaderworkerset.sigs.k8s.io/worker-index": "1"}
        kube.put(_pod(f"{leader}-1", worker, annotations=annotations))
        owner = {"apiVersion": "v1", "kind": "Pod", "name": leader, "controller": True}
        workers = vllm_statefulset()
        workers["metadata"].update(name=leader, labels=labels, ownerReferences=[owner])
        kube.put(workers)
    leaders = vllm_statefulset()
    owner = {"kind": "LeaderWorkerSet", "name": "sglang", "controller": True}
    leaders["metadata"].update(name="sglang", labels={LWS_NAME: "sglang"}, ownerReferences=[owner])
    kube.put(leaders)


def _evicted(kube: FakeKube) -> list[tuple[str, bool]]:
    """Return (pod, dry run) of every eviction the server got."""
    return [
        (r.path.split("/")[-2], r.dry_run)
        for r in kube.requests
        if r.method == "POST" and r.path.endswith("/eviction")
    ]


# -- ceilings ------------------------------------------------------------------------------


def test_a_statefulset_step_patches_the_statefulset(kube: FakeKube, tmp_path: Path) -> None:
    kube.put(vllm_statefulset())
    registry = _registry(tmp_path, kube, containers={f"{NS}/llama": "vllm"})
    binding = registry[Action.LOWER_BATCH_CEILING.value]
    plan = binding.plan_step(ceiling_step("StatefulSet", "llama"))
    assert plan.target == "kubernetes:statefulsets.apps/inference/llama"
    kube.requests.clear()

    result = binding.apply(plan, dry_run=False)

    assert result.status is Status.OK, result.message()
    assert kube.calls() == [
        ("GET", f"{STS}/llama", False),
        ("PATCH", f"{STS}/llama", True),
        ("PATCH", f"{STS}/llama", False),
    ]
    patch = kube.writes()[-1]
    assert patch.content_type == SMP
    (container,) = patch.body["spec"]["template"]["spec"]["containers"]
    assert container == {"name": "vllm", "args": ["--model", "meta-llama/Llama-3.1-8B-Instruct",
                                                  "--max-num-seqs", "13"]}  # fmt: skip

    # a plan read back from the store is applied by a fresh registry (after a restart)
    fresh = _registry(tmp_path, kube, containers={f"{NS}/llama": "vllm"})
    stored = Plan.from_record(plan.as_record())
    again = fresh[Action.LOWER_BATCH_CEILING.value].revert(stored, dry_run=False)
    assert again.status is Status.OK, again.message()
    live = kube.get(f"{STS}/llama")
    assert live is not None and "256" in live["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_rollout_named_like_a_deployment_is_patched_as_a_rollout(
    kube: FakeKube, tmp_path: Path
) -> None:
    kube.put(vllm_rollout())  # its pods are owned by ReplicaSets llama-<hash>: "Deployment"
    registry = _registry(tmp_path, kube, containers={f"{NS}/llama": "vllm"})
    binding = registry[Action.LOWER_BATCH_CEILING.value]
    kube.requests.clear()

    plan = binding.plan_step(ceiling_step("Deployment", "llama"))

    assert plan.target == "kubernetes:rollouts.argoproj.io/inference/llama"
    assert kube.calls()[:3] == [
        ("GET", f"{DEPLOY}/llama", False),  # 404: no Deployment of that name
        ("GET", ROLLOUT, False),  # the Rollout that owns the ReplicaSets
        ("GET", ROLLOUT, False),  # the plan's read
    ]
    assert binding.apply(plan, dry_run=False).status is Status.OK
    assert kube.writes()[-1].content_type == MERGE
    assert "--max-num-seqs" in json.dumps(kube.writes()[-1].body)


def test_an_lws_named_by_its_worker_statefulset_patches_the_lws(
    kube: FakeKube, tmp_path: Path
) -> None:
    kube.put(sglang_lws())
    _lws_pods(kube)
    registry = _registry(tmp_path, kube, containers={f"{NS}/sglang": "sglang"})
    binding = registry[Action.LOWER_BATCH_CEILING.value]
    step = ceiling_step("StatefulSet", "sglang-1", "sglang", "--max-running-requests=24")

    plan = binding.plan_step(step)

    assert plan.target == "kubernetes:leaderworkersets.leaderworkerset.x-k8s.io/inference/sglang"
    assert binding.apply(plan, dry_run=False).status is Status.OK
    written = [r.path for r in kube.writes()]
    assert written == [LWS, LWS]  # the dry run, then the patch; no StatefulSet is touched

    fresh = _registry(tmp_path, kube, containers={f"{NS}/sglang": "sglang"})
    reverted = fresh[Action.LOWER_BATCH_CEILING.value].revert(Plan.from_record(plan.as_record()))
    assert reverted.status is Status.DRY_RUN, reverted.message()


# -- restarts ------------------------------------------------------------------------------


def test_statefulset_restart_moves_evict_one_pod_each(kube: FakeKube, tmp_path: Path) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
    kube.put(vllm_statefulset(strategy))
    for ordinal in range(4):
        kube.put(_pod(f"llama-{ordinal}"))
    binding = _registry(tmp_path, kube)[Action.STAGGER_RESTARTS.value]
    order = ["llama-3", "llama-1"]

    for pod in order:
        kube.requests.clear()
        plan = binding.plan_step(restart_move("StatefulSet", "llama", order, pod))
        result = binding.apply(plan, dry_run=False)
        assert result.status is Status.OK, result.message()
        assert _evicted(kube) == [(pod, True), (pod, False)]  # this pod only, dry run first
        (live,) = [r for r in kube.requests if r.method == "POST" and not r.dry_run]
        assert live.body["deleteOptions"] == {"preconditions": {"uid": f"uid-{pod}"}}
        if pod == "llama-3":
            assert plan.summary.endswith("StatefulSet llama re-creates it under the same name")
        else:
            assert "ordinal 1 is below partition 2, so a template change (new ceilings) does " in (
                plan.summary
            )
    assert kube.get(f"{PODS}/llama-0") is not None and kube.get(f"{PODS}/llama-2") is not None


def test_statefulset_on_delete_restart_says_it_rolls_the_template(
    kube: FakeKube, tmp_path: Path
) -> None:
    kube.put(vllm_statefulset({"type": "OnDelete"}))
    kube.put(_pod("llama-0"))
    binding = _registry(tmp_path, kube)[Action.STAGGER_RESTARTS.value]

    plan = binding.plan_step(restart_move("StatefulSet", "llama", ["llama-0"], "llama-0"))

    assert "this restart is what rolls a template change out to the pod" in plan.summary


def test_lws_restart_evicts_the_group_leader_only_once_per_group(
    kube: FakeKube, tmp_path: Path
) -> None:
    kube.put(sglang_lws())
    _lws_pods(kube)
    leaders = {p: kube.get(f"{PODS}/{p}") for p in ("sglang-0", "sglang-1")}

    def lws_recreates_the_leader(seen: Recorded) -> None:
        name = seen.path.split("/")[-2]
        if seen.path.endswith("/eviction") and not seen.dry_run and name in leaders:
            again = dict(leaders[name] or {})
            again["metadata"] = {**again["metadata"], "uid": f"uid-{name}-new"}
            kube.put(again)

    kube.hooks.append(lws_recreates_the_leader)
    binding = _registry(tmp_path, kube)[Action.STAGGER_RESTARTS.value]
    order = ["sglang-1-1", "sglang-0", "sglang-1"]  # a crashed worker first, then the leaders
    evicted: list[list[tuple[str, bool]]] = []

    for pod in order:
        kube.requests.clear()
        plan = binding.plan_step(restart_move("StatefulSet", "sglang", order, pod))
        assert binding.apply(plan, dry_run=False).ok
        evicted.append(_evicted(kube))
        if pod == "sglang-1-1":
            assert "restarts group 1 of LeaderWorkerSet inference/sglang as one unit through " in (
                plan.summary
            )
            assert "its leader sglang-1 only (pod sglang-1-1 is one of its workers)" in plan.summary

    assert evicted == [
        [("sglang-1", True), ("sglang-1", False)],  # the worker's group, through its leader
        [("sglang-0", True), ("sglang-0", False)],
        [],  # group 1 was restarted by the first move: its leader is a new pod
    ]
    assert kube.get(f"{PODS}/sglang-1-1") is not None  # no worker is evicted

    # a process that did not evict it (restarted since) restarts the group once more: safe side
    fresh = _registry(tmp_path, kube)[Action.STAGGER_RESTARTS.value]
    again = fresh.plan_step(restart_move("StatefulSet", "sglang", order, "sglang-1"))
    assert [c.target for c in again.changes] == [f"pods/{NS}/sglang-1@uid-sglang-1-new"]


def test_rollout_restart_moves_set_restart_at_once(kube: FakeKube, tmp_path: Path) -> None:
    kube.put(vllm_rollout())
    order = ["llama-6f7d8c9b5-abcde", "llama-6f7d8c9b5-fghij"]
    for name in order:
        kube.put(rollout_pod(name, "2025-03-01T10:00:00Z"))
    cfg = _settings(tmp_path, kube.url)
    times = iter(
        [datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC), datetime(2025, 3, 4, 5, 9, tzinfo=UTC)]
    )
    clock: Callable[[], datetime] = lambda: next(times)  # noqa: E731
    binding = evictions(kube_api(cfg), cfg, clock=clock)

    first = binding.plan_step(restart_move("Deployment", "llama", order, order[0]))
    assert binding.apply(first, dry_run=False).status is Status.OK
    patches = [r for r in kube.requests if r.method == "PATCH"]
    assert [(r.path, r.dry_run) for r in patches] == [(ROLLOUT, True), (ROLLOUT, False)]
    assert patches[-1].body["spec"] == {"restartAt": "2025-03-04T05:06:07Z"}
    kube.requests.clear()

    second = binding.plan_step(restart_move("Deployment", "llama", order, order[1]))
    assert binding.apply(second, dry_run=False).status is Status.UNCHANGED
    assert kube.writes() == []
    live = kube.get(ROLLOUT)
    assert live is not None and live["spec"]["restartAt"] == "2025-03-04T05:06:07Z"


# -- what the detector does not do ---------------------------------------------------------


def _manual(binding: StepActuator, step: PlannedStep, kube: FakeKube) -> Plan:
    """Plan ``step``, check it is a manual plan that fails with its instructions, return it."""
    plan = binding.plan_step(step)
    kind, name = step.params["workload_kind"], step.params["workload"]
    assert plan.target == f"kubernetes:manual/{kind}/{NS}/{name}"
    assert plan.changes == ()
    for dry_run in (True, False):
        result = binding.apply(plan, dry_run=dry_run)
        assert (result.status, result.reason, result.restored) == (Status.FAILED, "manual", True)
        assert result.error == plan.summary
        assert f"- manual: {plan.summary}; previous state restored" in result.message()
    assert binding.revert(plan, dry_run=False).status is Status.UNCHANGED
    assert kube.writes() == []
    return plan


def test_an_unknown_kind_gets_instructions_not_a_bare_unsupported(
    kube: FakeKube, tmp_path: Path
) -> None:
    registry = _registry(tmp_path, kube)
    ceilings = registry[Action.LOWER_BATCH_CEILING.value]

    plan = _manual(ceilings, ceiling_step("InferenceService", "llama"), kube)

    assert plan.summary == (
        "the detector does not patch the ceilings of kind InferenceService. By hand: kubectl -n "
        "inference edit inferenceservice llama, set --max-num-seqs=13 in the serving container "
        "of its pod template, then restart its pods one at a time"
    )
    assert kube.requests == []  # nothing to read for a kind the detector does not know

    stored = Plan.from_record(plan.as_record())  # read back after a restart: still manual
    again = _registry(tmp_path, kube)[Action.LOWER_BATCH_CEILING.value].apply(stored)
    assert (again.status, again.reason) == (Status.FAILED, "manual")

    restarts = registry[Action.STAGGER_RESTARTS.value]
    move = restart_move("unknown", "llama-standalone", ["llama-standalone"], "llama-standalone")
    restart = _manual(restarts, move, kube)
    assert "pod inference/llama-standalone has no controller the detector knows" in (
        restart.summary
    )


@pytest.mark.parametrize(
    ("setup", "kind", "wanted"),
    [
        (
            "owned",
            "StatefulSet",
            "StatefulSet inference/llama is managed by InferenceService llama (its controller "
            "reference): a patch to it would be undone. By hand: kubectl -n inference edit "
            "inferenceservice llama, set --max-num-seqs=13 for container vllm in its spec",
        ),
        (
            "shell",
            "StatefulSet",
            "container vllm starts through a shell string: --max-num-seqs cannot be set as an "
            "argument; change the command by hand. By hand: kubectl -n inference edit "
            "statefulset llama, set --max-num-seqs=13 in container vllm of its pod template",
        ),
        (
            "workload_ref",
            "Deployment",
            "Rollout inference/llama takes its pod template from Deployment llama-base "
            "(spec.workloadRef): change the template there, and the Rollout rolls it out with "
            "its own strategy. By hand: kubectl -n inference edit deployment llama-base, set "
            "--max-num-seqs=13 in vllm",
        ),
    ],
)
def test_a_controller_the_detector_cannot_patch_gets_instructions(
    kube: FakeKube, tmp_path: Path, setup: str, kind: str, wanted: str
) -> None:
    if setup == "workload_ref":
        rollout = vllm_rollout(workloadRef={"kind": "Deployment", "name": "llama-base"})
        del rollout["spec"]["template"]
        kube.put(rollout)
    else:
        sts = vllm_statefulset()
        if setup == "owned":
            owner = {"kind": "InferenceService", "name": "llama", "controller": True}
            sts["metadata"]["ownerReferences"] = [owner]
        else:
            vllm = sts["spec"]["template"]["spec"]["containers"][0]
            vllm.update(command=["sh", "-c", "vllm serve m --max-num-seqs 256"], args=[])
        kube.put(sts)
    binding = _registry(tmp_path, kube, containers={f"{NS}/llama": "vllm"})[
        Action.LOWER_BATCH_CEILING.value
    ]

    plan = _manual(binding, ceiling_step(kind, "llama"), kube)

    assert wanted in plan.summary


# -- RBAC ----------------------------------------------------------------------------------


def test_every_granted_call_is_exercised() -> None:
    """Run last: the request-level tests together make every call deploy/rbac.yaml grants."""
    check_every_granted_call(
        test_kubernetes_actuator, test_kubernetes_controllers, sys.modules[__name__]
    )
