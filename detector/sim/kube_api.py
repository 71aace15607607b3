"""A local server that answers like the Kubernetes API: the stand-in for a cluster.

``KubeStandIn`` serves exactly the paths the actuators use (GET/PATCH Deployments,
StatefulSets, Argo Rollouts, LeaderWorkerSets and Ingresses, GET/DELETE pods and POST
pods/{name}/eviction, GET ConfigMaps, GET/POST/PATCH/DELETE BackendTrafficPolicies) with the
API server's behaviour that matters here: strategic merge patch for built-in kinds
(containers and env merged by name, ``$patch: delete``), JSON merge patch (RFC 7386: lists
replaced whole) for custom resources, ``metadata.resourceVersion`` in a patch as a
precondition (409), UID preconditions on delete and eviction, ``dryRun=All`` that changes
nothing, and Status bodies for errors
(https://kubernetes.io/docs/reference/using-api/api-concepts/). It records every request
(method, path, query, Content-Type, body) and calls its hooks after answering one, so that a
simulator can make a patch or an eviction change what it simulates. The real ``kubernetes``
client talks to it through a kubeconfig (``write_kubeconfig``) or ``Configuration(host=...)``.

The actuators' request-level tests serve it too (tests/integration/kube_fake.py adds the
pytest fixtures and the RBAC checks).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
MANAGER = "gpu-oom-cascade-detector"
_PLURALS = {
    "Deployment": "apps/v1/deployments",
    "StatefulSet": "apps/v1/statefulsets",
    "Rollout": "argoproj.io/v1alpha1/rollouts",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1/leaderworkersets",
    "Pod": "v1/pods",
    "Ingress": "networking.k8s.io/v1/ingresses",
    "ConfigMap": "v1/configmaps",
    "BackendTrafficPolicy": "gateway.envoyproxy.io/v1alpha1/backendtrafficpolicies",
}
_MERGE_BY_NAME = ("containers", "env")


@dataclass(frozen=True)
class Recorded:
    """One request the fake API server received."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any

    @property
    def dry_run(self) -> bool:
        """Return True for ``dryRun=All``."""
        return self.query.get("dryRun") == "All"


@dataclass
class Fault:
    """An answer to force: a status (with its Status body) and/or a delay."""

    method: str
    path: str
    status: int | None = None
    reason: str = ""
    message: str = ""
    details: dict[str, Any] | None = None
    dry_run: bool | None = None
    sleep_s: float = 0.0
    handle: bool = False  # after the delay, handle the request normally (it lands)
    times: int = 1

    def matches(self, request: Recorded) -> bool:
        dry = self.dry_run is None or self.dry_run == request.dry_run
        return self.times > 0 and (request.method, request.path) == (self.method, self.path) and dry


def status_body(code: int, reason: str, message: str, details: Any = None) -> dict[str, Any]:
    """Return a metav1.Status error body."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
    }
    body |= {"message": message, "reason": reason, "code": code}
    if details is not None:
        body["details"] = details
    return body


def strategic_merge(obj: Any, patch: Any, strategic: bool) -> Any:
    """Apply a strategic merge (or, with ``strategic`` False, a JSON merge) patch."""
    if not isinstance(patch, dict) or not isinstance(obj, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(obj)
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        elif strategic and key in _MERGE_BY_NAME and isinstance(value, list):
            out[key] = _merge_by_name(out.get(key) or [], value)
        else:
            out[key] = strategic_merge(out.get(key), value, strategic)
    return out


def _merge_by_name(items: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[Any]:
    out = copy.deepcopy(items)
    for entry in patch:
        index = next((i for i, e in enumerate(out) if e.get("name") == entry.get("name")), None)
        if entry.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
        elif index is None:
            out.append({k: v for k, v in entry.items() if not k.startswith("$")})
        else:
            out[index] = strategic_merge(out[index], entry, True)
    return out


@dataclass
class KubeStandIn:
    """The Kubernetes API for the paths the actuators call; see the module docstring."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    history: list[Recorded] = field(default_factory=list)  # never cleared
    faults: list[Fault] = field(default_factory=list)
    hooks: list[Callable[[Recorded], None]] = field(default_factory=list)
    version: int = 1000
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, obj: dict[str, Any]) -> str:
        """Store ``obj`` (new UID and resourceVersion); return its path."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        with self.lock:
            self.version += 1
            meta["resourceVersion"] = str(self.version)
            path = _object_path(obj)
            self.objects[path] = obj
        return path

    def get(self, path: str) -> dict[str, Any] | None:
        """Return a copy of the stored object."""
        with self.lock:
            found = self.objects.get(path)
            return copy.deepcopy(found)

    def fail(self, method: str, path: str, status: int | None = None, **kw: Any) -> None:
        """Force the next matching request's answer (see Fault)."""
        self.faults.append(Fault(method, path, status, **kw))

    def writes(self) -> list[Recorded]:
        """Return the requests that were not GETs."""
        return [r for r in self.requests if r.method != "GET"]

    def calls(self) -> list[tuple[str, str, bool]]:
        """Return (method, path, dry run) of every request, in order."""
        return [(r.method, r.path, r.dry_run) for r in self.requests]

    def handle(self, request: Recorded) -> tuple[int, dict[str, Any]]:
        """Answer one request: (status, JSON body)."""
        with self.lock:
            fault = next((f for f in self.faults if f.matches(request)), None)
            if fault is not None:
                fault.times -= 1
        if fault is not None:
            time.sleep(fault.sleep_s)
            if fault.status is not None:
                return fault.status, status_body(
                    fault.status, fault.reason, fault.message, fault.details
                )
            if not fault.handle:
                return 504, status_body(504, "Timeout", "the server was too slow")
        with self.lock:
            return self._handle(request)

    def _handle(self, request: Recorded) -> tuple[int, dict[str, Any]]:
        method, path = request.method, request.path
        if method == "POST" and not path.endswith("/eviction"):
            return self._create(request)
        target = path.removesuffix("/eviction")
        obj = self.objects.get(target)
        if obj is None:
            name = target.rsplit("/", 1)[-1]
            return 404, status_body(404, "NotFound", f'"{name}" not found')
        if method == "GET":
            return 200, copy.deepcopy(obj)
        if method == "PATCH":
            return self._patch(target, obj, request)
        options = request.body or {}
        if path.endswith("/eviction"):
            options = options.get("deleteOptions") or {}
        preconditions = options.get("preconditions") or {}
        meta = obj["metadata"]
        for key in ("uid", "resourceVersion"):
            if key in preconditions and preconditions[key] != meta[key]:
                message = f"Precondition failed: {key} in precondition: {preconditions[key]}"
                return 409, status_body(409, "Conflict", message)
        if not request.dry_run:
            del self.objects[target]
        if path.endswith("/eviction"):
            return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        return 200, copy.deepcopy(obj)

    def _patch(self, path: str, obj: dict[str, Any], request: Recorded) -> tuple[int, Any]:
        patch = copy.deepcopy(request.body)
        wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            name = obj["metadata"]["name"]
            message = (
                f'Operation cannot be fulfilled on {path.split("/")[-2]} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again"
            )
            return 409, status_body(409, "Conflict", message)
        new = strategic_merge(obj, patch, request.content_type == SMP)
        if new != obj and not request.dry_run:
            self.version += 1
            new["metadata"]["resourceVersion"] = str(self.version)
            self.objects[path] = new
        return 200, copy.deepcopy(new)

    def _create(self, request: Recorded) -> tuple[int, dict[str, Any]]:
        obj = copy.deepcopy(request.body)
        path = f"{request.path}/{obj['metadata']['name']}"
        if path in self.objects:
            return 409, status_body(409, "AlreadyExists", "already exists")
        obj["metadata"]["uid"] = str(uuid.uuid4())
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        if not request.dry_run:
            self.objects[path] = obj
        return 201, copy.deepcopy(obj)


def _object_path(obj: dict[str, Any]) -> str:
    group_version, plural = _PLURALS[obj["kind"]].rsplit("/", 1)
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    meta = obj["metadata"]
    return f"{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


def _handler(kube: KubeStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            request = Recorded(
                self.command,
                parts.path,
                dict(parse_qsl(parts.query)),
                self.headers.get("Content-Type"),
                json.loads(raw) if raw else None,
            )
            kube.requests.append(request)
            kube.history.append(request)
            status, body = kube.handle(request)
            for hook in kube.hooks:
                hook(request)
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up (timeout)

        do_GET = do_PATCH = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@contextmanager
def serving(kube: KubeStandIn) -> Iterator[KubeStandIn]:
    """Serve ``kube`` on a free loopback port (``kube.url``) until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(kube))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    kube.url = f"http://127.0.0.1:{server.server_port}"
    try:
        yield kube
    finally:
        server.shutdown()
        server.server_close()


def write_kubeconfig(directory: Path, url: str) -> Path:
    """Write a kubeconfig whose only context points at ``url`` (no credentials); return it."""
    path = directory / "kubeconfig"
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "detector", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "detector"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(cfg), encoding="utf-8")  # JSON is YAML
    return path
