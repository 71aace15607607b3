"""The recorder: seeded identities, wire envelopes and ingress routing for recordings.

Envelopes, one JSON record per line:
- container logs: Fluent Bit ``out_kafka`` records (docker/json-file parser shape: ``log`` with
  its newline, ``stream``, ``time``, ``@timestamp`` as a float) with the kubernetes filter's
  metadata; https://docs.fluentbit.io/manual/pipeline/filters/kubernetes
- Kubernetes events: core/v1 Events as kubernetes-event-exporter emits them, involvedObject
  enriched with labels and ownerReferences (resmoio/kubernetes-event-exporter pkg/kube/event.go);
- metrics: prometheus-kafka-adapter JSON samples, keys sorted as Go marshals a map
  (https://github.com/Telefonica/prometheus-kafka-adapter).
"""

from __future__ import annotations

import argparse
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
INGRESS_IP = "10.0.3.10"
CLIENT_AGENTS = ("OpenAI/Python 1.99.9", "python-requests/2.32.3", "curl/8.5.0")
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/134.0"


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
    """One pod of a Deployment, with its container runs (start and death times, seconds)."""

    namespace: str
    app: str
    rs_hash: str
    name: str
    uid: str
    rs_uid: str
    node: str
    ip: str
    container: str
    image: str
    digest: str
    gpu: Gpu | None = None
    ready_after_s: float = 10.0
    starts: list[float] = field(default_factory=lambda: [0.0])
    deaths: list[float] = field(default_factory=list)
    container_ids: list[str] = field(default_factory=list)

    def run(self, t: float) -> int:
        """Return the index of the container run alive (or last started) at ``t``."""
        return max(0, sum(1 for s in self.starts if s <= t) - 1)

    def dead_since(self, t: float) -> float | None:
        """Return when the run of ``t`` died, if it is dead at ``t``."""
        i = self.run(t)
        return self.deaths[i] if i < len(self.deaths) and t >= self.deaths[i] else None

    def serving(self, t: float) -> bool:
        """Return whether the pod is Ready and its process alive at ``t``."""
        i = self.run(t)
        return self.starts[i] + self.ready_after_s <= t and self.dead_since(t) is None

    def in_endpoints(self, t: float) -> bool:
        """Return whether the load balancer still routes to the pod (5 s to notice a death)."""
        dead = self.dead_since(t)
        return self.serving(t) or (dead is not None and t - dead < 5.0)


class Recorder:
    """Collect the records of one recording per output file, then write them in time order."""

    def __init__(self, seed: int, start: float) -> None:
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
        self, namespace: str, app: str, rs_hash: str, node: str, ip: str, container: str, image: str
    ) -> Pod:
        """Create a pod of Deployment ``app``: name = app-rs_hash-suffix."""
        pod = Pod(
            namespace,
            app,
            rs_hash,
            f"{app}-{rs_hash}-{self.suffix(5)}",
            self.uuid(),
            self.uuid(),
            node,
            ip,
            container,
            image,
            image.rsplit(":", 1)[0] + "@sha256:" + self.hex(64),
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
        record = {
            "@timestamp": micros / 1e6,
            "log": text + "\n",
            "stream": stream,
            "time": w.rfc3339_nano(micros // 1_000_000, nanos),
            "kubernetes": {
                "pod_name": pod.name,
                "namespace_name": pod.namespace,
                "pod_id": pod.uid,
                "labels": {"app.kubernetes.io/name": pod.app, "pod-template-hash": pod.rs_hash},
                "host": pod.node,
                "container_name": pod.container,
                "docker_id": pod.container_ids[pod.run(t)],
                "container_hash": pod.digest,
                "container_image": pod.image,
            },
        }
        self.put(file or "container-logs.jsonl", t, record)

    def lines(self, pod: Pod, t: float, lines: Sequence[w.Line]) -> None:
        """Add a block of ``(offset_s, stream, text)`` lines, 50 microseconds apart at least."""
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
        """Add a core/v1 Event about ``pod``; repeats of (pod, reason) raise ``count``."""
        key = (pod.name, reason, message)
        name, uid, first, count = self._events.get(
            key, (f"{pod.name}.{round((self.start + t) * 1e9):x}", self.uuid(), t, 0)
        )
        self._events[key] = (name, uid, first, count + 1)
        stamp = w.rfc3339(self.start + t)
        host = pod.node if component == "kubelet" else ""
        record: dict[str, Any] = {
            "metadata": {
                "name": name,
                "namespace": pod.namespace,
                "uid": uid,
                "resourceVersion": self.resource_version(),
                "creationTimestamp": w.rfc3339(self.start + first),
            },
            "reason": reason,
            "message": message,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": w.rfc3339(self.start + first),
            "lastTimestamp": stamp,
            "count": count + 1,
            "type": "Warning" if warning else "Normal",
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": host,
            "clusterName": "",
            "involvedObject": self._involved(pod, container),
        }
        self.put("k8s-events.jsonl", t, record)

    def _involved(self, pod: Pod, container: bool) -> dict[str, Any]:
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
        ref["labels"] = {"app.kubernetes.io/name": pod.app, "pod-template-hash": pod.rs_hash}
        ref["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"{pod.app}-{pod.rs_hash}",
                "uid": pod.rs_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        ref["deleted"] = False
        return ref

    def sample(self, t: float, name: str, value: float, labels: dict[str, str]) -> None:
        """Add one prometheus-kafka-adapter sample (Go map order: keys sorted)."""
        text = repr(round(float(value), 4))
        text = text[:-2] if text.endswith(".0") else text
        record = {
            "timestamp": w.rfc3339(self.start + t),
            "value": text,
            "name": name,
            "labels": {"__name__": name, **labels},
        }
        self.put("gpu-metrics.jsonl", t, record, sort=True)

    def write(self, outdir: Path) -> list[Path]:
        """Write every file, records sorted by event time (stable), and return the paths."""
        outdir.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        for name in sorted(self.files):
            rows = sorted(self.files[name])
            path = outdir / name
            path.write_text("".join(text + "\n" for _, _, text in rows), encoding="utf-8")
            paths.append(path)
        return paths


# --- shared pieces: ingress routing, traffic, GPU scrapes ------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """A backend's answer to one request: status, body bytes, seconds, nginx error if any."""

    status: int
    body: int
    seconds: float
    error: str = ""


@dataclass(slots=True)
class Ingress:
    """The ingress-nginx controller pod; routes requests the way its Lua balancer does."""

    rec: Recorder
    pod: Pod
    conn: int = 184_000

    def access(self, t: float, host: str, request: str, up: w.Upstream, out: Outcome) -> None:
        """Log one access line (stdout) and, on an upstream failure, its error line (stderr)."""
        rng = self.rec.rng
        client = f"203.0.113.{rng.randrange(2, 250)}"
        post = request.startswith("POST")
        agent = rng.choice(CLIENT_AGENTS) if post else BROWSER
        length = rng.randrange(600, 9000) if post else rng.randrange(80, 400)
        line = w.ingress_access(
            self.rec.start + t,
            client,
            request,
            out.status,
            out.body,
            agent,
            length,
            out.seconds,
            up,
            self.rec.hex(32),
        )
        self.rec.log(self.pod, t, line, "stdout", "lb-access.jsonl")
        if out.error:
            self.conn += rng.randrange(1, 90)
            url = f"http://{up.addr.split(', ')[-1]}{request.split()[1]}"
            err = w.nginx_error(
                self.rec.start + t, self.conn, out.error, client, host, request, url
            )
            self.rec.log(self.pod, t + 1e-4, err, "stderr", "lb-access.jsonl")

    def route(
        self,
        t: float,
        pods: Sequence[Pod],
        upstream: str,
        host: str,
        request: str,
        serve: Callable[[Pod, float], Outcome],
    ) -> None:
        """Send one request to a random endpoint of ``pods`` and log what the client got."""
        eps = [p for p in pods if p.in_endpoints(t)]
        if not eps:  # no endpoints: ingress-nginx answers 503 itself
            self.access(t, host, request, w.Upstream(upstream), Outcome(503, 190, 0.0))
            return
        pod = self.rec.rng.choice(eps)
        port = pod.image_port
        tried: list[tuple[str, str]] = []
        if pod.dead_since(t) is not None:  # connect() refused; nginx tries the next endpoint
            tried.append((f"{pod.ip}:{port}", "502"))
            alive = [p for p in eps if p.serving(t)]
            if not alive:
                refused = "connect() failed (111: Connection refused) while connecting to upstream"
                out = Outcome(502, 150, 0.001, refused)
                self.access(t, host, request, _upstream(upstream, tried, out), out)
                return
            pod = self.rec.rng.choice(alive)
        out = serve(pod, t)
        tried.append((f"{pod.ip}:{port}", str(out.status) if out.status != 499 else "-"))
        self.access(t, host, request, _upstream(upstream, tried, out), out)


def _upstream(name: str, tried: list[tuple[str, str]], out: Outcome) -> w.Upstream:
    """Build the upstream fields of an access line; earlier tries answered nothing."""
    lengths = ["0"] * (len(tried) - 1) + [str(out.body if out.status < 500 else 0)]
    times = ["0.000"] * (len(tried) - 1) + [f"{out.seconds:.3f}"]
    return w.Upstream(
        name,
        ", ".join(a for a, _ in tried),
        ", ".join(lengths),
        ", ".join(times),
        ", ".join(s for _, s in tried),
    )


def _cut(
    rec: Recorder, lb: Ingress, t: float, pod: Pod, upstream: str, host: str, request: str, n: int
) -> None:
    """Log ``n`` requests queued in a pod that died at ``t``: 502, connection closed."""
    closed = "upstream prematurely closed connection while reading response header from upstream"
    for i in range(n):
        out = Outcome(502, 150, rec.rng.uniform(2.0, 40.0), closed)
        tried = [(f"{pod.ip}:{pod.image_port}", "502")]
        lb.access(t + 0.002 * (i + 1), host, request, _upstream(upstream, tried, out), out)


def _interp(knots: Sequence[tuple[float, float]], t: float) -> float:
    """Return the piecewise-linear value of ``knots`` at ``t`` (flat outside them)."""
    if t <= knots[0][0]:
        return knots[0][1]
    for (t0, v0), (t1, v1) in zip(knots, knots[1:], strict=False):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return knots[-1][1]


def _arrivals(
    rng: random.Random, t0: float, t1: float, rate: Callable[[float], float]
) -> Iterator[float]:
    """Yield Poisson arrival times in [t0, t1) for a rate (per second) that varies in time."""
    t = t0
    while True:
        t += rng.expovariate(max(rate(t), 1e-3))
        if t >= t1:
            return
        yield t


def _scrape_fb(rec: Recorder, t: float, pod: Pod, used_mib: float, exporter_ip: str) -> None:
    """Add dcgm-exporter's DCGM_FI_DEV_FB_USED and FB_FREE (MiB) of the pod's GPU."""
    gpu = pod.gpu
    assert gpu is not None
    used = max(0, min(gpu.total_mib, round(used_mib)))
    labels = {
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "device": f"nvidia{gpu.index}",
        "modelName": gpu.model,
        "Hostname": gpu.node,
        "DCGM_FI_DRIVER_VERSION": "550.127.05",
        "container": pod.container,
        "namespace": pod.namespace,
        "pod": pod.name,
        "instance": f"{exporter_ip}:9400",
        "job": "gpu-metrics",
    }
    rec.sample(t, "DCGM_FI_DEV_FB_USED", used, labels)
    rec.sample(t, "DCGM_FI_DEV_FB_FREE", gpu.total_mib - used, labels)


def _gpus(
    rec: Recorder, pods: Sequence[Pod], nodes: Sequence[str], per_node: int, spec: tuple[str, int]
) -> None:
    """Give each pod one GPU, ``per_node`` pods per node in order."""
    for i, pod in enumerate(pods):
        node = nodes[i // per_node]
        pod.node = node
        pod.gpu = Gpu(node, i % per_node, f"GPU-{rec.uuid()}", spec[0], spec[1])


def _deployment(
    rec: Recorder,
    namespace: str,
    app: str,
    n: int,
    container: str,
    image: str,
    port: int,
    subnet: str,
) -> list[Pod]:
    """Create the ``n`` pods of one Deployment (same ReplicaSet) on a /24 of pod IPs."""
    rs_hash = rec.suffix(rec.rng.choice((9, 10)))
    rs_uid = rec.uuid()
    pods = []
    for i in range(n):
        pod = rec.pod(namespace, app, rs_hash, "", f"{subnet}.{11 + 7 * i}", container, image)
        pod.rs_uid, pod.image_port = rs_uid, port
        pods.append(pod)
    return pods


def _web_noise(rec: Recorder, lb: Ingress, end: float, scale: int) -> None:
    """Add healthy web workloads behind the same ingress: 2xx/3xx/404 and their nginx lines."""
    names = ["web-frontend"] + [f"{_WEB[k % len(_WEB)]}-{k // len(_WEB)}" for k in range(scale - 1)]
    for k, name in enumerate(names):
        pods = _deployment(
            rec,
            "default",
            name,
            2,
            "nginx",
            "docker.io/library/nginx:1.27.4",
            80,
            f"10.0.{20 + k % 200}",
        )
        for pod in pods:
            pod.node = f"cpu-node-0{1 + k % 3}"
        host = "www.example.com" if k == 0 else f"{name}.example.com"

        def serve(pod: Pod, t: float) -> Outcome:
            path, status, size = rec.rng.choice(_PAGES)
            rec.log(
                pod,
                t - 0.001,
                w.nginx_combined(
                    rec.start + t, INGRESS_IP, f"GET {path}", status, size, BROWSER, "203.0.113.7"
                ),
            )
            return Outcome(status, size, rec.rng.uniform(0.001, 0.04))

        for t in _arrivals(rec.rng, 0.0, end, lambda _t: 0.3):
            path = rec.rng.choice(_PAGES)[0]
            lb.route(t, pods, f"default-{name}-80", host, f"GET {path}", serve)


_WEB = ("checkout", "catalog", "search", "cart", "accounts", "payments", "reviews", "shipping")
_PAGES = (
    ("/", 200, 5321),
    ("/static/app.3f9c2b.js", 200, 48211),
    ("/api/session", 200, 312),
    ("/static/app.3f9c2b.js", 304, 0),
    ("/favicon.ico", 404, 153),
)


def _ingress(rec: Recorder) -> Ingress:
    """Create the ingress-nginx controller pod whose log is ``lb-access.jsonl``."""
    pod = rec.pod(
        "ingress-nginx",
        "ingress-nginx-controller",
        rec.suffix(10),
        "cpu-node-01",
        INGRESS_IP,
        "controller",
        "registry.k8s.io/ingress-nginx/controller:v1.12.1",
    )
    return Ingress(rec, pod)


def _started(rec: Recorder, t: float, pod: Pod, scheduled: bool = False) -> None:
    """Add the kubelet's Normal events of a container start (and the scheduler's, first time)."""
    if scheduled:
        msg = f"Successfully assigned {pod.namespace}/{pod.name} to {pod.node}"
        rec.event(t, pod, "Scheduled", msg, component="default-scheduler", container=False)
    rec.event(t + 0.4, pod, "Pulled", f'Container image "{pod.image}" already present on machine')
    rec.event(t + 0.5, pod, "Created", f"Created container {pod.container}")
    rec.event(t + 0.6, pod, "Started", f"Started container {pod.container}")


def _back_off(rec: Recorder, pod: Pod, t0: float, t1: float, every_s: float) -> None:
    """Add the kubelet's BackOff Warning while ``pod`` waits to restart, ``count`` rising."""
    msg = (
        f"Back-off restarting failed container {pod.container} in pod "
        f"{pod.name}_{pod.namespace}({pod.uid})"
    )
    t = t0
    while t < t1:
        rec.event(t, pod, "BackOff", msg, warning=True)
        t += every_s
