"""A pod's workload is its top controller: an LWS or an Argo Rollout, not the owner between;
and a load-balancer line goes to it whatever that controller is."""

from __future__ import annotations

from dataclasses import replace

import pytest

from detector.config import CorrelateSettings, UpstreamMapping, WorkloadMap
from detector.correlate.correlator import Correlator
from detector.correlate.identity import WorkloadResolver, workload_of_pod
from detector.correlate.state import EvidenceAdded, IncidentOpened, VerdictRecorded
from detector.events.model import Signal, SignalKind, SourcePos

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


# --- load-balancer lines go to the pods' workload, whatever their controller (issue 24) ------
# The upstream's name (ingress-nginx <namespace>-<service>-<port>, or a workloads file entry)
# names a namespace and a workload, not a controller kind: a StatefulSet's lines were a
# separate "Deployment" with no GPU OOM, so the incident lost its lb_errors and got a
# contradictory "failing upstream" verdict.

T0 = 1_741_943_000.0
SRC = SourcePos("t", 1)
# (pod, labels, ownerReferences[0]) of one pod per controller, and the workload's kind
PODS = {
    "Deployment": ("vllm-7d9f8b6c5-x2x9k", {"pod-template-hash": "7d9f8b6c5"},
                   ("ReplicaSet", "vllm-7d9f8b6c5")),
    "StatefulSet": ("vllm-0", {"statefulset.kubernetes.io/pod-name": "vllm-0"},
                    ("StatefulSet", "vllm")),
    "LeaderWorkerSet": ("vllm-0-1", {LWS: "vllm"}, ("StatefulSet", "vllm-0")),
    # an Argo Rollout's pods are named like a ReplicaSet's
    "Rollout": ("vllm-6d9f8b7c5d-x2x9k", {"rollouts-pod-template-hash": "6d9f8b7c5d"},
                ("ReplicaSet", "vllm-6d9f8b7c5d")),
    "DaemonSet": ("vllm-x2x9k", {"pod-template-generation": "1"}, ("DaemonSet", "vllm")),
    "unknown": ("vllm", {}, None),  # a bare pod: its own workload, named after it
}  # fmt: skip
KINDS = sorted(PODS)


def _pod(kind: str, *, owner: bool = True, ip: str | None = None, t: float = 0.0) -> Signal:
    """A pod's signal: its pod object (owner, labels, IP) or, ``owner=False``, a container
    log line as a log shipper tags it (labels only)."""
    name, labels, ref = PODS[kind]
    return Signal(
        SignalKind.POD_READY,
        T0 + t,
        SRC,
        "llm",
        name,
        labels=labels,
        owner=ref if owner else None,
        attrs={"pod_ip": ip} if ip else {},
    )


def _line(upstream: str, t: float = 0.0, status: int = 503, addr: str = "10.0.1.21:8000") -> Signal:
    attrs = {"status": status, "upstream": upstream, "upstream_addr": addr}
    return Signal(SignalKind.LB_RESPONSE, T0 + t, SRC, "ingress-nginx", attrs=attrs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lines_first", [False, True], ids=["pods-first", "lines-first"])
def test_the_upstream_name_names_the_pods_workload(kind: str, lines_first: bool) -> None:
    resolver = WorkloadResolver()
    before = resolver.resolve(_line("llm-vllm-8000")) if lines_first else None
    pod = resolver.resolve(_pod(kind))
    line = resolver.resolve(_line("llm-vllm-8000"))
    assert pod is not None and line is pod  # one object: the correlator's state is one
    assert (pod.namespace, pod.name, pod.kind) == ("llm", "vllm", kind)
    if before is not None:  # a guess until a pod named the kind: the same workload
        assert before.kind == "Deployment" and before == pod
    # a pod seen again only by name (a GPU metric) keeps the kind its controller gave
    assert resolver.resolve(replace(_pod(kind), labels={}, owner=None)) is pod


@pytest.mark.parametrize("kind", KINDS)
def test_the_workloads_file_names_the_pods_workload(kind: str) -> None:
    mapping = WorkloadMap(upstreams={"gw-llama": UpstreamMapping(namespace="llm", workload="vllm")})
    resolver = WorkloadResolver(mapping)
    first = resolver.resolve(_line("gw-llama"))  # before any pod: "Deployment", then revised
    pod = resolver.resolve(_pod(kind))
    assert first == pod and resolver.resolve(_line("gw-llama")) is pod
    assert pod is not None and pod.kind == kind


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("source", ["pod-ip", "endpointslice"])
def test_the_upstream_address_names_the_pods_workload(kind: str, source: str) -> None:
    """The upstream's name says nothing (Envoy Gateway's route): its pod IP does, from the pod
    object's ``status.podIP`` or an EndpointSlice endpoint naming the pod."""
    resolver = WorkloadResolver()
    if source == "pod-ip":
        pod = resolver.resolve(_pod(kind, ip="10.0.1.21"))
    else:  # a log line tagged with the pod's labels, then the slice: pod name and address
        pod = resolver.resolve(_pod(kind, owner=False))
        address = {"pod_ip": "10.0.1.21"}
        endpoint = Signal(SignalKind.POD_ADDRESS, T0, SRC, "llm", PODS[kind][0], attrs=address)
        assert resolver.resolve(endpoint) is pod
    line = resolver.resolve(_line("httproute/llm/vllm/rule/0"))
    assert pod is not None and line is pod and pod.kind == kind


def test_a_daemonset_pod_is_told_by_its_labels() -> None:
    labels = {"pod-template-generation": "3", "controller-revision-hash": "5c9d8b7f6"}
    assert workload_of_pod("node-exporter-x2x9k", labels, None) == ("DaemonSet", "node-exporter")
    assert workload_of_pod("node-exporter-x2x9k", {}, None) == ("unknown", "node-exporter-x2x9k")


def _oom(pod: str, t: float, labels: dict[str, str]) -> Signal:
    attrs = {"framework": "pytorch", "bytes_tried": 2 << 30}
    return Signal(SignalKind.GPU_OOM, T0 + t, SRC, "llm", pod, "vllm", labels=labels, attrs=attrs)


def test_lines_seen_before_a_statefulsets_pods_join_its_incident() -> None:
    """The 5xx surge starts before any pod of the StatefulSet is seen (the gateway's stream
    ahead of the logs): the workload's state is the same once a pod names its kind, so the
    incident opened by the GPU OOM carries the surge, and no "failing upstream" verdict."""
    corr = Correlator(CorrelateSettings())
    lines = [_line("llm-vllm-8000", i / 10, 200 if i < 100 else 503) for i in range(200)]
    labels = {"statefulset.kubernetes.io/pod-name": "vllm-0"}
    out = corr.observe_all([*lines, _oom("vllm-0", 20, labels), _oom("vllm-1", 25, labels)])
    out += corr.observe_all([_line("llm-vllm-8000", 20 + i / 10) for i in range(400)])
    (ws,) = corr.workloads.values()
    assert (ws.ref.kind, next(iter(corr.workloads)).kind) == ("StatefulSet", "StatefulSet")
    (opened,) = [d for d in out if isinstance(d, IncidentOpened)]
    assert opened.workload.kind == "StatefulSet"
    kinds = {d.kind for d in out if isinstance(d, EvidenceAdded)}
    assert {"gpu_oom", "lb_errors"} <= kinds
    assert not [d for d in out if isinstance(d, VerdictRecorded)]
    ctx = corr.context(opened.key)
    assert ctx is not None and ctx.workload_kind == "StatefulSet"


def test_a_bare_pods_workload_stays_while_its_upstream_has_lines() -> None:
    """A bare pod is forgotten with its pod, but not while its upstream's lines still come
    (they would start a new window at every look for idle pods)."""
    corr = Correlator(CorrelateSettings(window_s=60))
    corr.observe(_pod("unknown"))
    corr.observe_all([_line("llm-vllm-8000", t, 200) for t in range(1, 300)])
    (ws,) = corr.workloads.values()
    assert ws.ref.kind == "unknown" and not ws.pods and ws.lb.total > 0
