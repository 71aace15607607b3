"""The Kubernetes step actuators of a process, built from ``containment.kubernetes``.

One ``KubeApi`` (the official client, from a kubeconfig file or the in-cluster service
account, ``retries = 0``) serves every workload; each step's params name the object:

- ``lower_batch_ceiling``: the step's ``namespace``/``workload`` Deployment (``workload_kind``
  must be Deployment), its engine's ceilings from the rendered ``settings``
  (``ceilings_from_step``), rolled out one pod at a time;
- ``stagger_restarts``: the step machine hands over one pod per move (``pod`` param, in the planned
  order, spaced); each is evicted (PodDisruptionBudgets respected) or deleted;
- ``enable_rate_limit``: ingress-nginx annotations on the step's Ingress (or the mapped ones),
  or an Envoy Gateway BackendTrafficPolicy on its HTTPRoute.

``ceilings_from_step``, ``ingress_limit_from_step`` and ``policy_requests_from_step`` turn a
planned step's params into what those actuators take.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

from kubernetes import client, config

from detector.actuators.base import ActuatorError, Plan, Reason
from detector.actuators.kubernetes.api import FIELD_MANAGER, ApiRequest, KubeApi, Verb
from detector.actuators.kubernetes.gateways import (
    EnvoyGatewayRateLimit,
    IngressNginxRateLimit,
    IngressRateLimit,
)
from detector.actuators.kubernetes.patch import ENGINE_PARAMS, engine_params, parse_fields
from detector.actuators.kubernetes.workloads import DeploymentCeilings, DeploymentTarget, PodEvictor
from detector.capacity.numbers import coerce_int
from detector.config import KubernetesSettings
from detector.errors import ConfigError
from detector.runbooks.bindings.keyed import KeyedBinding, workload_of
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep

log = logging.getLogger(__name__)
_CONTAINER_KEY = re.compile(r"^containers\[(?P<c>[^\]]+)\]\.(?:args|command|env)\[(?P<n>[^\]]+)\]$")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
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


def ceilings_from_step(step: PlannedStep) -> tuple[str, dict[str, str]]:
    """Return (engine, ceilings by engine name) of a planned ``lower_batch_ceiling`` step.

    The ceilings are the step's rendered ``settings`` param (``--max-num-seqs=13
    --max-model-len=32768`` for vLLM and SGLang, ``MAX_CONCURRENT_REQUESTS=8 ...`` for TGI),
    each flag or env variable mapped to its ``ENGINE_PARAMS`` name, e.g.
    ``("vllm", {"max_num_seqs": "13", "max_model_len": "32768"})``; the step's computed
    ``new_ceiling`` fills ``ceiling_param`` when ``settings`` lacks it. Raises
    ActuatorError(``invalid_request``): another action, an unknown engine (the runbook then
    says "set by hand"), a setting that is not a number or not the engine's, no ceiling.
    """
    if step.action is not Action.LOWER_BATCH_CEILING:
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"step {step.step_id!r} is {step.action.value}, not a ceiling"
        )
    engine = step.params.get("engine", "")
    params = engine_params(engine)
    names = {p.flag: n for n, p in params.items() if p.flag}
    names |= {p.env: n for n, p in params.items() if p.env}
    ceilings: dict[str, str] = {}
    for word in step.params.get("settings", "").split():
        key, sep, value = word.partition("=")
        if not sep or key not in names or not _NUMBER.fullmatch(value):
            raise ActuatorError(
                Reason.INVALID_REQUEST, f"step {step.step_id!r}: {word!r} is not a {engine} ceiling"
            )
        ceilings[names[key]] = value
    param, new = step.params.get("ceiling_param", ""), step.params.get("new_ceiling", "")
    if param in params and param not in ceilings and _NUMBER.fullmatch(new):
        ceilings[param] = new
    if not ceilings:
        raise ActuatorError(Reason.INVALID_REQUEST, f"step {step.step_id!r} sets no ceiling")
    return engine, ceilings


def _step_int(step: PlannedStep, name: str) -> int | None:
    """Return the step's integer param ``name``; ActuatorError when set but not an int >= 1."""
    raw = step.params.get(name)
    value = coerce_int(raw)
    if raw is not None and (value is None or value < 1):
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"step {step.step_id!r}: {name} {raw!r} is not an int >= 1"
        )
    return value


def ingress_limit_from_step(step: PlannedStep) -> IngressRateLimit:
    """Return the ingress-nginx limits of a planned ``enable_rate_limit`` step.

    ``limit_rps`` and ``limit_connections`` as the planner computed them (healthy capacity
    left, floors applied); the Ingress is the step's ``namespace``/``ingress``. Raises
    ActuatorError(``invalid_request``) for another action or a bad value.
    """
    if step.action is not Action.ENABLE_RATE_LIMIT:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not a rate limit",
        )
    rps, connections = _step_int(step, "limit_rps"), _step_int(step, "limit_connections")
    return IngressRateLimit(rps=rps, connections=connections)


def policy_requests_from_step(step: PlannedStep) -> int:
    """Return the requests per second of an Envoy Gateway policy: the step's ``limit_rps``.

    Raises ActuatorError(``invalid_request``) for another action or a missing rate.
    """
    rps = ingress_limit_from_step(step).rps
    if rps is None:
        raise ActuatorError(Reason.INVALID_REQUEST, f"step {step.step_id!r} has no limit_rps")
    return rps


def _target_parts(target: str, prefix: str) -> list[str]:
    """Return the ``/`` parts after ``kubernetes:PREFIX/``; ActuatorError when another kind."""
    head = f"kubernetes:{prefix}/"
    parts = target.removeprefix(head).split("/")
    if not target.startswith(head) or not all(parts):
        raise ActuatorError(Reason.INVALID_REQUEST, f"{target} is not a {prefix} target")
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
        raise ActuatorError(Reason.INVALID_REQUEST, f"{plan.target}: no engine ceiling in the plan")
    return namespace, name, containers.pop(), engine


def ceilings(api: KubeApi, cfg: KubernetesSettings) -> KeyedBinding[CeilingKey, DeploymentCeilings]:
    """Return the ``lower_batch_ceiling`` binding: Deployment args or env, by engine."""

    def key_of_step(step: PlannedStep) -> CeilingKey:
        kind = step.params.get("workload_kind")
        if kind != "Deployment":
            raise ActuatorError(
                Reason.UNSUPPORTED, f"{kind} ceilings are not patched: a Deployment"
            )
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
        raise ActuatorError(Reason.INVALID_REQUEST, f"step {step.step_id!r}: no pod to restart")
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
