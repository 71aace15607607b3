"""Map a signal to the workload it belongs to (cluster, namespace, Deployment/StatefulSet).

Rules, in order:
1. load-balancer signals: the upstream's pod IP (``upstream_addr``: ingress-nginx
   ``$upstream_addr``, Envoy ``%UPSTREAM_HOST%``) when a pod object seen earlier had that
   ``status.podIP``, or an EndpointSlice endpoint with that address and its pod as ``targetRef``
   (``pod_ip`` attr): that pod's workload, whatever the upstream is named
   (Envoy Gateway ``httproute/<ns>/<route>/rule/<n>``, Istio ``outbound|<port>||<host>``);
   else the upstream name, through the YAML mapping, else the ingress-nginx convention
   ``<namespace>-<service>-<port>`` with the service named after the workload; a name names
   a workload, not its controller's kind: it is the workload of that namespace and name
   whatever controller its pods name (StatefulSet, Rollout, LeaderWorkerSet, DaemonSet, a
   bare pod), and "Deployment" only until a pod names the kind (``BY_UPSTREAM``);
   a line logged by the serving pod's own sidecar proxy (``sidecar``) names its pod instead;
2. labels that name the top controller, above the pod's immediate owner: a LeaderWorkerSet
   (``leaderworkerset.sigs.k8s.io/name``; its pods are owned by StatefulSets, one per group),
   a KServe InferenceService (``serving.kserve.io/inferenceservice``), a KubeRay RayCluster
   (``ray.io/cluster``) and an Argo Rollout (``rollouts-pod-template-hash``; its pods are
   owned by ReplicaSets);
3. ownerReferences: a ReplicaSet ``<deployment>-<pod-template-hash>``, else the owner itself
   (StatefulSet, Job, a custom resource), except a Node (a static pod's mirror);
4. well-known labels: ``pod-template-hash`` (Deployment), ``statefulset.kubernetes.io/pod-name``,
   ``pod-template-generation`` with a ``<daemonset>-<5 chars>`` name (DaemonSet);
5. the pod name's hash suffixes: ``<deployment>-<rs hash>-<5 chars>`` or ``<statefulset>-<n>``.
A pod's workload is cached with the rule that named it; a later signal of the pod that an
earlier rule names (ownerReferences or a controller label arriving after a GPU metric named
only the pod) revises it, and ``resolve`` says so (``take_revision``): the correlator then
moves the pod's state from the old workload to the new one.
A workload is its cluster, namespace and name, as its incident key, the mapping file and the
armed workloads name it (``WorkloadRef`` compares no kind): the resolver holds one object per
workload, with the kind the most authoritative rule named so far; a better rule naming
another kind replaces that object wherever the resolver holds it, and the correlator follows
(its state of the workload is the same, under the new kind).
Sources: https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#pod-template-hash-label,
https://lws.sigs.k8s.io/docs/reference/labels-annotations-and-environment-variables/,
https://argo-rollouts.readthedocs.io/en/stable/features/specification/ (rollouts-pod-template-hash),
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus (podIP)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from detector.config import WorkloadMap
from detector.events.model import Signal, SignalKind

# ReplicaSet hashes and pod suffixes use Kubernetes' "safe" alphabet (no vowels, no 0/1/3).
_DEPLOYMENT_POD = re.compile(r"^(?P<name>.+)-[bcdfghjklmnpqrstvwxz2456789]{5,10}-[a-z0-9]{5}$")
_STATEFULSET_POD = re.compile(r"^(?P<name>.+)-\d+$")
_RS_NAME = re.compile(r"^(?P<name>.+)-[bcdfghjklmnpqrstvwxz2456789]{5,10}$")
_DAEMONSET_POD = re.compile(r"^(?P<name>.+)-[bcdfghjklmnpqrstvwxz2456789]{5}$")
_SERVICE_PORT = re.compile(r"^(?P<svc>[a-z0-9-]+)-(?:\d+|[a-z][a-z0-9]*)$")
_UPSTREAM = re.compile(r"^(?P<ns>[a-z0-9-]+?)-(?P<svc>[a-z0-9-]+)-(?P<port>\d+|[a-z]+)$")
_UNSEEN: Any = object()  # an upstream not looked up yet (None is a cached "no workload")
# How authoritative the rule that named a pod's workload is (rules 5, 4, 3, 2 above); an
# upstream's name (rule 1) names the workload but not its kind: under every pod rule
BY_UPSTREAM, BY_NAME, BY_LABEL, BY_OWNER, BY_CONTROLLER_LABEL = -1, 0, 1, 2, 3
_LB = SignalKind.LB_RESPONSE


@dataclass(frozen=True, slots=True)
class WorkloadRef:
    """A workload: the unit one incident is about.

    Equal and hashed by cluster, namespace and name, as the incident key names it; ``kind``
    (Deployment | StatefulSet | Rollout | LeaderWorkerSet | DaemonSet | ... | unknown) is what
    the best source seen said of its controller, and is no part of its identity.
    """

    namespace: str
    name: str
    kind: str = field(default="Deployment", compare=False)
    cluster: str | None = None

    @property
    def label(self) -> str:
        """Return ``[cluster/]namespace/name`` for reports."""
        prefix = f"{self.cluster}/" if self.cluster else ""
        return f"{prefix}{self.namespace}/{self.name}"


class WorkloadResolver:
    """Resolve signals to workloads, caching per pod, per pod IP and per upstream name."""

    def __init__(self, mapping: WorkloadMap | None = None, cluster: str | None = None) -> None:
        self._mapping = mapping or WorkloadMap()
        self._cluster = cluster
        self._pods: dict[tuple[str, str], tuple[WorkloadRef, int]] = {}  # -> (ref, authority)
        self._ips: dict[str, tuple[str, str]] = {}  # pod IP -> (namespace, pod), the latest
        self._pod_ips: dict[tuple[str, str], str] = {}  # (namespace, pod) -> its pod IP
        self._upstreams: dict[str, WorkloadRef | None] = {}
        self._namespaces: set[str] = set()
        # one object per workload -> (it, the authority of the rule that named its kind)
        self._refs: dict[WorkloadRef, tuple[WorkloadRef, int]] = {}
        # (pod, the workload it resolved to before) of the last resolve that revised a pod
        self.revised: tuple[str, WorkloadRef] | None = None

    @property
    def cached_pods(self) -> int:
        """Return how many pods the cache holds."""
        return len(self._pods)

    @property
    def cached_ips(self) -> int:
        """Return how many pod IPs the cache holds (at most one per cached pod)."""
        return len(self._ips)

    def forget(self, namespace: str, pod: str, ref: WorkloadRef | None = None) -> None:
        """Drop ``pod`` and its IP from the cache (a pod gone idle); its next signal resolves
        it anew. With ``ref``, only while the pod still resolves to ``ref`` (a pod revised to
        another workload is not forgotten by the old one)."""
        key = (namespace, pod)
        cached = self._pods.get(key)
        if cached is None or (ref is not None and cached[0] != ref):
            return
        del self._pods[key]
        ip = self._pod_ips.pop(key, None)
        if ip is not None and self._ips.get(ip) == key:
            del self._ips[ip]

    def ip_of(self, namespace: str, pod: str) -> str | None:
        """Return the pod's IP as its pod object last gave it, or None when unknown."""
        return self._pod_ips.get((namespace, pod))

    def take_revision(self) -> tuple[str, WorkloadRef] | None:
        """Return and clear ``(pod, old workload)`` when a ``resolve`` revised a pod's workload."""
        revised, self.revised = self.revised, None
        return revised

    def forget_workload(self, ref: WorkloadRef) -> None:
        """Drop a workload no cached pod resolves to any more (an ``unknown`` one-pod one),
        and the upstreams cached to it: their next line names the workload anew."""
        self._refs.pop(ref, None)
        for upstream in [u for u, r in self._upstreams.items() if r == ref]:
            del self._upstreams[upstream]

    def resolve(self, signal: Signal) -> WorkloadRef | None:
        """Return the signal's workload, or None when it names none."""
        if signal.kind is _LB and not signal.attrs.get("sidecar"):
            if self._ips and (ref := self._by_address(signal.attrs.get("upstream_addr"))):
                return ref
            upstream = signal.attrs.get("upstream")
            return self.for_upstream(upstream) if upstream else None
        if not signal.namespace or not signal.pod:
            return None
        key = (signal.namespace, signal.pod)
        cached = self._pods.get(key)
        if cached is None:
            if signal.namespace not in self._namespaces:
                self._namespaces.add(signal.namespace)
                self._upstreams.clear()  # a newly seen namespace can change a split
            ref = self._pod_ref(signal, key)
        elif cached[1] < BY_CONTROLLER_LABEL and (signal.owner is not None or signal.labels):
            ref = self._pod_ref(signal, key, cached)
        else:
            ref = cached[0]
        ip = signal.attrs.get("pod_ip")
        if ip and self._pod_ips.get(key) != ip:
            self._learn_ip(key, ip)
        return ref

    def for_upstream(self, upstream: str) -> WorkloadRef | None:
        """Map an upstream name to its workload: the YAML mapping first, then the convention.

        The name gives a namespace and a workload name: the workload of that name whatever
        its controller (the kind its pods named; "Deployment" until one does).
        """
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
            ref = self._intern(ref, BY_UPSTREAM)
        self._upstreams[upstream] = ref
        return ref

    def _pod_ref(
        self,
        signal: Signal,
        key: tuple[str, str],
        cached: tuple[WorkloadRef, int] | None = None,
    ) -> WorkloadRef:
        """Name the pod's workload from this signal; keep a cached one named by a better rule."""
        pod = key[1]
        kind, name, authority = classify_pod(pod, signal.labels, signal.owner)
        if cached is not None and authority <= cached[1]:
            return cached[0]
        named = WorkloadRef(key[0], name, kind, signal.cluster or self._cluster)
        ref = self._intern(named, authority)
        self._pods[key] = (ref, authority)
        if cached is not None and cached[0] != ref:  # another workload, not another kind
            self.revised = (pod, cached[0])
        return ref

    def _learn_ip(self, key: tuple[str, str], ip: str) -> None:
        """Remember ``ip`` as the pod's (a newer pod with a reused IP takes it over)."""
        old = self._pod_ips.get(key)
        if old is not None and self._ips.get(old) == key:
            del self._ips[old]
        self._pod_ips[key] = ip
        self._ips[ip] = key

    def _by_address(self, addr: Any) -> WorkloadRef | None:
        """Return the workload of the pod whose IP ``addr`` (``ip:port``, ``[ipv6]:port``) is."""
        if not isinstance(addr, str) or not addr:
            return None
        key = self._ips.get(host_of_address(addr))
        cached = self._pods.get(key) if key is not None else None
        return cached[0] if cached is not None else None

    def _intern(self, ref: WorkloadRef, authority: int) -> WorkloadRef:
        """Return the one object of the workload ``ref`` names (dict lookups then match by
        identity), with the kind the most authoritative rule named: ``ref``'s when its rule
        (``authority``) is better than the one that named the kind held, which it replaces."""
        held = self._refs.get(ref)
        if held is None:
            self._refs[ref] = (ref, authority)
            return ref
        known, named_by = held
        if known.kind == ref.kind or authority <= named_by:
            if authority > named_by:
                self._refs[known] = (known, authority)
            return known
        self._refs[ref] = (ref, authority)
        for key, (cached, by) in self._pods.items():
            if cached is known:
                self._pods[key] = (ref, by)
        for upstream, cached_ref in self._upstreams.items():
            if cached_ref is known:
                self._upstreams[upstream] = ref
        return ref

    def _by_convention(self, upstream: str) -> WorkloadRef | None:
        """Split ``<namespace>-<service>-<port>``, preferring the longest namespace seen."""
        for ns in sorted(self._namespaces, key=len, reverse=True):
            rest = upstream[len(ns) + 1 :] if upstream.startswith(f"{ns}-") else ""
            if m := _SERVICE_PORT.match(rest):
                return WorkloadRef(ns, m["svc"], "Deployment", self._cluster)
        if m := _UPSTREAM.match(upstream):
            return WorkloadRef(m["ns"], m["svc"], "Deployment", self._cluster)
        return None


def host_of_address(addr: str) -> str:
    """Return the host of ``ip:port`` or ``[ipv6]:port``; a bare address as is."""
    if addr[:1] == "[":
        end = addr.find("]")
        return addr[1:end] if end > 0 else addr
    host, sep, _ = addr.rpartition(":")
    return host if sep and ":" not in host else addr


def workload_of_pod(
    pod: str, labels: dict[str, str], owner: tuple[str, str] | None
) -> tuple[str, str]:
    """Return ``(kind, name)`` of the controller owning ``pod``; ``("unknown", pod)`` if none."""
    kind, name, _ = classify_pod(pod, labels, owner)
    return kind, name


# Labels naming the top controller a pod serves (one model endpoint), above its immediate
# owner: https://lws.sigs.k8s.io/docs/reference/labels-annotations-and-environment-variables/,
# https://kserve.github.io/website/ (serving.kserve.io/inferenceservice on predictor pods),
# https://docs.ray.io/en/latest/cluster/kubernetes/ (ray.io/cluster on KubeRay pods).
_CONTROLLER_LABELS = (
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("serving.kserve.io/inferenceservice", "InferenceService"),
    ("ray.io/cluster", "RayCluster"),
)


def classify_pod(
    pod: str, labels: dict[str, str], owner: tuple[str, str] | None
) -> tuple[str, str, int]:
    """Return ``(kind, name, authority)`` of ``pod``'s controller (``BY_NAME`` ...
    ``BY_CONTROLLER_LABEL``: which rule of the module docstring named it)."""
    for label, kind in _CONTROLLER_LABELS:
        if name := labels.get(label):
            return kind, name, BY_CONTROLLER_LABEL
    rollout_hash = labels.get("rollouts-pod-template-hash")
    if rollout_hash and f"-{rollout_hash}-" in pod:
        return "Rollout", pod.rsplit(f"-{rollout_hash}-", 1)[0], BY_CONTROLLER_LABEL
    if owner is not None:
        kind, name = owner
        if kind == "ReplicaSet":
            m = _RS_NAME.match(name)
            return ("Deployment", m["name"], BY_OWNER) if m else ("ReplicaSet", name, BY_OWNER)
        if kind != "Node":  # a static pod's mirror names its node: the pod's name decides
            return kind, name, BY_OWNER  # StatefulSet, Job, or a CRD (RayCluster ...) itself
    rs_hash = labels.get("pod-template-hash")
    if rs_hash and f"-{rs_hash}-" in pod:
        return "Deployment", pod.rsplit(f"-{rs_hash}-", 1)[0], BY_LABEL
    if "statefulset.kubernetes.io/pod-name" in labels and (m := _STATEFULSET_POD.match(pod)):
        return "StatefulSet", m["name"], BY_LABEL
    if "pod-template-generation" in labels and (m := _DAEMONSET_POD.match(pod)):
        return "DaemonSet", m["name"], BY_LABEL  # set on a DaemonSet's pods only
    if m := _DEPLOYMENT_POD.match(pod):
        return "Deployment", m["name"], BY_NAME
    if m := _STATEFULSET_POD.match(pod):
        return "StatefulSet", m["name"], BY_NAME
    return "unknown", pod, BY_NAME
