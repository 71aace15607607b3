"""The recorder: seeded identities, pods and their container runs, and the wire envelopes.

Envelopes, one JSON record per line:
- container logs: Fluent Bit ``out_kafka`` records (docker/json-file parser shape: ``log`` with
  its newline, ``stream``, ``time``; ``@timestamp`` a float) with the kubernetes filter's
  metadata; https://docs.fluentbit.io/manual/pipeline/filters/kubernetes
- Kubernetes events: core/v1 Events as kubernetes-event-exporter emits them, involvedObject
  enriched with labels and ownerReferences (resmoio/kubernetes-event-exporter pkg/kube/event.go);
- metrics: prometheus-kafka-adapter JSON samples, keys sorted as Go marshals a map
  (https://github.com/Telefonica/prometheus-kafka-adapter).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detector.lab import wordings as w

H100 = ("NVIDIA H100 80GB HBM3", 81559)  # modelName, framebuffer MiB as nvidia-smi reports it
L4 = ("NVIDIA L4", 23034)
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand alphabet


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as dcgm-exporter labels it."""

    node: str
    index: int
    uuid: str
    model: str
    total_mib: int


@dataclass(slots=True)
class Pod:
    """One pod and its container runs: ``starts[i]`` and, if it died, ``deaths[i]`` (seconds)."""

    namespace: str
    app: str
    owner: str  # ReplicaSet or StatefulSet name
    name: str
    uid: str
    node: str
    ip: str
    container: str
    image: str
    digest: str
    port: int = 8000
    owner_uid: str = ""
    gpu: Gpu | None = None
    ready_after_s: float = 10.0
    starts: list[float] = field(default_factory=lambda: [0.0])
    deaths: list[float] = field(default_factory=list)
    container_ids: list[str] = field(default_factory=list)

    @property
    def addr(self) -> str:
        """Return ``ip:port`` as the load balancer logs it."""
        return f"{self.ip}:{self.port}"

    def labels(self) -> dict[str, str]:
        """Return the pod's labels: the app name and the controller's hash label."""
        if self.name == f"{self.owner}-0":  # StatefulSet pod
            return {"app.kubernetes.io/name": self.app, "controller-revision-hash": self.owner}
        return {"app.kubernetes.io/name": self.app, "pod-template-hash": self.owner.rsplit("-")[-1]}

    def run(self, t: float) -> int:
        """Return the index of the container run alive (or last started) at ``t``."""
        return max(0, sum(1 for s in self.starts if s <= t) - 1)

    def dead_since(self, t: float) -> float | None:
        """Return when the run of ``t`` died, if it is dead at ``t``."""
        i = self.run(t)
        return self.deaths[i] if i < len(self.deaths) and t >= self.deaths[i] else None

    def serving(self, t: float) -> bool:
        """Return whether the pod is Ready and its process alive at ``t``."""
        return self.starts[self.run(t)] + self.ready_after_s <= t and self.dead_since(t) is None

    def in_endpoints(self, t: float) -> bool:
        """Return whether the load balancer still routes to the pod (it takes 5 s to notice)."""
        dead = self.dead_since(t)
        return self.serving(t) or (dead is not None and t - dead < 5.0)


class Recorder:
    """Collect the records of one recording per output file; write them in event-time order."""

    def __init__(self, seed: int | str, start: float) -> None:
        self.rng = random.Random(seed)
        self.start = start
        self.files: dict[str, list[tuple[int, int, str]]] = {}
        self._seq = 0
        self._events: dict[tuple[str, str, str], tuple[str, str, float, int]] = {}
        self._version = 41_000

    def hex(self, n: int) -> str:
        """Return ``n`` random lowercase hex digits."""
        return f"{self.rng.getrandbits(4 * n):0{n}x}"

    def uuid(self) -> str:
        """Return a random (seeded) version-4 UUID string."""
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def suffix(self, n: int) -> str:
        """Return ``n`` characters of the Kubernetes name-suffix alphabet."""
        return "".join(self.rng.choice(_SUFFIX) for _ in range(n))

    def resource_version(self) -> str:
        """Return the next resourceVersion."""
        self._version += self.rng.randrange(1, 40)
        return str(self._version)

    def put(self, file: str, t: float, record: dict[str, Any], *, sort: bool = False) -> None:
        """Add one record to ``file`` at offset ``t`` seconds."""
        text = json.dumps(record, separators=(",", ":"), sort_keys=sort, ensure_ascii=False)
        self._seq += 1
        self.files.setdefault(file, []).append((round(t * 1e6), self._seq, text))

    def pod(
        self,
        namespace: str,
        owner: str,
        node: str,
        ip: str,
        container: str,
        image: str,
        name: str = "",
    ) -> Pod:
        """Create a pod of controller ``owner``, named ``owner-xxxxx`` unless ``name`` is given."""
        app = owner if name else owner.rsplit("-", 1)[0]
        digest = image.rsplit(":", 1)[0] + "@sha256:" + self.hex(64)
        pod = Pod(
            namespace,
            app,
            owner,
            name or f"{owner}-{self.suffix(5)}",
            self.uuid(),
            node,
            ip,
            container,
            image,
            digest,
        )
        pod.container_ids.append(self.hex(64))
        return pod

    def restart(self, pod: Pod, t: float) -> None:
        """Start a new container run of ``pod`` at ``t``."""
        pod.starts.append(t)
        pod.container_ids.append(self.hex(64))

    def log(self, pod: Pod, t: float, text: str, stream: str = "stdout", file: str = "") -> None:
        """Add one container log line of ``pod`` as a Fluent Bit record."""
        micros = round((self.start + t) * 1e6)
        nanos = (micros % 1_000_000) * 1000 + self.rng.randrange(1000)
        meta = {
            "pod_name": pod.name,
            "namespace_name": pod.namespace,
            "pod_id": pod.uid,
            "labels": pod.labels(),
            "host": pod.node,
            "container_name": pod.container,
            "docker_id": pod.container_ids[pod.run(t)],
            "container_hash": pod.digest,
            "container_image": pod.image,
        }
        stamp = w.rfc3339_nano(micros // 1_000_000, nanos)
        record = {"@timestamp": micros / 1e6, "log": text + "\n", "stream": stream, "time": stamp}
        self.put(file or "container-logs.jsonl", t, {**record, "kubernetes": meta})

    def lines(self, pod: Pod, t: float, lines: Sequence[w.Line]) -> None:
        """Add a block of ``(offset_s, stream, text)`` lines, at least 50 microseconds apart."""
        for i, (dt, stream, text) in enumerate(lines):
            self.log(pod, t + dt + i * 5e-5, text, stream)

    def event(
        self,
        t: float,
        pod: Pod,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        component: str = "kubelet",
        container: bool = True,
    ) -> None:
        """Add a core/v1 Event about ``pod``; a repeat (same reason and message) bumps count."""
        key = (pod.name, reason, message)
        first_name = f"{pod.name}.{round((self.start + t) * 1e9):x}"
        name, uid, first, count = self._events.get(key, (first_name, self.uuid(), t, 0))
        self._events[key] = (name, uid, first, count + 1)
        host = pod.node if component == "kubelet" else ""
        created = w.rfc3339(self.start + first)
        meta = {
            "name": name,
            "namespace": pod.namespace,
            "uid": uid,
            "resourceVersion": self.resource_version(),
            "creationTimestamp": created,
        }
        record: dict[str, Any] = {
            "metadata": meta,
            "reason": reason,
            "message": message,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": created,
            "lastTimestamp": w.rfc3339(self.start + t),
            "count": count + 1,
            "type": "Warning" if warning else "Normal",
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": host,
            "clusterName": "",
            "involvedObject": self._involved(pod, container),
        }
        self.put("k8s-events.jsonl", t, record)

    def endpoint_slice(self, t: float, service: str, endpoints: Sequence[tuple[Pod, bool]]) -> None:
        """Add the Service's discovery.k8s.io/v1 EndpointSlice as a watch shows it at ``t``:
        one endpoint per pod (its IP, ``conditions.ready``, ``targetRef``), as the
        EndpointSlice controller writes it
        (https://kubernetes.io/docs/reference/kubernetes-api/service-resources/endpoint-slice-v1/).
        """
        namespace = endpoints[0][0].namespace if endpoints else "default"
        stamp = w.rfc3339(self.start + t)
        record: dict[str, Any] = {
            "kind": "EndpointSlice",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {
                # the controller's generated suffix; from the name, not the seeded stream, so
                # the records of the rest of a run stay what they were without slices
                "name": f"{service}-{hashlib.sha256(service.encode()).hexdigest()[:5]}",
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": service},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": stamp},
            },
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [pod.ip],
                    "conditions": {"ready": ready, "serving": ready, "terminating": False},
                    "nodeName": pod.node,
                    "targetRef": {
                        "kind": "Pod",
                        "namespace": pod.namespace,
                        "name": pod.name,
                        "uid": pod.uid,
                    },
                }
                for pod, ready in endpoints
            ],
            "ports": [
                {
                    "name": "http",
                    "port": endpoints[0][0].port if endpoints else 8000,
                    "protocol": "TCP",
                }
            ],
        }
        self.put("k8s-events.jsonl", t, record)

    def _involved(self, pod: Pod, container: bool) -> dict[str, Any]:
        """Return the exporter's enriched reference to ``pod`` (labels, ownerReferences)."""
        ref: dict[str, Any] = {
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
            "apiVersion": "v1",
            "resourceVersion": self.resource_version(),
        }
        if container:
            ref["fieldPath"] = f"spec.containers{{{pod.container}}}"
        ref["labels"] = pod.labels()
        ref["ownerReferences"] = [owner_reference(pod)]
        ref["deleted"] = False
        return ref

    def sample(self, t: float, name: str, value: float, labels: dict[str, str]) -> None:
        """Add one prometheus-kafka-adapter sample; the value is a string, as Go formats it."""
        text = repr(round(float(value), 4)).removesuffix(".0")
        record = {
            "timestamp": w.rfc3339(self.start + t),
            "value": text,
            "name": name,
            "labels": {"__name__": name, **labels},
        }
        self.put("gpu-metrics.jsonl", t, record, sort=True)

    def drain(self, until: float) -> list[tuple[str, float, str]]:
        """Return and remove the records at offset <= ``until`` seconds.

        Each as (file name, offset seconds, JSON text), ordered by (offset, sequence) across
        files; later records stay for a later ``drain`` or ``write``.
        """
        limit = round(until * 1e6)
        out: list[tuple[int, int, str, str]] = []
        for name, rows in self.files.items():
            keep = [row for row in rows if row[0] > limit]
            out += [(us, seq, name, text) for us, seq, text in rows if us <= limit]
            self.files[name] = keep
        out.sort(key=lambda row: (row[0], row[1]))
        return [(name, us / 1e6, text) for us, _, name, text in out]

    def write(self, outdir: Path) -> list[Path]:
        """Write every file, records sorted by event time (stable), and return the paths."""
        outdir.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        for name in sorted(self.files):
            path = outdir / name
            rows = sorted(self.files[name])
            path.write_text("".join(text + "\n" for _, _, text in rows), encoding="utf-8")
            paths.append(path)
        return paths


def owner_reference(pod: Pod) -> dict[str, Any]:
    """Return the pod's controller ownerReference (ReplicaSet, or StatefulSet for ``-0``)."""
    stateful = pod.name == f"{pod.owner}-0"
    kind, name = ("StatefulSet", pod.app) if stateful else ("ReplicaSet", pod.owner)
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "uid": pod.owner_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def deployment(
    rec: Recorder,
    namespace: str,
    app: str,
    n: int,
    container: str,
    image: str,
    port: int,
    ips: Sequence[str],
) -> list[Pod]:
    """Create the ``n`` pods of Deployment ``app`` (one ReplicaSet) with the given pod IPs."""
    owner = f"{app}-{rec.suffix(rec.rng.choice((9, 10)))}"
    owner_uid = rec.uuid()
    pods = [rec.pod(namespace, owner, "", ips[i], container, image) for i in range(n)]
    for pod in pods:
        pod.port, pod.owner_uid = port, owner_uid
    return pods


def place_gpus(
    rec: Recorder, pods: Sequence[Pod], nodes: Sequence[str], per_node: int, spec: tuple[str, int]
) -> None:
    """Put ``per_node`` pods on each node in order, one GPU each."""
    for i, pod in enumerate(pods):
        pod.node = nodes[i // per_node]
        pod.gpu = Gpu(pod.node, i % per_node, f"GPU-{rec.uuid()}", spec[0], spec[1])


def scrape_fb(rec: Recorder, t: float, pod: Pod, used_mib: float) -> None:
    """Add dcgm-exporter's DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE (MiB) of the pod's GPU."""
    gpu = pod.gpu
    if gpu is None:
        return
    used = max(0, min(gpu.total_mib, round(used_mib)))
    exporter = pod.ip.rsplit(".", 1)[0] + ".5:9400"
    labels = {
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "device": f"nvidia{gpu.index}",
        "modelName": gpu.model,
        "Hostname": gpu.node,
        "container": pod.container,
        "namespace": pod.namespace,
        "pod": pod.name,
        "instance": exporter,
        "job": "gpu-metrics",
    }
    rec.sample(t, "DCGM_FI_DEV_FB_USED", used, labels)
    rec.sample(t, "DCGM_FI_DEV_FB_FREE", gpu.total_mib - used, labels)


def interp(knots: Sequence[tuple[float, float]], t: float) -> float:
    """Return the piecewise-linear value of ``knots`` at ``t`` (flat outside them)."""
    if t <= knots[0][0]:
        return knots[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(knots):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return knots[-1][1]


def arrivals(
    rng: random.Random, t0: float, t1: float, rate: Callable[[float], float]
) -> Iterator[float]:
    """Yield Poisson arrival times in [t0, t1) for a rate (per second) that varies in time."""
    t = t0
    while True:
        t += rng.expovariate(max(rate(t), 1e-3))
        if t >= t1:
            return
        yield t


def started(rec: Recorder, t: float, pod: Pod, scheduled: bool = False) -> None:
    """Add the kubelet's Normal events of a container start (and the scheduler's, first time)."""
    if scheduled:
        msg = f"Successfully assigned {pod.namespace}/{pod.name} to {pod.node}"
        rec.event(t, pod, "Scheduled", msg, component="default-scheduler", container=False)
    rec.event(t + 0.4, pod, "Pulled", f'Container image "{pod.image}" already present on machine')
    rec.event(t + 0.5, pod, "Created", f"Created container {pod.container}")
    rec.event(t + 0.6, pod, "Started", f"Started container {pod.container}")


def back_off(rec: Recorder, pod: Pod, t0: float, t1: float, every_s: float) -> None:
    """Add the kubelet's BackOff Warning while ``pod`` waits to restart, ``count`` rising."""
    msg = (
        f"Back-off restarting failed container {pod.container} in pod "
        f"{pod.name}_{pod.namespace}({pod.uid})"
    )
    t = t0
    while t < t1:
        rec.event(t, pod, "BackOff", msg, warning=True)
        t += every_s
