"""The simulated cluster as its APIs show it, and what the detector's writes change.

``SimCluster`` keeps the stand-in API server's objects (``detector.sim.kube_api``) in step
with the model: one Deployment whose container args are the engine's ceilings, its pods
(owned by the ReplicaSet of the template hash, with phase, Ready condition, restart count and
CrashLoopBackOff as the kubelet reports them). The detector's real actuators call that server
through the real ``kubernetes`` client, and write the gateway's nginx include files
(``detector.sim.gateway``); ``apply`` hands what was written to the model at the simulated
moment:

- a Deployment patch whose container args changed -> ``Endpoint.set_deployment_args`` (a
  rolling update, one pod at a time);
- a pod evicted or deleted -> ``Endpoint.evict`` (its ReplicaSet replaces it);
- the nginx include files changed -> ``Endpoint.set_gateway_limit`` (rate, burst, requests
  in progress; none when they hold no limit).

A dry-run request changes nothing. Object shapes:
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/deployment-v1/ ,
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/ .
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from detector.sim.gateway import NginxStandIn
from detector.sim.kube_api import KubeStandIn, Recorded
from detector.sim.model import Endpoint, PodView
from detector.sim.pods import IMAGES, from_flags, to_flags
from detector.sim.scenario import Scenario
from detector.sim.traffic import GatewayLimit

CONTAINER = "vllm"


def engine_args(args: list[str]) -> dict[str, int]:
    """Return the integer flags of a container's args: ``--name=N`` or ``--name N`` -> N.

    >>> engine_args(["--model", "m", "--max-num-seqs=64", "--max-model-len", "32768"])
    {'max-num-seqs': 64, 'max-model-len': 32768}
    """
    out: dict[str, int] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        if not sep and i + 1 < len(args):
            value = args[i + 1]
        if value.isascii() and value.isdigit():
            out[name] = int(value)
    return out


@dataclass
class SimCluster:
    """The API objects of one simulated workload, synced from and written back to the model.

    ``writes`` are what changed the model, ``(offset seconds, "METHOD path")`` for an API
    request and ``(offset, "nginx: limit ...")`` for the gateway, in order: what the actuators
    did.
    """

    endpoint: Endpoint
    kube: KubeStandIn
    gateway: NginxStandIn
    scenario: Scenario
    writes: list[tuple[float, str]] = field(default_factory=list)
    _pending: list[Recorded] = field(default_factory=list)
    _pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> last put
    _generation: int = 1

    def __post_init__(self) -> None:
        self.kube.hooks.append(self._heard)
        self.kube.put(self._deployment(self.endpoint.deployment_args()))

    @property
    def prefix(self) -> str:
        """Return the API path of the workload's namespace in the core group."""
        return f"/api/v1/namespaces/{self.scenario.namespace}"

    @property
    def deployment_path(self) -> str:
        """Return the Deployment's API path."""
        ns, name = self.scenario.namespace, self.scenario.workload
        return f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"

    def _heard(self, request: Recorded) -> None:
        """The server's hook: keep a write for ``apply`` (runs on the server's thread)."""
        if request.method != "GET" and not request.dry_run:
            self._pending.append(request)

    def apply(self) -> None:
        """Hand the writes heard since the last call to the model, in order."""
        pending, self._pending = self._pending, []
        for request in pending:
            if self._apply(request):
                self.writes.append((self.endpoint.now, f"{request.method} {request.path}"))
        if self.gateway.changed():
            limit = self.gateway.limit()
            self.endpoint.set_gateway_limit(limit)
            self.writes.append((self.endpoint.now, f"nginx: {_describe(limit)}"))

    def _apply(self, request: Recorded) -> bool:
        path = request.path.removesuffix("/eviction")
        if path == self.deployment_path and request.method == "PATCH":
            stored = self.kube.get(path) or {}
            flags = engine_args(_container(stored).get("args") or [])
            args = from_flags(self.scenario.engine.kind, flags)
            if args == self.endpoint.deployment_args():
                return False
            self._generation += 1
            self.endpoint.set_deployment_args(args)
            return True
        if path.startswith(f"{self.prefix}/pods/") and request.method in ("POST", "DELETE"):
            if self.kube.get(path) is not None:
                return False  # refused (a precondition or a budget): nothing happened
            self._pods.pop(path, None)
            return self.endpoint.evict(path.rsplit("/", 1)[-1])
        return False

    def in_force(self) -> list[str]:
        """Return what the detector's writes left changed: engine args, the gateway limit."""
        out: list[str] = []
        e = self.scenario.engine
        first = {"max-num-seqs": e.max_num_seqs, "max-num-batched-tokens": e.max_num_batched_tokens,
                 "max-model-len": e.max_model_len}  # fmt: skip
        now = self.endpoint.deployment_args()
        out += [f"--{k}={now[k]} (was {v})" for k, v in first.items() if now.get(k, v) != v]
        if self.endpoint.gateway_limit is not None:
            out.append(f"nginx: {_describe(self.endpoint.gateway_limit)}")
        return out

    def sync(self) -> None:
        """Show the model's pods and the Deployment's status as the API server would."""
        views = self.endpoint.pods()
        seen: set[str] = set()
        for view in views:
            path = f"{self.prefix}/pods/{view.name}"
            seen.add(path)
            obj = self._pod(view)
            if self._pods.get(path) != obj:
                self._pods[path] = obj
                self.kube.put(obj)
        for path in [p for p in self._pods if p not in seen]:
            del self._pods[path]
            with self.kube.lock:
                self.kube.objects.pop(path, None)
        stored = self.kube.get(self.deployment_path)
        if stored is not None:
            status = _deployment_status(views, self._generation, self.endpoint)
            meta = stored["metadata"]
            if stored.get("status") != status or meta.get("generation") != self._generation:
                stored["status"], meta["generation"] = status, self._generation
                self.kube.put(stored)

    def _deployment(self, args: dict[str, int]) -> dict[str, Any]:
        s = self.scenario
        labels = {"app.kubernetes.io/name": s.workload}
        flags = _flags(s.engine.kind, args)
        container = {
            "name": CONTAINER,
            "image": IMAGES[s.engine.kind],
            "args": ["--model", s.model.name, *flags],
        }
        strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": s.workload,
                "namespace": s.namespace,
                "labels": labels,
                "generation": self._generation,
            },
            "spec": {
                "replicas": s.replicas,
                "selector": {"matchLabels": labels},
                "strategy": strategy,
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            },
        }

    def _pod(self, view: PodView) -> dict[str, Any]:
        s = self.scenario
        owner = f"{s.workload}-{view.template_hash}"
        labels = {"app.kubernetes.io/name": s.workload, "pod-template-hash": view.template_hash}
        ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "controller": True}
        state: dict[str, Any] = (
            {"waiting": {"reason": view.waiting_reason}} if view.waiting_reason else {"running": {}}
        )
        ready = "True" if view.ready else "False"
        status = {
            "phase": view.phase,
            "podIP": view.ip,
            "conditions": [{"type": "Ready", "status": ready}],
            "containerStatuses": [
                {
                    "name": CONTAINER,
                    "ready": view.ready,
                    "restartCount": view.restart_count,
                    "state": state,
                }
            ],
        }
        flags = _flags(s.engine.kind, view.engine_args)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": view.name,
                "namespace": s.namespace,
                "uid": view.uid,
                "labels": labels,
                "ownerReferences": [ref],
            },
            "spec": {
                "nodeName": view.node,
                "containers": [{"name": CONTAINER, "args": ["--model", s.model.name, *flags]}],
            },
            "status": status,
        }


def _flags(kind: str, args: dict[str, int]) -> list[str]:
    """Return the container's ``--flag=N`` args of an engine's ceilings."""
    return [f"--{name}={value}" for name, value in to_flags(kind, args).items()]


def _describe(limit: GatewayLimit | None) -> str:
    if limit is None:
        return "no limit"
    parts = []
    if limit.rps is not None:
        conn = f", limit_conn {limit.connections}" if limit.connections is not None else ""
        queue = "" if limit.nodelay else " (queued)"
        parts.append(f"limit_req {limit.rps:g} r/s burst {limit.burst}{queue}{conn}")
    if limit.max_body_bytes is not None:
        parts.append(f"client_max_body_size {limit.max_body_bytes} bytes")
    return "; ".join(parts)


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    found = [c for c in spec.get("containers") or [] if c.get("name") == CONTAINER]
    return copy.deepcopy(found[0]) if found else {}


def _deployment_status(views: list[PodView], generation: int, ep: Endpoint) -> dict[str, Any]:
    wanted = ep.deployment_args()
    ready = sum(v.ready for v in views)
    updated = sum(v.engine_args == wanted for v in views)
    return {
        "observedGeneration": generation,
        "replicas": len(views),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "updatedReplicas": updated,
        "unavailableReplicas": len(views) - ready,
        "conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}],
    }
