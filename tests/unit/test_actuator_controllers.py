"""Pure parts of the StatefulSet, Argo Rollout and LeaderWorkerSet actuators.

Strategies and their notes, pod templates and serving containers, the JSON merge of a
container, LWS group names, which controller a workload resolves to (against a stub of the API
adapter), and the manual step.
"""

from __future__ import annotations

from typing import Any

import pytest

from detector.actuators.base import ActuatorError, Plan, Status
from detector.actuators.kubernetes.api import (
    LEADERWORKERSETS,
    ROLLOUTS,
    STATEFULSETS,
    ApiRequest,
    ObjectRef,
    Permission,
    Verb,
    permission,
)
from detector.actuators.kubernetes.controllers import (
    LEADERWORKERSET,
    STATEFULSET,
    apply_container_entry,
    engine_templates,
    flags_text,
    lws_strategy,
    rollout_strategy,
    statefulset_strategy,
    template_containers,
)
from detector.actuators.kubernetes.patch import container_patch
from detector.actuators.kubernetes.resolve import (
    ManualStep,
    Workload,
    ceilings_by_hand,
    resolve_workload,
    restart_by_hand,
)
from detector.actuators.kubernetes.restarts import group_of_name

META = {"name": "llama", "namespace": "inference"}


def _obj(**spec: Any) -> dict[str, Any]:
    return {"metadata": dict(META), "spec": spec}


# -- strategies ----------------------------------------------------------------------------


def test_statefulset_strategies() -> None:
    default = statefulset_strategy(_obj(replicas=3), "surge")
    assert (default.value, default.note) == (
        None,
        "RollingUpdate: one pod at a time, highest ordinal first",
    )
    wide = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}}
    narrowed = statefulset_strategy(_obj(updateStrategy=wide), "surge")
    assert narrowed.value == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    assert "maxUnavailable 50% -> 1" in narrowed.note
    partitioned = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    note = statefulset_strategy(_obj(replicas=3, updateStrategy=partitioned), "surge").note
    assert "reaches pods llama-1 .. llama-2 only; pods llama-0 keep the old template" in note
    everything = {"type": "RollingUpdate", "rollingUpdate": {"partition": 5}}
    note = statefulset_strategy(_obj(replicas=3, updateStrategy=everything), "surge").note
    assert "reaches pods none only; pods llama-0 .. llama-2 keep" in note
    on_delete = statefulset_strategy(_obj(updateStrategy={"type": "OnDelete"}), "surge")
    assert on_delete.value == {"type": "OnDelete"}
    assert "is what rolls it out" in on_delete.note


def test_rollout_strategies() -> None:
    canary = {"canary": {"maxSurge": 0, "maxUnavailable": 1, "steps": [{"setWeight": 50}]}}
    kept = rollout_strategy(_obj(strategy=canary), "surge")
    assert kept.value == canary
    assert kept.note == (
        "canary: one pod at a time, maxSurge/maxUnavailable unchanged; the 1 canary steps run "
        "as written"
    )
    timed = {"canary": {"steps": [{"pause": {"duration": "10m"}}]}}
    changed = rollout_strategy(_obj(strategy=timed, paused=True), "unavailable")
    assert changed.value == {
        "canary": {"steps": [{"pause": {"duration": "10m"}}], "maxSurge": 0, "maxUnavailable": 1}
    }
    assert "pauses until promoted" not in changed.note
    assert "kubectl argo rollouts resume -n inference llama" in changed.note
    with pytest.raises(ActuatorError, match="uses blueGreen") as raised:
        rollout_strategy(_obj(strategy={"blueGreen": {}}), "surge")
    assert raised.value.reason == "manual"


def test_lws_strategies() -> None:
    assert lws_strategy(_obj(), "surge").value is None  # maxUnavailable 1 / maxSurge 0 default
    wide = {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 3}}
    surge = lws_strategy(_obj(rolloutStrategy=wide), "surge")
    assert surge.value == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert "(surge: a whole extra group needs its GPUs first)" in surge.note


# -- templates and containers --------------------------------------------------------------


def _lws(leader: list[dict[str, Any]] | None, worker: list[dict[str, Any]]) -> dict[str, Any]:
    template: dict[str, Any] = {"workerTemplate": {"spec": {"containers": worker}}}
    if leader is not None:
        template["leaderTemplate"] = {"spec": {"containers": leader}}
    return _obj(leaderWorkerTemplate=template)


def test_serving_containers_of_each_template() -> None:
    vllm = {"name": "vllm", "args": ["serve", "--max-num-seqs", "8"]}
    ray = {"name": "ray", "command": ["ray", "start"]}
    obj = _lws([vllm, {"name": "sidecar"}], [ray])
    found = template_containers(LEADERWORKERSET, obj, "vllm")
    assert [(t.label, c["name"]) for t, c in found] == [("leaderTemplate", "vllm")]
    found = template_containers(LEADERWORKERSET, obj, None)  # the leader has two: skipped
    assert [(t.label, c["name"]) for t, c in found] == [("workerTemplate", "ray")]
    with pytest.raises(ActuatorError, match="has no container tgi") as raised:
        template_containers(LEADERWORKERSET, obj, "tgi")
    assert raised.value.reason == "not_found"
    with pytest.raises(ActuatorError, match="name the serving one"):
        template_containers(LEADERWORKERSET, _lws(None, [vllm, ray]), None)

    both = template_containers(LEADERWORKERSET, _lws([vllm], [ray]), None)
    assert [c["name"] for _, c in engine_templates(both, "vllm")] == ["vllm"]
    bare = template_containers(LEADERWORKERSET, _lws([{"name": "a"}], [{"name": "b"}]), None)
    assert [c["name"] for _, c in engine_templates(bare, "vllm")] == ["a"]  # the leader's
    only = template_containers(STATEFULSET, _obj(template={"spec": {"containers": [vllm]}}), None)
    assert [t.label for t, _ in only] == ["pod template"]


def test_a_container_entry_merges_like_the_api_server() -> None:
    tgi = {
        "name": "tgi",
        "image": "tgi:2.4",
        "env": [{"name": "MODEL_ID", "value": "m"}, {"name": "MAX_TOTAL_TOKENS", "value": "8"}],
    }
    current = {"containers[tgi].env[MAX_TOTAL_TOKENS]": "8"}
    desired = {"containers[tgi].env[MAX_CONCURRENT_REQUESTS]": "4"}
    entry = container_patch(tgi, current, desired)
    assert entry is not None
    assert apply_container_entry(tgi, entry) == {
        "name": "tgi",
        "image": "tgi:2.4",
        "env": [
            {"name": "MODEL_ID", "value": "m"},
            {"name": "MAX_CONCURRENT_REQUESTS", "value": "4"},
        ],
    }
    lone = {"name": "tgi", "env": [{"name": "MAX_TOTAL_TOKENS", "value": "8"}]}
    gone = container_patch(lone, current, {})
    assert gone is not None and apply_container_entry(lone, gone) == {"name": "tgi"}


def test_flags_for_people() -> None:
    assert flags_text("vllm", {"max_num_seqs": 13}) == "--max-num-seqs=13"
    assert flags_text("tgi", {"max_concurrent_requests": 8}) == "env MAX_CONCURRENT_REQUESTS=8"


@pytest.mark.parametrize(
    ("pod", "group"),
    [
        ("sglang-2", ("sglang-2", "2")),
        ("sglang-2-3", ("sglang-2", "2")),
        ("sglang-x-3", None),
        ("sglang-2-3-4", None),
        ("other-2", None),
        ("sglang", None),
    ],
)
def test_lws_group_of_a_pod_name(pod: str, group: tuple[str, str] | None) -> None:
    assert group_of_name("sglang", pod) == group


# -- the API calls -------------------------------------------------------------------------


def test_the_controller_calls_and_their_grants() -> None:
    sts = ApiRequest(Verb.PATCH, ObjectRef(STATEFULSETS, "ns", "a"), {})
    lws = ApiRequest(Verb.PATCH, ObjectRef(LEADERWORKERSETS, "ns", "a"), {})
    assert sts.content_type == "application/strategic-merge-patch+json"
    assert lws.content_type == "application/merge-patch+json"
    assert lws.path == "/apis/leaderworkerset.x-k8s.io/v1/namespaces/ns/leaderworkersets/a"
    assert permission(ROLLOUTS, Verb.PATCH) == Permission("argoproj.io", "rollouts", "patch")


# -- which controller ----------------------------------------------------------------------


class StubApi:
    """The API adapter's ``get``, from a dict of objects by (plural, name)."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.gets: list[tuple[str, str]] = []

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        self.gets.append((ref.kind.plural, ref.name))
        return self.objects.get((ref.kind.plural, ref.name))


def _resolve(objects: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> Workload:
    return resolve_workload(StubApi(objects), kind, "ns", name)  # type: ignore[arg-type]


def test_workloads_resolve_to_the_controller_of_their_template() -> None:
    owned = {"metadata": {"ownerReferences": [{"kind": "LeaderWorkerSet", "name": "big"}]}}
    owned["metadata"]["ownerReferences"][0]["controller"] = True
    labelled = {"metadata": {"labels": {"leaderworkerset.sigs.k8s.io/name": "big"}}}
    serving = {"metadata": {"ownerReferences": [{"kind": "InferenceService", "name": "s"}]}}
    serving["metadata"]["ownerReferences"][0]["controller"] = True
    objects = {
        ("deployments", "web"): {"metadata": {}},
        ("rollouts", "canary"): {"metadata": {}},
        ("statefulsets", "big"): owned,
        ("statefulsets", "big-0"): labelled,
        ("statefulsets", "kserve"): serving,
    }
    assert _resolve(objects, "Deployment", "web") == Workload("Deployment", "ns", "web")
    assert _resolve(objects, "Deployment", "canary") == Workload("Rollout", "ns", "canary")
    assert _resolve(objects, "Deployment", "gone") == Workload("Deployment", "ns", "gone")
    assert _resolve(objects, "StatefulSet", "big") == Workload("LeaderWorkerSet", "ns", "big")
    assert _resolve(objects, "StatefulSet", "big-0") == Workload("LeaderWorkerSet", "ns", "big")
    assert _resolve(objects, "StatefulSet", "kserve").managed_by == ("InferenceService", "s")
    stub = StubApi(objects)
    assert resolve_workload(stub, "Job", "ns", "x") == Workload("Job", "ns", "x")  # type: ignore[arg-type]
    assert stub.gets == []


# -- manual --------------------------------------------------------------------------------


def test_instructions_for_people() -> None:
    tgi = ceilings_by_hand(
        Workload("DaemonSet", "ns", "tgi"), "tgi", {"max_concurrent_requests": 8}, "why"
    )
    assert tgi == (
        "why. By hand: kubectl -n ns edit daemonset tgi, set env MAX_CONCURRENT_REQUESTS=8 in "
        "the serving container of its pod template, then restart its pods one at a time"
    )
    restart = restart_by_hand(Workload("Job", "ns", "batch"), "batch-x", "why")
    assert restart == (
        "why. By hand: kubectl -n ns delete pod batch-x once Job ns/batch would re-create it, "
        "one pod at a time, each after the one before is Ready"
    )


def test_a_manual_step_fails_with_its_instructions_and_changes_nothing() -> None:
    manual = ManualStep()
    plan = manual.plan("lower_batch_ceiling", Workload("Job", "ns", "a"), "do this")
    assert plan == Plan("lower_batch_ceiling", "kubernetes:manual/Job/ns/a", (), "do this")
    for dry_run in (True, False):
        result = manual.apply(plan, dry_run=dry_run)
        assert (result.status, result.reason, result.error) == (Status.FAILED, "manual", "do this")
    assert manual.verify(plan).reason == "manual"
    assert manual.revert(plan, dry_run=False).status is Status.UNCHANGED
    with pytest.raises(ActuatorError, match="changed by hand"):
        manual.write(plan.target, "x")
