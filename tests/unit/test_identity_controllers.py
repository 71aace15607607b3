"""A pod's workload is its top controller: an LWS or an Argo Rollout, not the owner between."""

from __future__ import annotations

import pytest

from detector.correlate.identity import workload_of_pod

LWS = "leaderworkerset.sigs.k8s.io/name"


@pytest.mark.parametrize(
    ("pod", "labels", "owner", "expected"),
    [
        # LeaderWorkerSet: the leader's StatefulSet is <lws>, a group's workers' <lws>-<group>;
        # every pod of every group is one workload
        ("vllm-0", {LWS: "vllm", "statefulset.kubernetes.io/pod-name": "vllm-0"},
         ("StatefulSet", "vllm"), ("LeaderWorkerSet", "vllm")),
        ("vllm-0-1", {LWS: "vllm"}, ("StatefulSet", "vllm-0"), ("LeaderWorkerSet", "vllm")),
        # Argo Rollout: the ReplicaSet <rollout>-<hash> is not a Deployment's
        ("llm-6d9f8b7c5d-x2x9k", {"rollouts-pod-template-hash": "6d9f8b7c5d"},
         ("ReplicaSet", "llm-6d9f8b7c5d"), ("Rollout", "llm")),
        # KServe: the InferenceService is the endpoint, not its predictor Deployment
        ("llama-predictor-00001-deployment-6d9f8b7c5d-x2x9k",
         {"serving.kserve.io/inferenceservice": "llama", "pod-template-hash": "6d9f8b7c5d"},
         ("ReplicaSet", "llama-predictor-00001-deployment-6d9f8b7c5d"),
         ("InferenceService", "llama")),
        # KubeRay: head and workers of one RayCluster, whatever their groups
        ("raysvc-gpu-group-worker-x2x9k", {"ray.io/cluster": "raysvc"},
         ("RayCluster", "raysvc"), ("RayCluster", "raysvc")),
        # an owner of another kind is the controller; a Node (static pod) is not
        ("trainer-x", {}, ("Job", "trainer"), ("Job", "trainer")),
        ("kube-apiserver-master", {}, ("Node", "master"), ("unknown", "kube-apiserver-master")),
        # unchanged: a Deployment's pod and a plain StatefulSet's
        ("llm-6d9f8b7c5d-x2x9k", {"pod-template-hash": "6d9f8b7c5d"},
         ("ReplicaSet", "llm-6d9f8b7c5d"), ("Deployment", "llm")),
        ("tgi-2", {"statefulset.kubernetes.io/pod-name": "tgi-2"}, ("StatefulSet", "tgi"),
         ("StatefulSet", "tgi")),
    ],
)  # fmt: skip
def test_the_top_controller_names_the_workload(
    pod: str, labels: dict[str, str], owner: tuple[str, str], expected: tuple[str, str]
) -> None:
    assert workload_of_pod(pod, labels, owner) == expected
