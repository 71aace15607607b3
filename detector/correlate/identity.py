"""Map a signal to the workload it belongs to (cluster, namespace, Deployment/StatefulSet).

Rules, in order:
1. load-balancer signals: the upstream name, through the YAML mapping, else the ingress-nginx
   convention ``<namespace>-<service>-<port>`` with the service named after the workload;
   a line logged by the serving pod's own sidecar proxy (``sidecar``) names its pod instead;
2. labels that name the top controller, above the pod's immediate owner: a LeaderWorkerSet
   (``leaderworkerset.sigs.k8s.io/name``; its pods are owned by StatefulSets, one per group)
   and an Argo Rollout (``rollouts-pod-template-hash``; its pods are owned by ReplicaSets);
3. ownerReferences: a ReplicaSet ``<deployment>-<pod-template-hash>`` or a StatefulSet;
4. well-known labels: ``pod-template-hash`` (Deployment), ``statefulset.kubernetes.io/pod-name``;
5. the pod name's hash suffixes: ``<deployment>-<rs hash>-<5 chars>`` or ``<statefulset>-<n>``.
Sources: https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#pod-template-hash-label,
https://lws.sigs.k8s.io/docs/reference/labels-annotations-and-environment-variables/,
https://argo-rollouts.readthedocs.io/en/stable/features/specification/ (rollouts-pod-template-hash)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from detector.config import WorkloadMap
from detector.events.model import Signal, SignalKind

# ReplicaSet hashes and pod suffixes use Kubernetes' "safe" alphabet (no vowels, no 0/1/3).
_DEPLOYMENT_POD = re.compile(r"^(?P<name>.+)-[bcdfghjklmnpqrstvwxz2456789]{5,10}-[a-z0-9]{5}$")
_STATEFULSET_POD = re.compile(r"^(?P<name>.+)-\d+$")
_RS_NAME = re.compile(r"^(?P<name>.+)-[bcdfghjklmnpqrstvwxz2456789]{5,10}$")
_SERVICE_PORT = re.compile(r"^(?P<svc>[a-z0-9-]+)-(?:\d+|[a-z][a-z0-9]*)$")
_UPSTREAM = re.compile(r"^(?P<ns>[a-z0-9-]+?)-(?P<svc>[a-z0-9-]+)-(?P<port>\d+|[a-z]+)$")
_UNSEEN: Any = object()  # an upstream not looked up yet (None is a cached "no workload")


@dataclass(frozen=True, slots=True)
class WorkloadRef:
    """A workload: the unit one incident is about."""

    namespace: str
    name: str
    kind: str = "Deployment"  # Deployment | StatefulSet | Rollout | LeaderWorkerSet | unknown
    cluster: str | None = None

    @property
    def label(self) -> str:
        """Return ``[cluster/]namespace/name`` for reports."""
        prefix = f"{self.cluster}/" if self.cluster else ""
        return f"{prefix}{self.namespace}/{self.name}"


class WorkloadResolver:
    """Resolve signals to workloads, caching per pod and per upstream name."""

    def __init__(self, mapping: WorkloadMap | None = None, cluster: str | None = None) -> None:
        self._mapping = mapping or WorkloadMap()
        self._cluster = cluster
        self._pods: dict[tuple[str, str], WorkloadRef] = {}
        self._upstreams: dict[str, WorkloadRef | None] = {}
        self._namespaces: set[str] = set()
        self._refs: dict[WorkloadRef, WorkloadRef] = {}  # one object per workload

    @property
    def cached_pods(self) -> int:
        """Return how many pods the cache holds."""
        return len(self._pods)

    def forget(self, namespace: str, pod: str) -> None:
        """Drop ``pod`` from the cache (a pod gone idle); its next signal resolves it anew."""
        self._pods.pop((namespace, pod), None)

    def forget_workload(self, ref: WorkloadRef) -> None:
        """Drop a workload no cached pod resolves to any more (an ``unknown`` one-pod one)."""
        self._refs.pop(ref, None)

    def resolve(self, signal: Signal) -> WorkloadRef | None:
        """Return the signal's workload, or None when it names none."""
        if signal.kind is SignalKind.LB_RESPONSE and not signal.attrs.get("sidecar"):
            upstream = signal.attrs.get("upstream")
            return self.for_upstream(upstream) if upstream else None
        if not signal.namespace or not signal.pod:
            return None
        key = (signal.namespace, signal.pod)
        ref = self._pods.get(key)
        if ref is None:
            if signal.namespace not in self._namespaces:
                self._namespaces.add(signal.namespace)
                self._upstreams.clear()  # a newly seen namespace can change a split
            kind, name = workload_of_pod(signal.pod, signal.labels, signal.owner)
            ref = self._intern(
                WorkloadRef(signal.namespace, name, kind, signal.cluster or self._cluster)
            )
            self._pods[key] = ref
        return ref

    def for_upstream(self, upstream: str) -> WorkloadRef | None:
        """Map an upstream name to its workload: the YAML mapping first, then the convention."""
        ref = self._upstreams.get(upstream, _UNSEEN)
        if ref is not _UNSEEN:
            return ref
        ref = None
        mapped = self._mapping.upstreams.get(upstream)
        if mapped is not None:
            ref = WorkloadRef(mapped.namespace, mapped.workload, "Deployment", self._cluster)
        elif upstream != "upstream-default-backend":
            ref = self._by_convention(upstream)
        if ref is not None:
            ref = self._intern(ref)
        self._upstreams[upstream] = ref
        return ref

    def _intern(self, ref: WorkloadRef) -> WorkloadRef:
        """Return the one object of an equal workload: dict lookups then match by identity."""
        return self._refs.setdefault(ref, ref)

    def _by_convention(self, upstream: str) -> WorkloadRef | None:
        """Split ``<namespace>-<service>-<port>``, preferring the longest namespace seen."""
        for ns in sorted(self._namespaces, key=len, reverse=True):
            rest = upstream[len(ns) + 1 :] if upstream.startswith(f"{ns}-") else ""
            if m := _SERVICE_PORT.match(rest):
                return WorkloadRef(ns, m["svc"], "Deployment", self._cluster)
        if m := _UPSTREAM.match(upstream):
            return WorkloadRef(m["ns"], m["svc"], "Deployment", self._cluster)
        return None


def workload_of_pod(
    pod: str, labels: dict[str, str], owner: tuple[str, str] | None
) -> tuple[str, str]:
    """Return ``(kind, name)`` of the controller owning ``pod``; ``("unknown", pod)`` if none."""
    if lws := labels.get("leaderworkerset.sigs.k8s.io/name"):
        return "LeaderWorkerSet", lws
    rollout_hash = labels.get("rollouts-pod-template-hash")
    if rollout_hash and f"-{rollout_hash}-" in pod:
        return "Rollout", pod.rsplit(f"-{rollout_hash}-", 1)[0]
    if owner is not None:
        kind, name = owner
        if kind == "ReplicaSet":
            m = _RS_NAME.match(name)
            return ("Deployment", m["name"]) if m else ("ReplicaSet", name)
        if kind in ("StatefulSet", "Deployment", "DaemonSet", "Job"):
            return kind, name
    rs_hash = labels.get("pod-template-hash")
    if rs_hash and f"-{rs_hash}-" in pod:
        return "Deployment", pod.rsplit(f"-{rs_hash}-", 1)[0]
    if "statefulset.kubernetes.io/pod-name" in labels and (m := _STATEFULSET_POD.match(pod)):
        return "StatefulSet", m["name"]
    if m := _DEPLOYMENT_POD.match(pod):
        return "Deployment", m["name"]
    if m := _STATEFULSET_POD.match(pod):
        return "StatefulSet", m["name"]
    return "unknown", pod
