"""The Kubernetes step actuators of a process, built from ``containment.kubernetes``.

One ``KubeApi`` (the official client, from a kubeconfig file or the in-cluster service
account, ``retries = 0``) serves every workload; each step's params name the object:

- ``lower_batch_ceiling``: the step's ``namespace``/``workload`` Deployment (``workload_kind``
  must be Deployment), its engine's ceilings from the rendered ``settings``
  (``ceilings_from_step``), rolled out one pod at a time;
- ``stagger_restarts``: the engine hands over one pod per move (``pod`` param, in the planned
  order, spaced); each is evicted (PodDisruptionBudgets respected) or deleted;
- ``enable_rate_limit``: ingress-nginx annotations on the step's Ingress (or the mapped ones),
  or an Envoy Gateway BackendTrafficPolicy on its HTTPRoute.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

from kubernetes import client, config

from detector.actuators.base import ActuatorError, Plan
from detector.actuators.kubernetes_api import FIELD_MANAGER, ApiRequest, KubeApi, Verb
from detector.actuators.kubernetes_gateways import (
    EnvoyGatewayRateLimit,
    IngressNginxRateLimit,
    ingress_limit_from_step,
    policy_requests_from_step,
)
from detector.actuators.kubernetes_patch import ENGINE_PARAMS, parse_fields
from detector.actuators.kubernetes_workloads import (
    DeploymentCeilings,
    DeploymentTarget,
    PodEvictor,
    ceilings_from_step,
)
from detector.actuators.registry_binding import KeyedBinding, workload_of
from detector.config import KubernetesSettings
from detector.errors import ConfigError
from detector.runbooks.planner import PlannedStep

log = logging.getLogger(__name__)
_CONTAINER_KEY = re.compile(r"^containers\[(?P<c>[^\]]+)\]\.(?:args|command|env)\[(?P<n>[^\]]+)\]$")
CeilingKey = tuple[str, str, str | None, str]  # namespace, Deployment, container, engine


class ManagedKubeApi(KubeApi):
    """``KubeApi`` whose PATCHes and creates name ``field_manager`` (managedFields)."""

    def __init__(self, api_client: client.ApiClient, *, timeout_s: float, field_manager: str):
        super().__init__(api_client, timeout_s=timeout_s)
        self.field_manager = field_manager

    def send(self, request: ApiRequest, *, dry_run: bool = False) -> dict[str, Any] | None:
        """Send one write as ``KubeApi.send`` does, with this field manager."""
        extra: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        if request.verb in (Verb.PATCH, Verb.CREATE):
            extra["field_manager"] = self.field_manager
        log.info("kubernetes call dry_run=%s request=%s", dry_run, request.describe())
        return self._call(request, extra)


def kube_api(cfg: KubernetesSettings) -> KubeApi:
    """Return the API adapter of ``cfg``; ConfigError when its credentials cannot be loaded."""
    configuration = client.Configuration()
    try:
        if cfg.kubeconfig is None:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=str(cfg.kubeconfig),
                context=cfg.context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (config.ConfigException, OSError, ValueError, TypeError) as exc:
        where = cfg.kubeconfig or "the in-cluster service account"
        raise ConfigError(f"containment.kubernetes: cannot load {where}: {exc}") from exc
    configuration.retries = 0  # urllib3 would re-send a GET or DELETE after a read timeout
    api_client = client.ApiClient(configuration)
    if cfg.field_manager == FIELD_MANAGER:
        return KubeApi(api_client, timeout_s=cfg.request_timeout_s)
    return ManagedKubeApi(
        api_client, timeout_s=cfg.request_timeout_s, field_manager=cfg.field_manager
    )


def _target_parts(target: str, prefix: str) -> list[str]:
    """Return the ``/`` parts after ``kubernetes:PREFIX/``; ActuatorError when another kind."""
    head = f"kubernetes:{prefix}/"
    parts = target.removeprefix(head).split("/")
    if not target.startswith(head) or not all(parts):
        raise ActuatorError("invalid_request", f"{target} is not a {prefix} target")
    return parts


def ceiling_key_of_plan(plan: Plan) -> CeilingKey:
    """Return (namespace, Deployment, container, engine) that a ceilings plan was made for.

    The engine is the one whose flags or env variables the plan's fields name (each engine's
    concurrency ceiling is its own). Raises ActuatorError(``invalid_request``).
    """
    namespace, name = _target_parts(plan.target, "deployments.apps")[:2]
    seen: set[str] = set()
    containers: set[str] = set()
    for change in plan.changes:
        for text in (change.before, change.after):
            for key in parse_fields(text or ""):
                match = _CONTAINER_KEY.match(key)
                if match is not None:
                    containers.add(match["c"])
                    seen.add(match["n"])
    scores = {
        engine: sum(1 for p in params.values() if {p.flag, p.env} & seen)
        for engine, params in ENGINE_PARAMS.items()
    }
    engine = max(scores, key=lambda e: scores[e])
    if len(containers) != 1 or scores[engine] == 0:
        raise ActuatorError("invalid_request", f"{plan.target}: no engine ceiling in the plan")
    return namespace, name, containers.pop(), engine


def ceilings(api: KubeApi, cfg: KubernetesSettings) -> KeyedBinding[CeilingKey, DeploymentCeilings]:
    """Return the ``lower_batch_ceiling`` binding: Deployment args or env, by engine."""

    def key_of_step(step: PlannedStep) -> CeilingKey:
        kind = step.params.get("workload_kind")
        if kind != "Deployment":
            raise ActuatorError("unsupported", f"{kind} ceilings are not patched: a Deployment")
        engine, _ = ceilings_from_step(step)
        namespace, name = workload_of(step).split("/")
        return namespace, name, cfg.containers.get(f"{namespace}/{name}"), engine

    def build(key: CeilingKey) -> DeploymentCeilings:
        namespace, name, container, engine = key
        target = DeploymentTarget(namespace, name, container)
        return DeploymentCeilings(api, target, engine, rollout=cfg.rollout)

    return KeyedBinding(
        key_of_step=key_of_step,
        key_of_plan=ceiling_key_of_plan,
        build=build,
        plan_for=lambda act, step: act.plan(ceilings_from_step(step)[1]),
    )


def _pod_of(step: PlannedStep) -> str:
    pod = step.params.get("pod")
    if not pod:
        raise ActuatorError("invalid_request", f"step {step.step_id!r}: no pod to restart")
    return pod


def evictions(api: KubeApi, cfg: KubernetesSettings) -> KeyedBinding[str, PodEvictor]:
    """Return the ``stagger_restarts`` binding: the pod of each restart move, evicted.

    The engine moves one pod at a time in the planned order (``pod`` param), spaced by the
    step's ``spacing_s``; one ``PodEvictor`` per namespace plans each.
    """
    mode: Literal["evict", "delete"] = "evict" if cfg.restart_method == "eviction" else "delete"

    def namespace_of(step: PlannedStep) -> str:
        return workload_of(step).split("/")[0]

    return KeyedBinding(
        key_of_step=namespace_of,
        key_of_plan=lambda plan: _target_parts(plan.target, "pods")[0],
        build=lambda ns: PodEvictor(api, ns, mode=mode, grace_period_s=cfg.grace_period_s),
        plan_for=lambda act, step: act.plan(_pod_of(step)),
    )


IngressKey = tuple[str, tuple[str, ...]]


def ingress_limits(
    api: KubeApi, cfg: KubernetesSettings
) -> KeyedBinding[IngressKey, IngressNginxRateLimit]:
    """Return the ``enable_rate_limit`` binding through ingress-nginx annotations."""
    configmap = (cfg.controller_configmap_namespace, cfg.controller_configmap_name)

    def key_of_step(step: PlannedStep) -> IngressKey:
        key = workload_of(step, "ingress")
        namespace, ingress = key.split("/")
        return namespace, tuple(cfg.ingresses.get(key) or [ingress])

    def key_of_plan(plan: Plan) -> IngressKey:
        namespace, names = _target_parts(plan.target, "ingresses.networking.k8s.io")[:2]
        return namespace, tuple(names.split(","))

    return KeyedBinding(
        key_of_step=key_of_step,
        key_of_plan=key_of_plan,
        build=lambda key: IngressNginxRateLimit(
            api, key[0], list(key[1]), controller_configmap=configmap
        ),
        plan_for=lambda act, step: act.plan(ingress_limit_from_step(step)),
    )


POLICY_SUFFIX = "-detector-rate-limit"  # EnvoyGatewayRateLimit's default policy name


def gateway_policies(
    api: KubeApi, cfg: KubernetesSettings
) -> KeyedBinding[tuple[str, str], EnvoyGatewayRateLimit]:
    """Return the ``enable_rate_limit`` binding through an Envoy Gateway policy per route."""

    def key_of_step(step: PlannedStep) -> tuple[str, str]:
        key = workload_of(step, "ingress")
        namespace, route = key.split("/")
        return namespace, cfg.http_routes.get(key, route)

    def key_of_plan(plan: Plan) -> tuple[str, str]:
        parts = _target_parts(plan.target, "backendtrafficpolicies.gateway.envoyproxy.io")
        return parts[0], parts[1].removesuffix(POLICY_SUFFIX)

    return KeyedBinding(
        key_of_step=key_of_step,
        key_of_plan=key_of_plan,
        build=lambda key: EnvoyGatewayRateLimit(api, key[0], key[1]),
        plan_for=lambda act, step: act.plan(policy_requests_from_step(step)),
    )
