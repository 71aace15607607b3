"""The postmortem's autoscaling action item as a ready KEDA ``ScaledObject`` for the workload.

Prevention, as the design asks: scale the engine on its KV-cache usage and its queue, not on
CPU. Two Prometheus triggers on vLLM's own metrics, each sized from the incident:

- KV-cache usage, ``avg(vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)`` over the
  workload's pods (vLLM V1 renamed the gauge; either is read), target ``Value`` = the action
  item's threshold (halfway from the 95th percentile before the incident to the ceiling);
- queue, ``sum(vllm:num_requests_waiting)``, target ``AverageValue`` 1 per pod: vLLM queues a
  request only when its running batch is full, so any queue means the pods are saturated
  (the action item's "above 0").

``minReplicaCount`` is the pods the workload ran in the incident; ``maxReplicaCount`` =
ceil(pods x peak / healthy): the requests per minute it received at its peak over the most it
served while healthy (``checks.served_limit``), i.e. pods enough for the peak at the load a pod
carried healthily. ``scaleDown.stabilizationWindowSeconds`` = the incident's time to recover
(at most the API's 3600 s), so pods added for a burst stay until such a burst is over.
Sources: https://keda.sh/docs/2.13/reference/scaledobject-spec/ ,
https://keda.sh/docs/2.13/scalers/prometheus/ , https://docs.vllm.ai/en/latest/usage/metrics.html ,
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/horizontal-pod-autoscaler-v2/
(``behavior``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

KEDA_API_VERSION: Final = "keda.sh/v1alpha1"
# the Service prometheus-operator creates for every Prometheus ("prometheus-operated"), in
# kube-prometheus's namespace; ``detector postmortem --prometheus-url`` names another
DEFAULT_PROMETHEUS_URL: Final = "http://prometheus-operated.monitoring.svc:9090"
MAX_STABILIZATION_S: Final = 3600  # HPAScalingRules.stabilizationWindowSeconds at most
QUEUE_PER_POD: Final = "1"  # vLLM queues only when the batch is full: any queue is saturation
# controllers with a scale subresource the HPA can drive: kind -> apiVersion
SCALE_TARGETS: Final = {
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Rollout": "argoproj.io/v1alpha1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
}
# a Kubernetes object name (RFC 1123 label/subdomain): safe inside a PromQL label matcher
_K8S_NAME: Final = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
# a pod's name after its controller's name, per kind (Deployment: <rs hash>-<5 chars>)
_POD_SUFFIX: Final = {
    "Deployment": "-[a-z0-9]+-[a-z0-9]{5}",
    "StatefulSet": "-[0-9]+",
    "Rollout": "-[a-z0-9]+-[a-z0-9]{5}",
    "LeaderWorkerSet": "-[0-9]+(-[0-9]+)?",
}


@dataclass(frozen=True)
class Manifest:
    """A manifest to apply (``text``: YAML with a comment header) or why there is none."""

    filename: str
    text: str | None
    reason: str = ""


def autoscaling_manifest(
    content: Mapping[str, Any], sizing: Mapping[str, Any] | None, prometheus_url: str
) -> Manifest:
    """Return the KEDA ScaledObject of an incident's postmortem ``content`` (``analysis.analyse``).

    ``sizing``: ``checks.served_limit`` of the incident's load-balancer series (None without a
    healthy window). No manifest (``text`` None, with the reason) for a controller the HPA
    cannot scale (``SCALE_TARGETS``), for a workload whose names are not Kubernetes names (they
    go into PromQL), without the autoscaling action item, or without sizing.
    """
    incident = content.get("incident", {})
    kind = str(incident.get("workload_kind") or "")
    namespace, _, name = str(incident.get("workload") or "").partition("/")
    filename = f"scaledobject-{namespace}-{name}.yaml"
    item = next((i for i in content.get("action_items", []) if "threshold" in i), None)
    pods = len(incident.get("pods", []))
    if not (_K8S_NAME.fullmatch(namespace) and _K8S_NAME.fullmatch(name)):
        return Manifest("scaledobject.yaml", None, "the workload is not a Kubernetes name")
    if kind not in SCALE_TARGETS:
        return Manifest(filename, None, f"a {kind or 'unknown'} is not scaled by an HPA")
    if item is None or sizing is None or not pods or not sizing.get("limit_per_min"):
        return Manifest(filename, None, "no healthy load or KV-cache baseline was measured")
    peak, healthy = float(sizing["peak_per_min"]), float(sizing["limit_per_min"])
    most = max(pods, math.ceil(pods * peak / healthy))
    recover = content.get("impact", {}).get("time_to_recover_s")
    obj = scaled_object(
        namespace, name, kind, (pods, most), float(item["threshold"]), prometheus_url,
        math.ceil(min(float(recover), MAX_STABILIZATION_S)) if recover else None,
    )  # fmt: skip
    header = (
        f"# Autoscaling for {kind} {namespace}/{name}, sized by incident {incident.get('key')}:\n"
        f"# minReplicaCount {pods}: the pods it ran; maxReplicaCount {most} = ceil({pods} x "
        f"peak {peak:g}/min / healthy {healthy:g}/min)\n"
        f"# KV-cache target {item['threshold']}: {item.get('detail', '').split(';')[0]}\n"
    )
    return Manifest(filename, header + yaml.safe_dump(obj, sort_keys=False))


def scaled_object(
    namespace: str,
    name: str,
    kind: str,
    replicas: tuple[int, int],
    kv_cache_target: float,
    prometheus_url: str,
    scale_down_window_s: int | None,
) -> dict[str, Any]:
    """Return the ScaledObject as a dict: ``replicas`` (min, max), ``kv_cache_target`` 0..1.

    Raises KeyError for a ``kind`` not in ``SCALE_TARGETS``.
    """
    pods = f'namespace="{namespace}",pod=~"{name}{_POD_SUFFIX[kind]}"'
    kv = f"avg(vllm:kv_cache_usage_perc{{{pods}}} or vllm:gpu_cache_usage_perc{{{pods}}})"
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": SCALE_TARGETS[kind], "kind": kind, "name": name},
        "minReplicaCount": replicas[0],
        "maxReplicaCount": replicas[1],
    }
    if scale_down_window_s is not None:
        spec["advanced"] = {
            "horizontalPodAutoscalerConfig": {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": scale_down_window_s}}
            }
        }
    spec["triggers"] = [
        _prometheus("kv-cache-usage", "Value", kv, f"{kv_cache_target:g}", prometheus_url),
        _prometheus(
            "queue-waiting", "AverageValue", f"sum(vllm:num_requests_waiting{{{pods}}})",
            QUEUE_PER_POD, prometheus_url,
        ),
    ]  # fmt: skip
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def _prometheus(
    name: str, metric_type: str, query: str, threshold: str, server: str
) -> dict[str, Any]:
    """Return one KEDA ``prometheus`` trigger (metadata values are strings, as KEDA reads)."""
    return {
        "type": "prometheus",
        "name": name,
        "metricType": metric_type,
        "metadata": {"serverAddress": server, "query": query, "threshold": threshold},
    }
