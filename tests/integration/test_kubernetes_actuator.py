"""The Kubernetes actuators at the request level, against a local server that answers like the API.

``FakeKube`` serves exactly the paths the actuators use (GET/PATCH Deployments and Ingresses,
GET/DELETE pods and POST pods/{name}/eviction, GET ConfigMaps, GET/POST/PATCH/DELETE
BackendTrafficPolicies) on a free loopback port, with the API server's behaviour that matters
here: strategic merge patch (containers and env merged by name, ``$patch: delete``), JSON merge
patch for custom objects, ``metadata.resourceVersion`` in a patch as a precondition (409),
UID preconditions on delete and eviction, ``dryRun=All`` that changes nothing, and Status
bodies for errors (https://kubernetes.io/docs/reference/using-api/api-concepts/). It records
every request: method, path, query, Content-Type and body. The real ``kubernetes`` client is
pointed at it with ``Configuration(host=...)``.
"""

from __future__ import annotations

import copy
import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from kubernetes import client

from detector.actuators.base import ActuatorError, Status
from detector.actuators.kubernetes.actuator import RBAC_PERMISSIONS
from detector.actuators.kubernetes.api import ACTUATOR_PERMISSIONS, KubeApi, Permission
from detector.actuators.kubernetes.gateways import (
    EnvoyGatewayRateLimit,
    IngressNginxRateLimit,
    IngressRateLimit,
)
from detector.actuators.kubernetes.workloads import (
    DeploymentCeilings,
    DeploymentRestart,
    DeploymentTarget,
    PodEvictor,
)

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
NS = "inference"
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/llama"
POD = f"/api/v1/namespaces/{NS}/pods/llama-7d9f-abcde"
INGRESS_PUBLIC = f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses/llama-public"
INGRESS_INTERNAL = f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses/llama-internal"
CONFIGMAP = "/api/v1/namespaces/ingress-nginx/configmaps/ingress-nginx-controller"
POLICIES = f"/apis/gateway.envoyproxy.io/v1alpha1/namespaces/{NS}/backendtrafficpolicies"
POLICY = f"{POLICIES}/llama-detector-rate-limit"
MANAGER = "gpu-oom-cascade-detector"
_PLURALS = {
    "Deployment": "apps/v1/deployments",
    "Pod": "v1/pods",
    "Ingress": "networking.k8s.io/v1/ingresses",
    "ConfigMap": "v1/configmaps",
    "BackendTrafficPolicy": "gateway.envoyproxy.io/v1alpha1/backendtrafficpolicies",
}
_MERGE_BY_NAME = ("containers", "env")
_ALL_REQUESTS: dict[str, list[Recorded]] = {}


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
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
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
class FakeKube:
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


def _handler(kube: FakeKube) -> type[BaseHTTPRequestHandler]:
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


@pytest.fixture
def kube(request: pytest.FixtureRequest) -> Iterator[FakeKube]:
    """Serve a FakeKube on a free loopback port; check every call it saw is granted."""
    fake = FakeKube()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_port}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        _ALL_REQUESTS[request.node.name] = list(fake.history)
    for seen in fake.history:
        assert _permission(seen) in ACTUATOR_PERMISSIONS, seen


@pytest.fixture
def api(kube: FakeKube) -> Iterator[KubeApi]:
    """Return a KubeApi whose real ``kubernetes`` client talks to the fake (1 s timeout)."""
    config = client.Configuration(host=kube.url)
    config.retries = 0
    api_client = client.ApiClient(config)
    try:
        yield KubeApi(api_client, timeout_s=1.0)
    finally:
        api_client.close()


def _permission(seen: Recorded) -> Permission:
    """Return the RBAC grant a recorded request needs."""
    parts = seen.path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    plural, named, sub = rest[2], len(rest) > 3, rest[4] if len(rest) > 4 else ""
    if sub:
        return Permission(group, f"{plural}/{sub}", "create")
    verb = {"GET": "get" if named else "list", "PATCH": "patch", "DELETE": "delete"}
    return Permission(group, plural, verb.get(seen.method, "create"))


# -- objects -------------------------------------------------------------------------------


def vllm_deployment() -> dict[str, Any]:
    """Return a vLLM Deployment with a log sidecar and the default 25% strategy."""
    args = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "256"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama", "namespace": NS, "generation": 7},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "llama"}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
            },
            "template": {
                "metadata": {"labels": {"app": "llama"}, "annotations": {"team": "ml"}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.6.3",
                            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                            "args": [*args, "--gpu-memory-utilization=0.9"],
                        },
                        {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"},
                    ]
                },
            },
        },
    }


def tgi_deployment() -> dict[str, Any]:
    """Return a TGI Deployment configured by env, already rolling one pod down at a time."""
    env = [
        {"name": "MODEL_ID", "value": "mistralai/Mistral-7B-Instruct-v0.3"},
        {"name": "MAX_CONCURRENT_REQUESTS", "value": "128"},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama", "namespace": NS},
        "spec": {
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "spec": {
                    "containers": [
                        {"name": "tgi", "image": "ghcr.io/huggingface/tgi:2.4", "env": env}
                    ]
                }
            },
        },
    }


def pod(uid: str = "3f1c-uid-1") -> dict[str, Any]:
    """Return a crash-looping pod of the llama Deployment."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llama-7d9f-abcde", "namespace": NS, "uid": uid},
        "spec": {"nodeName": "gpu-node-3"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "vllm", "restartCount": 5}],
        },
    }


def ingress(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Return an Ingress served by ingress-nginx."""
    meta = {"name": name, "namespace": NS, "annotations": annotations or {}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta}


def controller_configmap(data: dict[str, str]) -> dict[str, Any]:
    """Return the ingress-nginx controller ConfigMap."""
    meta = {"name": "ingress-nginx-controller", "namespace": "ingress-nginx"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _sent(kube: FakeKube, method: str, dry_run: bool = False) -> list[Recorded]:
    return [r for r in kube.requests if r.method == method and r.dry_run == dry_run]


# -- Deployment ceilings ------------------------------------------------------------------


def test_vllm_ceilings_apply_and_revert_send_exact_patches(kube: FakeKube, api: KubeApi) -> None:
    original = kube.get(kube.put(vllm_deployment()))
    assert original is not None
    rv0 = original["metadata"]["resourceVersion"]
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64, "max_model_len": 8192})

    assert '-containers[vllm].args[--max-num-seqs]: "256"' in plan.diff
    assert '+containers[vllm].args[--max-num-seqs]: "64"' in plan.diff
    assert '+containers[vllm].args[--max-model-len]: "8192"' in plan.diff
    assert '+spec.strategy: {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}' in plan.diff
    assert "was RollingUpdate maxSurge=25% maxUnavailable=25%" in plan.summary
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.OK, result.message()
    assert kube.calls() == [
        ("GET", DEPLOY, False),
        ("PATCH", DEPLOY, True),
        ("PATCH", DEPLOY, False),
    ]
    dry, real = kube.writes()
    expected = {
        "metadata": {"resourceVersion": rv0},
        "spec": {
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "args": [
                                "--model",
                                "meta-llama/Llama-3.1-8B-Instruct",
                                "--max-num-seqs",
                                "64",
                                "--gpu-memory-utilization=0.9",
                                "--max-model-len=8192",
                            ],
                        }
                    ]
                }
            },
        },
    }
    assert real.body == dry.body == expected
    assert real.content_type == SMP
    assert real.query == {"fieldManager": MANAGER}
    assert dry.query == {"dryRun": "All", "fieldManager": MANAGER}
    live = kube.get(DEPLOY)
    assert live is not None
    assert live["spec"]["template"]["spec"]["containers"][1] == {
        "name": "log-shipper",
        "image": "fluent/fluent-bit:3.0",
    }
    kube.requests.clear()

    reverted = actuator.revert(plan, dry_run=False)

    assert reverted.status is Status.OK, reverted.message()
    restore = _sent(kube, "PATCH")[0].body
    assert restore["spec"]["strategy"] == {
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}
    }
    final = kube.get(DEPLOY)
    assert final is not None
    assert final["spec"] == original["spec"]


def test_dry_run_records_the_exact_patch_and_only_reads(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 32})
    kube.requests.clear()

    dry = actuator.apply(plan)

    assert dry.status is Status.DRY_RUN
    assert dry.diff == plan.diff
    assert kube.calls() == [("GET", DEPLOY, False)]
    prefix = f"would send: PATCH {DEPLOY} ({SMP}) "
    recorded = json.loads(dry.summary.split(prefix, 1)[1])
    assert [r.body for r in actuator.requests(plan)] == [recorded]
    actuator.apply(plan, dry_run=False)
    assert _sent(kube, "PATCH")[0].body == recorded


def test_repeated_apply_changes_nothing(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 32})
    assert actuator.apply(plan, dry_run=False).status is Status.OK
    kube.requests.clear()

    again = actuator.apply(plan, dry_run=False)

    assert again.status is Status.UNCHANGED
    assert kube.calls() == [("GET", DEPLOY, False)]
    assert actuator.verify(plan).status is Status.OK


def test_tgi_env_ceilings_keep_the_strategy_and_revert_removes_new_env(
    kube: FakeKube, api: KubeApi
) -> None:
    original = kube.get(kube.put(tgi_deployment()))
    assert original is not None
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama"), "tgi")
    plan = actuator.plan({"max_concurrent_requests": 32, "max_batch_total_tokens": 65536})
    assert "one pod at a time, strategy unchanged" in plan.summary
    assert " spec.strategy:" in plan.diff  # shown as context, not changed

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    body = _sent(kube, "PATCH")[0].body
    assert "strategy" not in body["spec"]
    assert body["spec"]["template"]["spec"]["containers"] == [
        {
            "name": "tgi",
            "env": [
                {"name": "MAX_CONCURRENT_REQUESTS", "value": "32"},
                {"name": "MAX_BATCH_TOTAL_TOKENS", "value": "65536"},
            ],
        }
    ]
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    assert _sent(kube, "PATCH")[0].body["spec"]["template"]["spec"]["containers"] == [
        {
            "name": "tgi",
            "env": [
                {"name": "MAX_CONCURRENT_REQUESTS", "value": "128"},
                {"name": "MAX_BATCH_TOTAL_TOKENS", "$patch": "delete"},
            ],
        }
    ]
    final = kube.get(DEPLOY)
    assert final is not None
    assert final["spec"] == original["spec"]


def test_conflict_from_a_concurrent_change_fails_without_clobbering(
    kube: FakeKube, api: KubeApi
) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})

    def someone_edits(seen: Recorded) -> None:  # between the dry run and the real PATCH
        if seen.method == "PATCH" and seen.dry_run:
            live = kube.get(DEPLOY)
            assert live is not None
            live["spec"]["replicas"] = 6
            kube.put(live)

    kube.hooks.append(someone_edits)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.FAILED
    assert result.reason == "conflict"
    assert result.error is not None
    assert "patch deployments.apps inference/llama: 409 Conflict" in result.error
    assert "the object has been modified" in result.error
    assert result.restored is True
    assert kube.calls() == [
        ("GET", DEPLOY, False),
        ("PATCH", DEPLOY, True),
        ("PATCH", DEPLOY, False),
    ]
    live = kube.get(DEPLOY)
    assert live is not None
    assert live["spec"]["replicas"] == 6
    assert "256" in live["spec"]["template"]["spec"]["containers"][0]["args"]


def test_forbidden_stops_at_the_server_side_dry_run(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    message = (
        'deployments.apps "llama" is forbidden: User "system:serviceaccount:gpu-oom-detector:'
        'gpu-oom-detector" cannot patch resource "deployments" in API group "apps" in the '
        'namespace "inference"'
    )
    kube.fail("PATCH", DEPLOY, 403, reason="Forbidden", message=message)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "forbidden", True)
    assert result.error is not None
    assert result.error.startswith("patch deployments.apps inference/llama: 403 Forbidden")
    assert "cannot patch resource" in result.error
    assert kube.calls() == [("GET", DEPLOY, False), ("PATCH", DEPLOY, True)]


def test_timeout_that_did_not_land_is_read_back_and_reported(kube: FakeKube, api: KubeApi) -> None:
    before = kube.get(kube.put(vllm_deployment()))
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    kube.fail("PATCH", DEPLOY, dry_run=False, sleep_s=2.0)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "timeout", True)
    assert result.error is not None
    assert "patch deployments.apps inference/llama: no answer within 1 s" in result.error
    assert "a GET after it shows deployments.apps inference/llama unchanged" in result.error
    assert kube.calls() == [
        ("GET", DEPLOY, False),
        ("PATCH", DEPLOY, True),
        ("PATCH", DEPLOY, False),
        ("GET", DEPLOY, False),
    ]
    assert kube.get(DEPLOY) == before


def test_timeout_that_landed_counts_as_done(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    kube.fail("PATCH", DEPLOY, dry_run=False, sleep_s=1.5, handle=True)

    def land_early(seen: Recorded) -> None:  # the write is stored before the slow answer
        if seen.method == "PATCH" and seen.dry_run:
            live = kube.get(DEPLOY)
            assert live is not None
            live["spec"]["template"]["spec"]["containers"][0]["args"][3] = "64"
            live["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
            kube.put(live)

    kube.hooks.append(land_early)

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.OK, result.message()
    assert [r.method for r in kube.requests][-2:] == ["PATCH", "GET"]


def test_missing_deployment_is_not_found(kube: FakeKube, api: KubeApi) -> None:
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    with pytest.raises(ActuatorError) as raised:
        actuator.plan({"max_num_seqs": 64})
    assert raised.value.reason == "not_found"
    assert "deployments.apps inference/llama" in str(raised.value)

    kube.put(vllm_deployment())
    plan = actuator.plan({"max_num_seqs": 64})
    del kube.objects[DEPLOY]
    result = actuator.apply(plan, dry_run=False)
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "not_found", True)
    assert result.error == "get deployments.apps inference/llama: 404 Not Found"
    assert kube.writes() == []


def test_verify_reports_drift_after_someone_changes_a_ceiling(kube: FakeKube, api: KubeApi) -> None:
    kube.put(vllm_deployment())
    actuator = DeploymentCeilings(api, DeploymentTarget(NS, "llama", "vllm"), "vllm")
    plan = actuator.plan({"max_num_seqs": 64})
    actuator.apply(plan, dry_run=False)
    live = kube.get(DEPLOY)
    assert live is not None
    live["spec"]["template"]["spec"]["containers"][0]["args"][3] = "512"
    kube.put(live)

    checked = actuator.verify(plan)

    assert (checked.status, checked.reason) == (Status.FAILED, "drift")
    assert '+containers[vllm].args[--max-num-seqs]: "64"' in checked.diff


def test_rolling_restart_annotation_and_its_revert(kube: FakeKube, api: KubeApi) -> None:
    original = kube.get(kube.put(vllm_deployment()))
    assert original is not None
    actuator = DeploymentRestart(api, DeploymentTarget(NS, "llama"), rollout="unavailable")
    plan = actuator.plan(datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC))

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert _sent(kube, "PATCH")[0].body == {
        "metadata": {"resourceVersion": original["metadata"]["resourceVersion"]},
        "spec": {
            "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "annotations": {"kubectl.kubernetes.io/restartedAt": "2025-03-04T05:06:07Z"}
                }
            },
        },
    }
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    body = _sent(kube, "PATCH")[0].body
    annotations = body["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"kubectl.kubernetes.io/restartedAt": None}
    final = kube.get(DEPLOY)
    assert final is not None
    assert final["spec"] == original["spec"]


# -- pods ----------------------------------------------------------------------------------


def test_eviction_goes_through_the_eviction_api(kube: FakeKube, api: KubeApi) -> None:
    kube.put(pod())
    actuator = PodEvictor(api, NS)
    plan = actuator.plan("llama-7d9f-abcde")
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert result.status is Status.OK, result.message()
    assert kube.calls() == [
        ("GET", POD, False),
        ("POST", f"{POD}/eviction", True),
        ("POST", f"{POD}/eviction", False),
    ]
    assert _sent(kube, "POST")[0].body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "llama-7d9f-abcde", "namespace": NS},
        "deleteOptions": {"preconditions": {"uid": "3f1c-uid-1"}},
    }
    assert _sent(kube, "POST")[0].content_type in (None, "application/json")
    assert kube.get(POD) is None

    kube.put(pod(uid="new-uid-2"))  # a StatefulSet would re-create it under the same name
    kube.requests.clear()
    assert actuator.apply(plan, dry_run=False).status is Status.UNCHANGED
    assert kube.writes() == []
    refused = actuator.revert(plan, dry_run=False)
    assert (refused.status, refused.reason) == (Status.FAILED, "irreversible")


def test_eviction_blocked_by_a_pod_disruption_budget(kube: FakeKube, api: KubeApi) -> None:
    kube.put(pod())
    actuator = PodEvictor(api, NS)
    plan = actuator.plan("llama-7d9f-abcde")
    cause = "The disruption budget llama-pdb needs 3 healthy pods and has 3 currently"
    kube.fail(
        "POST",
        f"{POD}/eviction",
        429,
        reason="TooManyRequests",
        message="Cannot evict pod as it would violate the pod's disruption budget.",
        details={"causes": [{"reason": "DisruptionBudget", "message": cause}]},
    )

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "pdb_blocked", True)
    assert result.error is not None
    assert "evict pods inference/llama-7d9f-abcde: blocked by PodDisruptionBudget" in result.error
    assert "inference/llama-pdb (429" in result.error
    assert cause in result.error
    assert [r.dry_run for r in _sent(kube, "POST", True)] == [True]
    assert _sent(kube, "POST") == []
    assert kube.get(POD) is not None


def test_delete_mode_sends_uid_precondition_and_grace_period(kube: FakeKube, api: KubeApi) -> None:
    kube.put(pod())
    actuator = PodEvictor(api, NS, mode="delete", grace_period_s=30)
    plan = actuator.plan("llama-7d9f-abcde")
    assert "PodDisruptionBudgets NOT consulted" in plan.summary
    kube.requests.clear()

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [("GET", POD, False), ("DELETE", POD, True), ("DELETE", POD, False)]
    assert _sent(kube, "DELETE")[0].body == {
        "preconditions": {"uid": "3f1c-uid-1"},
        "gracePeriodSeconds": 30,
    }


# -- ingress-nginx -------------------------------------------------------------------------


def test_second_ingress_conflict_reverts_the_first(kube: FakeKube, api: KubeApi) -> None:
    public = kube.get(kube.put(ingress("llama-public", {"owner": "ml"})))
    kube.put(ingress("llama-internal"))
    kube.put(controller_configmap({"use-forwarded-headers": "true"}))
    actuator = IngressNginxRateLimit(api, NS, ["llama-public", "llama-internal"])
    plan = actuator.plan(IngressRateLimit(rps=5, burst_multiplier=2))
    assert "limit-rps=5, limit-burst-multiplier=2 (per client IP" in plan.summary
    assert "answers over-limit requests with 503, not 429" in plan.summary
    assert "ingress-nginx/ingress-nginx-controller" in plan.summary
    kube.fail("PATCH", INGRESS_INTERNAL, 409, reason="Conflict", message="changed", dry_run=False)
    kube.requests.clear()

    result = actuator.apply(plan, dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "conflict", True)
    assert result.error is not None
    assert "patch ingresses.networking.k8s.io inference/llama-internal: 409" in result.error
    assert "previous content restored" in result.error
    assert kube.calls() == [
        ("GET", INGRESS_PUBLIC, False),
        ("GET", INGRESS_INTERNAL, False),
        ("PATCH", INGRESS_PUBLIC, True),
        ("PATCH", INGRESS_INTERNAL, True),
        ("PATCH", INGRESS_PUBLIC, False),
        ("PATCH", INGRESS_INTERNAL, False),
        ("PATCH", INGRESS_PUBLIC, False),
    ]
    applied, _, restored = _sent(kube, "PATCH")
    limits = {
        "nginx.ingress.kubernetes.io/limit-rps": "5",
        "nginx.ingress.kubernetes.io/limit-burst-multiplier": "2",
    }
    assert applied.body["metadata"]["annotations"] == limits
    assert restored.body["metadata"]["annotations"] == {key: None for key in limits}
    assert (
        restored.body["metadata"]["resourceVersion"] != applied.body["metadata"]["resourceVersion"]
    )
    final = kube.get(INGRESS_PUBLIC)
    assert public is not None and final is not None
    assert final["metadata"]["annotations"] == public["metadata"]["annotations"]


def test_ingress_limits_apply_and_revert_exactly(kube: FakeKube, api: KubeApi) -> None:
    existing = {"nginx.ingress.kubernetes.io/limit-connections": "50", "owner": "ml"}
    original = kube.get(kube.put(ingress("llama-public", existing)))
    kube.put(controller_configmap({"limit-req-status-code": "429"}))
    actuator = IngressNginxRateLimit(api, NS, ["llama-public"])
    plan = actuator.plan(IngressRateLimit(rps=10))
    assert "503" not in plan.summary

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert actuator.revert(plan, dry_run=False).status is Status.OK

    patches = _sent(kube, "PATCH")
    assert [p.content_type for p in patches] == [SMP, SMP]
    assert patches[1].body["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/limit-rps": None
    }
    final = kube.get(INGRESS_PUBLIC)
    assert original is not None and final is not None
    assert final["metadata"]["annotations"] == original["metadata"]["annotations"]


def test_unreadable_controller_configmap_is_a_note_not_a_failure(
    kube: FakeKube, api: KubeApi
) -> None:
    kube.put(ingress("llama-public"))
    kube.put(controller_configmap({}))
    kube.fail("GET", CONFIGMAP, 403, reason="Forbidden", message="forbidden")
    actuator = IngressNginxRateLimit(api, NS, ["llama-public"])

    plan = actuator.plan(IngressRateLimit(connections=20))

    assert "could not read ConfigMap ingress-nginx/ingress-nginx-controller (forbidden)" in (
        plan.summary
    )
    result = actuator.apply(plan, dry_run=False)
    assert result.status is Status.OK
    assert "could not read ConfigMap" in result.message()


# -- Envoy Gateway -------------------------------------------------------------------------


def test_backend_traffic_policy_created_then_deleted(kube: FakeKube, api: KubeApi) -> None:
    actuator = EnvoyGatewayRateLimit(api, NS, "llama")
    plan = actuator.plan(20, "Second")
    kube.requests.clear()

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [
        ("GET", POLICY, False),
        ("POST", POLICIES, True),
        ("POST", POLICIES, False),
    ]
    assert _sent(kube, "POST")[0].body == {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "BackendTrafficPolicy",
        "metadata": {
            "name": "llama-detector-rate-limit",
            "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": MANAGER},
        },
        "spec": {
            "targetRefs": [
                {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llama"}
            ],
            "rateLimit": {
                "type": "Local",
                "local": {"rules": [{"limit": {"requests": 20, "unit": "Second"}}]},
            },
        },
    }
    created = kube.get(POLICY)
    assert created is not None
    kube.requests.clear()

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    assert kube.calls() == [
        ("GET", POLICY, False),
        ("DELETE", POLICY, True),
        ("DELETE", POLICY, False),
    ]
    assert _sent(kube, "DELETE")[0].body == {
        "preconditions": {
            "uid": created["metadata"]["uid"],
            "resourceVersion": created["metadata"]["resourceVersion"],
        }
    }
    assert kube.get(POLICY) is None


def test_existing_policy_gets_a_merge_patch_and_its_rate_limit_back(
    kube: FakeKube, api: KubeApi
) -> None:
    user_policy = {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "BackendTrafficPolicy",
        "metadata": {"name": "llama-traffic", "namespace": NS},
        "spec": {
            "targetRefs": [
                {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llama"}
            ],
            "timeout": {"http": {"requestTimeout": "300s"}},
        },
    }
    original = kube.get(kube.put(user_policy))
    path = f"{POLICIES}/llama-traffic"
    actuator = EnvoyGatewayRateLimit(api, NS, "llama", policy="llama-traffic")
    plan = actuator.plan(5, "Second")
    assert "existing policy llama-traffic" in plan.summary

    assert actuator.apply(plan, dry_run=False).status is Status.OK
    applied = _sent(kube, "PATCH")[0]
    assert applied.content_type == MERGE
    assert applied.body["spec"] == {
        "rateLimit": {
            "type": "Local",
            "local": {"rules": [{"limit": {"requests": 5, "unit": "Second"}}]},
        }
    }
    live = kube.get(path)
    assert live is not None
    live["status"] = {
        "ancestors": [
            {"conditions": [{"type": "Accepted", "status": "False", "reason": "Conflicted"}]}
        ]
    }
    kube.put(live)
    checked = actuator.verify(plan)
    assert (checked.status, checked.reason) == (Status.FAILED, "not_accepted")

    assert actuator.revert(plan, dry_run=False).status is Status.OK
    assert _sent(kube, "PATCH")[1].body["spec"] == {"rateLimit": None}
    final = kube.get(path)
    assert original is not None and final is not None
    assert final["spec"] == original["spec"]


# -- RBAC ----------------------------------------------------------------------------------


def test_every_granted_call_is_exercised() -> None:
    """Run last: the tests above together make every call deploy/rbac.yaml grants them."""
    tests = {
        name
        for name, fn in globals().items()
        if name.startswith("test_") and "kube" in inspect.signature(fn).parameters
    }
    if not tests <= _ALL_REQUESTS.keys():
        pytest.skip("needs every test of this module in the same run")
    used = {_permission(r) for requests in _ALL_REQUESTS.values() for r in requests}
    assert used == ACTUATOR_PERMISSIONS
    assert ACTUATOR_PERMISSIONS <= RBAC_PERMISSIONS
