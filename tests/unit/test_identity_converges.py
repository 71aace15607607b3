"""Identity that converges: load-balancer lines by the upstream pod IP, pods revised by a
better source seen later (issue 11, item 6).

The load-balancer lines are real, as published (sources beside each); the pod objects are
built here in the shape of ``kubectl get pod -o json``, with the IP the line names.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from detector.config import CorrelateSettings
from detector.correlate.correlator import Correlator
from detector.correlate.identity import (
    BY_CONTROLLER_LABEL,
    BY_NAME,
    BY_OWNER,
    WorkloadRef,
    WorkloadResolver,
    classify_pod,
    host_of_address,
)
from detector.events.detect import parse_record
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.k8s_pod import signals_from_pod

SRC = SourcePos("t", 1)

# Envoy Gateway: the cluster is the route, not a service.
# https://github.com/envoyproxy/gateway/issues/3643
ENVOY_GATEWAY = (
    '{"start_time":"2024-06-21T01:32:10.407Z","method":"GET","x-envoy-origin-path":"/",'
    '"protocol":"HTTP/1.1","response_code":"200","response_flags":"-",'
    '"response_code_details":"via_upstream","connection_termination_details":"-",'
    '"upstream_transport_failure_reason":"-","bytes_received":"0","bytes_sent":"194711",'
    '"duration":"71","x-envoy-upstream-service-time":"-","x-forwarded-for":"10.233.64.190",'
    '"user-agent":"curl/7.88.1","x-request-id":"5c934668-8c15-48bc-8527-2d2534438ebe",'
    '":authority":"192.168.2.132","upstream_host":"10.233.65.168:8080",'
    '"upstream_cluster":"httproute/default/moon-svc/rule/0",'
    '"upstream_local_address":"10.233.64.79:59712",'
    '"downstream_local_address":"10.233.64.79:10080",'
    '"downstream_remote_address":"10.233.64.190:52808","requested_server_name":"-",'
    '"route_name":"httproute/default/moon-svc/rule/0/match/0/*"}'
)
# Istio sidecar (text format, pasted without its [%START_TIME%]): the service is
# health-api, the pod at 10.80.47.192 belongs to the Deployment health-api-v2.
# https://github.com/istio/istio/issues/45802
ISTIO = (
    '"GET /v1/status HTTP/1.1" 503 UC upstream_reset_before_response_started'
    '{connection_termination} - "-" 0 95 0 - "10.90.16.220" '
    '"Apache-HttpClient/4.5.1 (Java/1.8.0_372)" "3a7cbcc1-af72-47fb-bbac-a7672951f50f" '
    '"health.abc.com" "10.80.47.192:8181" outbound|80||health-api.production.svc.cluster.local '
    "10.80.45.233:37132 10.80.45.233:80 10.80.46.220:59375 - -"
)
# ingress-nginx upstreaminfo with three tries; the last one's address is the pod's.
# https://github.com/kubernetes/ingress-nginx/issues/9443
INGRESS_NGINX = (
    '203.0.113.25 - - [08/Mar/2023:16:02:45 +0000] "GET / HTTP/1.1" 504 562 "-" '
    '"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) '
    'Chrome/109.0.0.0 Safari/537.36" 1100 14.998 [pc-dev-example-web-service-80] [] '
    "192.168.215.1:80, 192.168.215.1:80, 192.168.215.1:80 0, 0, 0 5.000, 5.000, 5.000 "
    "504, 504, 504 a7c98d98ac870f64981a997cd2f373a1"
)


def _pod(
    namespace: str,
    name: str,
    ip: str | None,
    owner: tuple[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Return a Running, Ready pod object (it yields one POD_READY signal)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    status: dict[str, Any] = {
        "phase": "Running",
        "startTime": "2024-06-21T01:00:00Z",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2024-06-21T01:01:00Z"}
        ],
        "containerStatuses": [{"name": "server", "ready": True, "restartCount": 0}],
    }
    if ip is not None:
        status["podIP"] = ip
    return {"kind": "Pod", "metadata": meta, "spec": {"nodeName": "gpu-1"}, "status": status}


def _pod_signal(pod: dict[str, Any]) -> Signal:
    (sig,) = signals_from_pod(pod, SRC)
    return sig


def _lb(text: str) -> Signal:
    (sig,) = parse_record(text, SRC, default_time=1.0)
    assert sig.kind is SignalKind.LB_RESPONSE
    return sig


def _gpu_metric(namespace: str, pod: str, time: float = 2.0) -> Signal:
    """A GPU reading that names only the pod (DCGM's exported pod label): no owner, no labels."""
    return Signal(
        kind=SignalKind.GPU_MEMORY,
        time=time,
        source=SRC,
        namespace=namespace,
        pod=pod,
        attrs={"used_bytes": 70 << 30, "total_bytes": 80 << 30, "gpu": 0},
        text="dcgm",
    )


MOON = _pod("default", "moon-6f7d9c8b5d-kx2lp", "10.233.65.168", ("ReplicaSet", "moon-6f7d9c8b5d"))
HEALTH = _pod(
    "production",
    "health-api-v2-5b8c7d9f4-q2wzx",
    "10.80.47.192",
    ("ReplicaSet", "health-api-v2-5b8c7d9f4"),
)
WEB = _pod(
    "pc-dev",
    "example-web-6c9d8b7f5-zz8pq",
    "192.168.215.1",
    ("ReplicaSet", "example-web-6c9d8b7f5"),
)


def test_pod_object_carries_its_ip() -> None:
    assert _pod_signal(MOON).attrs["pod_ip"] == "10.233.65.168"
    assert "pod_ip" not in _pod_signal(_pod("default", "moon-0", None)).attrs


def test_host_network_pod_ip_is_its_nodes_and_not_carried() -> None:
    """A hostNetwork pod (a node exporter) has the node's IP: an ALB/NodePort upstream at that
    IP is not that pod."""
    host_net = _pod("monitoring", "dcgm-exporter-x7k2p", "10.0.1.5", ("DaemonSet", "dcgm"))
    host_net["spec"]["hostNetwork"] = True
    assert "pod_ip" not in _pod_signal(host_net).attrs
    del host_net["spec"]["hostNetwork"]
    host_net["status"]["hostIP"] = "10.0.1.5"
    assert "pod_ip" not in _pod_signal(host_net).attrs


@pytest.mark.parametrize(
    ("line", "pod", "by_ip", "fallback"),
    [
        (ENVOY_GATEWAY, MOON, "default/moon", None),
        (ISTIO, HEALTH, "production/health-api-v2", "production/health-api"),
        (INGRESS_NGINX, WEB, "pc-dev/example-web", "pc/dev-example-web-service"),  # guessed split
    ],
    ids=["envoy-gateway-httproute", "istio-outbound", "ingress-nginx"],
)
def test_lb_line_goes_to_the_pod_at_its_upstream_address(
    line: str, pod: dict[str, Any], by_ip: str, fallback: str | None
) -> None:
    without = WorkloadResolver()
    ref = without.resolve(_lb(line))
    assert (ref.label if ref else None) == fallback  # as before: the name, or nothing
    resolver = WorkloadResolver()
    resolver.resolve(_pod_signal(pod))
    ref = resolver.resolve(_lb(line))
    assert ref is not None
    assert ref.label == by_ip
    assert ref.kind == "Deployment"
    assert ref is resolver.resolve(_pod_signal(pod))  # the very workload of the pod's signals


def test_pod_ip_comes_before_the_mapping_file() -> None:
    from detector.config import WorkloadMap

    mapping = WorkloadMap.model_validate(
        {"upstreams": {"httproute/default/moon-svc/rule/0": {"namespace": "x", "workload": "y"}}}
    )
    resolver = WorkloadResolver(mapping)
    ref = resolver.resolve(_lb(ENVOY_GATEWAY))
    assert ref is not None and ref.label == "x/y"  # no pod seen: the mapping
    resolver.resolve(_pod_signal(MOON))
    ref = resolver.resolve(_lb(ENVOY_GATEWAY))
    assert ref is not None and ref.label == "default/moon"


def test_forgotten_pod_takes_its_ip_along() -> None:
    resolver = WorkloadResolver()
    ref = resolver.resolve(_pod_signal(MOON))
    assert ref is not None and resolver.cached_ips == 1
    resolver.forget("default", "moon-6f7d9c8b5d-kx2lp", ref)
    assert resolver.cached_ips == resolver.cached_pods == 0
    assert resolver.resolve(_lb(ENVOY_GATEWAY)) is None  # back to the route name: no workload


def test_reused_ip_belongs_to_the_newer_pod() -> None:
    resolver = WorkloadResolver()
    old = resolver.resolve(_pod_signal(MOON))
    newer = _pod("default", "sun-7d9f8b6c5d-abcde", "10.233.65.168", ("StatefulSet", "sun"))
    new = resolver.resolve(_pod_signal(newer))
    assert new is not None and new.label == "default/sun"
    assert resolver.resolve(_lb(ENVOY_GATEWAY)) is new
    assert old is not None
    resolver.forget("default", "moon-6f7d9c8b5d-kx2lp", old)  # the old pod goes idle
    assert resolver.resolve(_lb(ENVOY_GATEWAY)) is new
    assert resolver.cached_ips == 1


def test_sidecar_line_still_names_its_own_pod() -> None:
    resolver = WorkloadResolver()
    resolver.resolve(_pod_signal(MOON))
    sidecar = Signal(
        kind=SignalKind.LB_RESPONSE,
        time=1.0,
        source=SRC,
        namespace="default",
        pod="other-0",
        attrs={"status": 503, "sidecar": True, "upstream_addr": "10.233.65.168:8080"},
        text="inbound",
    )
    ref = resolver.resolve(sidecar)
    assert ref is not None and ref.label == "default/other"


@pytest.mark.parametrize(
    ("addr", "host"),
    [
        ("10.0.2.39:8000", "10.0.2.39"),
        ("[fd00:10:244::7]:8000", "fd00:10:244::7"),
        ("fd00:10:244::7", "fd00:10:244::7"),
        ("10.0.2.39", "10.0.2.39"),
    ],
)
def test_host_of_address(addr: str, host: str) -> None:
    assert host_of_address(addr) == host


def test_ipv6_pod_ip() -> None:
    resolver = WorkloadResolver()
    resolver.resolve(_pod_signal(_pod("llm", "vllm-0", "fd00:10:244::7", ("StatefulSet", "vllm"))))
    line = ENVOY_GATEWAY.replace("10.233.65.168:8080", "[fd00:10:244::7]:8080")
    ref = resolver.resolve(_lb(line))
    assert ref is not None and ref.label == "llm/vllm"


# --- a better source seen later revises the pod's workload ---


def test_authority_order_of_the_rules() -> None:
    assert classify_pod("vllm-lws-0-1", {}, None) == ("StatefulSet", "vllm-lws-0", BY_NAME)
    owner = ("StatefulSet", "vllm-lws-0")
    assert classify_pod("vllm-lws-0-1", {}, owner) == ("StatefulSet", "vllm-lws-0", BY_OWNER)
    lws = {"leaderworkerset.sigs.k8s.io/name": "vllm-lws"}
    assert classify_pod("vllm-lws-0-1", lws, owner)[2] == BY_CONTROLLER_LABEL


def test_lws_pods_first_seen_by_gpu_metrics_converge_on_one_workload() -> None:
    """A leader ``vllm-lws-0`` and its worker ``vllm-lws-0-1`` look like two StatefulSets by
    name; their pod objects (label + owner StatefulSet per group) make them one LWS."""
    resolver = WorkloadResolver()
    leader = resolver.resolve(_gpu_metric("llm", "vllm-lws-0"))
    worker = resolver.resolve(_gpu_metric("llm", "vllm-lws-0-1"))
    assert leader is not None and worker is not None
    assert (leader.kind, leader.name, worker.name) == ("StatefulSet", "vllm-lws", "vllm-lws-0")
    labels = {"leaderworkerset.sigs.k8s.io/name": "vllm-lws"}
    for name, owner in (("vllm-lws-0", "vllm-lws"), ("vllm-lws-0-1", "vllm-lws-0")):
        resolver.resolve(_pod_signal(_pod("llm", name, None, ("StatefulSet", owner), labels)))
    leader = resolver.resolve(_gpu_metric("llm", "vllm-lws-0"))
    worker = resolver.resolve(_gpu_metric("llm", "vllm-lws-0-1"))  # names only the pod again
    assert leader is worker
    assert worker == WorkloadRef("llm", "vllm-lws", "LeaderWorkerSet")


def test_bare_looking_pod_later_seen_with_its_owner() -> None:
    """``trainer`` names no controller (``unknown``); its pod object names the Job."""
    resolver = WorkloadResolver()
    first = resolver.resolve(_gpu_metric("ml", "trainer"))
    assert first is not None and first.kind == "unknown"
    resolver.resolve(_pod_signal(_pod("ml", "trainer", None, ("Job", "finetune"))))
    ref = resolver.resolve(_gpu_metric("ml", "trainer"))
    assert ref == WorkloadRef("ml", "finetune", "Job")


def test_rollout_pod_named_like_a_deployment_pod() -> None:
    resolver = WorkloadResolver()
    pod = "vllm-canary-5b8c7d9f4-kx2lp"
    first = resolver.resolve(_gpu_metric("llm", pod))
    assert first == WorkloadRef("llm", "vllm-canary", "Deployment")
    labels = {"rollouts-pod-template-hash": "5b8c7d9f4"}
    obj = _pod("llm", pod, None, ("ReplicaSet", "vllm-canary-5b8c7d9f4"), labels)
    resolver.resolve(_pod_signal(obj))
    assert resolver.resolve(_gpu_metric("llm", pod)) == WorkloadRef("llm", "vllm-canary", "Rollout")


def test_a_weaker_source_later_does_not_revise() -> None:
    resolver = WorkloadResolver()
    obj = _pod("llm", "vllm-0", None, ("StatefulSet", "vllm-pool"))
    ref = resolver.resolve(_pod_signal(obj))
    assert ref == WorkloadRef("llm", "vllm-pool", "StatefulSet")
    named = Signal(
        kind=SignalKind.GPU_MEMORY,
        time=3.0,
        source=SRC,
        namespace="llm",
        pod="vllm-0",
        labels={"statefulset.kubernetes.io/pod-name": "vllm-0"},  # rule 4: below the owner
        attrs={},
        text="",
    )
    assert resolver.resolve(named) is ref
    assert resolver.resolve(_gpu_metric("llm", "vllm-0")) is ref


def test_old_workload_going_idle_does_not_forget_the_revised_pod() -> None:
    resolver = WorkloadResolver()
    old = resolver.resolve(_gpu_metric("ml", "trainer"))
    new = resolver.resolve(_pod_signal(_pod("ml", "trainer", "10.1.2.3", ("Job", "finetune"))))
    assert old is not None and new is not None and old != new
    resolver.forget("ml", "trainer", old)  # the old workload's sweep
    assert resolver.cached_pods == 1 and resolver.cached_ips == 1
    assert resolver.resolve(_gpu_metric("ml", "trainer")) is new
    resolver.forget("ml", "trainer", new)
    assert resolver.cached_pods == 0 and resolver.cached_ips == 0


def test_correlator_follows_the_revision() -> None:
    corr = Correlator(CorrelateSettings())
    ready = _pod_signal(_pod("ml", "trainer", "10.1.2.3", ("Job", "finetune")))
    corr.observe(_gpu_metric("ml", "trainer", ready.time - 5))
    corr.observe(ready)
    corr.observe(_gpu_metric("ml", "trainer", ready.time + 5))
    job = WorkloadRef("ml", "finetune", "Job")
    assert "trainer" in corr.workloads[job].pods
    line = json.loads(ENVOY_GATEWAY)
    line["upstream_host"] = "10.1.2.3:8000"
    line["response_code"] = "503"
    line["start_time"] = "2024-06-21T01:01:10Z"
    corr.observe(_lb(json.dumps(line)))
    assert corr.resolver.resolve(_lb(json.dumps(line))) == job
