"""The Kubernetes step actuators of a process, built from ``containment.kubernetes``.

One ``KubeApi`` (the official client, from a kubeconfig file or the in-cluster service
account, ``retries = 0``) serves every workload; each step's params name the object:

- ``lower_batch_ceiling``: the engine's ceilings from the rendered ``settings``
  (``ceilings_from_step``) in the step's ``namespace``/``workload``, resolved from its
  ``workload_kind`` to the controller that owns the pod template
  (``detector.actuators.kubernetes.resolve``): a Deployment, StatefulSet, Argo Rollout or
  LeaderWorkerSet, rolled out one pod (one group) at a time;
- ``stagger_restarts``: the step machine hands over one pod per move (``pod`` param, in the
  planned order, spaced); each is evicted (PodDisruptionBudgets respected) or deleted, a
  LeaderWorkerSet group through its leader pod, and an Argo Rollout restarts through its own
  ``spec.restartAt`` (``detector.actuators.kubernetes.restarts``);
- a workload step the detector does not make (a kind it does not know, a controller owned by
  another, a Rollout with ``workloadRef`` or blueGreen, flags in a shell string) is planned
  by ``ManualFallback`` as what to do by hand, and fails with reason ``manual``;
- ``enable_rate_limit``: ingress-nginx annotations on the step's Ingress (or the mapped ones),
  or an Envoy Gateway BackendTrafficPolicy on its HTTPRoute;
- ``quarantine_requests``: ingress-nginx's ``proxy-body-size`` on the same Ingresses.

``ceilings_from_step``, ``ingress_limit_from_step`` and ``policy_requests_from_step`` turn a
planned step's params into what those actuators take.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes import client, config

from detector.actuators.base import ActionResult, ActuatorError, Plan, Reason
from detector.actuators.kubernetes.actuator import KubernetesActuator
from detector.actuators.kubernetes.api import (
    DEPLOYMENTS,
    FIELD_MANAGER,
    ROLLOUTS,
    ApiRequest,
    KubeApi,
    Verb,
)
from detector.actuators.kubernetes.controllers import CONTROLLERS
from detector.actuators.kubernetes.gateways import (
    EnvoyGatewayRateLimit,
    IngressNginxAdmission,
    IngressNginxRateLimit,
    IngressRateLimit,
)
from detector.actuators.kubernetes.patch import ENGINE_PARAMS, engine_params, parse_fields
from detector.actuators.kubernetes.resolve import (
    MANUAL_PREFIX,
    RESTARTABLE,
    SUPPORTED,
    ManualStep,
    Workload,
    ceilings_by_hand,
    resolve_workload,
    restart_by_hand,
)
from detector.actuators.kubernetes.restarts import PodRestarts
from detector.actuators.kubernetes.templates import (
    ControllerCeilings,
    RolloutRestart,
    WorkloadTarget,
)
from detector.actuators.kubernetes.workloads import DeploymentCeilings, DeploymentTarget
from detector.capacity.numbers import coerce_int
from detector.config import KubernetesSettings
from detector.errors import ConfigError
from detector.runbooks.bindings.base import StepActuator
from detector.runbooks.bindings.keyed import KeyedBinding, workload_of
from detector.runbooks.bindings.nginx import admission_from_step
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep
from detector.runbooks.rate_limits import aggregate_limit

log = logging.getLogger(__name__)
_CONTAINER_KEY = re.compile(
    r"^(?:[A-Za-z]+Template\.)?containers\[(?P<c>[^\]]+)\]\.(?:args|command|env)\[(?P<n>[^\]]+)\]$"
)
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
CeilingKey = tuple[str, str, str | None, str]  # namespace, Deployment, container, engine
WorkloadKey = tuple[str, str, str, str | None, str]  # kind, namespace, name, container, engine
RestartKey = tuple[str, ...]  # ("rollout", namespace, name) | ("pods", namespace, kind, name)
_KINDS = {DEPLOYMENTS.label: "Deployment", **{c.kind.label: c.name for c in CONTROLLERS.values()}}


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

    ``limit_rps`` and ``limit_connections`` as the planner computed them: per client IP and
    controller replica (ingress-nginx counts them so), sized from the clients seen so that
    the aggregate stays within the healthy capacity left where it can, floors applied; the
    step's ``aggregate_bound_rps`` says what they bound in all (``ingress_bound_note``). The
    Ingress is the step's ``namespace``/``ingress``. Raises ActuatorError(``invalid_request``)
    for another action or a bad value.
    """
    if step.action is not Action.ENABLE_RATE_LIMIT:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not a rate limit",
        )
    rps, connections = _step_int(step, "limit_rps"), _step_int(step, "limit_connections")
    return IngressRateLimit(rps=rps, connections=connections)


def ingress_bound_note(step: PlannedStep) -> str:
    """Return what a step's per-client ingress-nginx limits bound in aggregate ("" unknown).

    E.g. ``per client: at most 80/s against an aggregate budget of 0.8/s (80 clients seen)``,
    from the step's ``aggregate_bound_rps``, ``aggregate_budget_rps`` and ``clients_seen``.
    """
    p = step.params
    bound, budget = p.get("aggregate_bound_rps"), p.get("aggregate_budget_rps")
    if not bound or not budget:
        return ""
    clients = p.get("clients_seen", "unknown")
    return (
        f"per client: at most {bound}/s against an aggregate budget of {budget}/s "
        f"({clients} clients seen); only an aggregate limiter bounds the total"
    )


def policy_limit_from_step(step: PlannedStep, *, replicas: int = 1) -> tuple[int, str]:
    """Return (requests, unit) of an Envoy Gateway local rate limit for a planned step.

    A local limit counts in each Envoy replica, so each gets the step's aggregate limit
    (``rate_limits.aggregate_limit``, requests per minute, relaxed by the lift) / ``replicas``:
    whole requests per ``Second`` when that is at least 1/s (rounded down, never above the
    budget), else per ``Minute`` (at least 1). Source:
    https://gateway.envoyproxy.io/docs/tasks/traffic/local-rate-limit/ . Raises
    ActuatorError(``invalid_request``) for another action or a step without a rate.
    """
    ingress_limit_from_step(step)  # the action and the per-client values are valid
    limit = aggregate_limit(step.params)
    if limit is None:
        raise ActuatorError(Reason.INVALID_REQUEST, f"step {step.step_id!r} has no rate limit")
    per_replica = limit.rpm / max(replicas, 1)
    if per_replica >= 60:
        return math.floor(per_replica / 60), "Second"
    return max(1, math.floor(per_replica)), "Minute"


def policy_requests_from_step(step: PlannedStep, *, replicas: int = 1) -> int:
    """Return the whole requests per second of an Envoy Gateway policy for a planned step.

    ``policy_limit_from_step`` in requests per second (at least 1). Raises
    ActuatorError(``invalid_request``) for another action or a missing rate.
    """
    requests, unit = policy_limit_from_step(step, replicas=replicas)
    return requests if unit == "Second" else max(1, requests // 60)


def _target_parts(target: str, prefix: str) -> list[str]:
    """Return the ``/`` parts after ``kubernetes:PREFIX/``; ActuatorError when another kind."""
    head = f"kubernetes:{prefix}/"
    parts = target.removeprefix(head).split("/")
    if not target.startswith(head) or not all(parts):
        raise ActuatorError(Reason.INVALID_REQUEST, f"{target} is not a {prefix} target")
    return parts


def _engine_of_plan(plan: Plan) -> tuple[str, set[str]]:
    """Return the engine whose flags or env variables a ceilings plan's fields name, and the
    containers they are in; ActuatorError(``invalid_request``) when it names no ceiling."""
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
    if scores[engine] == 0:
        raise ActuatorError(Reason.INVALID_REQUEST, f"{plan.target}: no engine ceiling in the plan")
    return engine, containers


def ceiling_key_of_plan(plan: Plan) -> CeilingKey:
    """Return (namespace, Deployment, container, engine) that a ceilings plan was made for.

    The engine is the one whose flags or env variables the plan's fields name (each engine's
    concurrency ceiling is its own). Raises ActuatorError(``invalid_request``).
    """
    namespace, name = _target_parts(plan.target, "deployments.apps")[:2]
    engine, containers = _engine_of_plan(plan)
    if len(containers) != 1:
        raise ActuatorError(Reason.INVALID_REQUEST, f"{plan.target}: no engine ceiling in the plan")
    return namespace, name, containers.pop(), engine


class ManualFallback:
    """Plan through ``inner``; a step it refuses with reason ``manual`` becomes a manual plan.

    The error's message says what to do by hand; the plan (``ManualStep``, target
    ``kubernetes:manual/KIND/NAMESPACE/NAME``) changes nothing and carries it as its summary.
    Apply and revert of a manual plan, also one read back from the store, go to ``ManualStep``
    (apply fails with reason ``manual`` and the instructions); every other plan to ``inner``.
    """

    def __init__(self, inner: StepActuator) -> None:
        self.inner = inner
        self.manual = ManualStep()

    def plan_step(self, step: PlannedStep) -> Plan:
        """Return ``inner``'s plan of ``step``, or the manual plan of a ``manual`` refusal."""
        try:
            return self.inner.plan_step(step)
        except ActuatorError as exc:
            if exc.reason != Reason.MANUAL:
                raise
            text = exc.detail
        namespace, name = workload_of(step).split("/")
        workload = Workload(step.params.get("workload_kind") or "unknown", namespace, name)
        log.info("manual step step=%s workload=%s: %s", step.step_id, workload.label, text)
        return self.manual.plan(step.action.value, workload, text)

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Apply through ``inner``; a manual plan fails with its instructions."""
        if plan.target.startswith(MANUAL_PREFIX):
            return self.manual.apply(plan, dry_run=dry_run)
        return self.inner.apply(plan, dry_run=dry_run)

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Revert through ``inner``; a manual plan changed nothing (``unchanged``)."""
        if plan.target.startswith(MANUAL_PREFIX):
            return self.manual.revert(plan, dry_run=dry_run)
        return self.inner.revert(plan, dry_run=dry_run)


def _not_patched(workload: Workload) -> str | None:
    """Return why the detector does not patch ``workload``'s ceilings, or None."""
    if workload.managed_by is not None:
        kind, name = workload.managed_by
        return (
            f"{workload.label} is managed by {kind} {name} (its controller reference): a patch "
            "to it would be undone"
        )
    if workload.kind == "unknown":
        return f"pod {workload.namespace}/{workload.name} has no controller the detector knows"
    if workload.kind not in SUPPORTED:
        return f"the detector does not patch the ceilings of kind {workload.kind}"
    return None


WorkloadCeilings = DeploymentCeilings | ControllerCeilings


def ceilings(api: KubeApi, cfg: KubernetesSettings) -> ManualFallback:
    """Return the ``lower_batch_ceiling`` binding: the engine args or env of the pod template
    of the workload's controller (Deployment, StatefulSet, Rollout, LeaderWorkerSet)."""

    def container_of(namespace: str, *names: str) -> str | None:
        return next((c for n in names if (c := cfg.containers.get(f"{namespace}/{n}"))), None)

    def key_of_step(step: PlannedStep) -> WorkloadKey:
        engine, wanted = ceilings_from_step(step)
        namespace, name = workload_of(step).split("/")
        kind = step.params.get("workload_kind") or ""
        workload = resolve_workload(api, kind, namespace, name)
        container = container_of(namespace, name, workload.name)
        why = _not_patched(workload)
        if why is not None:
            text = ceilings_by_hand(workload, engine, wanted, why, container)
            raise ActuatorError(Reason.MANUAL, text)
        return workload.kind, namespace, workload.name, container, engine

    def key_of_plan(plan: Plan) -> WorkloadKey:
        label = plan.target.removeprefix("kubernetes:").split("/")[0]
        kind = _KINDS.get(label)
        if kind is None:
            raise ActuatorError(Reason.INVALID_REQUEST, f"{plan.target} is not a workload target")
        if kind == "Deployment":
            namespace, name, container, engine = ceiling_key_of_plan(plan)
            return kind, namespace, name, container, engine
        namespace, name = _target_parts(plan.target, label)[:2]
        return kind, namespace, name, container_of(namespace, name), _engine_of_plan(plan)[0]

    def build(key: WorkloadKey) -> WorkloadCeilings:
        kind, namespace, name, container, engine = key
        if kind == "Deployment":
            target = DeploymentTarget(namespace, name, container)
            return DeploymentCeilings(api, target, engine, rollout=cfg.rollout)
        workload = WorkloadTarget(CONTROLLERS[kind], namespace, name, container)
        return ControllerCeilings(api, workload, engine, rollout=cfg.rollout)

    def plan_for(act: WorkloadCeilings, step: PlannedStep) -> Plan:
        engine, wanted = ceilings_from_step(step)
        try:
            return act.plan(wanted)
        except ActuatorError as exc:
            if exc.reason != Reason.UNSUPPORTED:
                raise
            if isinstance(act, DeploymentCeilings):
                d = act.deployment
                workload, container = Workload("Deployment", d.namespace, d.name), d.container
            else:
                w = act.workload
                workload = Workload(w.controller.name, w.namespace, w.name)
                container = w.container
            text = ceilings_by_hand(workload, engine, wanted, exc.detail, container)
            raise ActuatorError(Reason.MANUAL, text) from exc

    binding: KeyedBinding[WorkloadKey, WorkloadCeilings] = KeyedBinding(
        key_of_step=key_of_step, key_of_plan=key_of_plan, build=build, plan_for=plan_for
    )
    return ManualFallback(binding)


def _pod_of(step: PlannedStep) -> str:
    pod = step.params.get("pod")
    if not pod:
        raise ActuatorError(Reason.INVALID_REQUEST, f"step {step.step_id!r}: no pod to restart")
    return pod


def _pods_of(step: PlannedStep) -> list[str]:
    """Return the step's planned restart order (its ``pods`` param, a JSON list)."""
    try:
        pods = json.loads(step.params.get("pods") or "[]")
    except ValueError:
        return []
    return [str(p) for p in pods] if isinstance(pods, list) else []


def evictions(
    api: KubeApi,
    cfg: KubernetesSettings,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> ManualFallback:
    """Return the ``stagger_restarts`` binding: one restart move per pod, by its controller.

    The engine moves one pod at a time in the planned order (``pod`` param), spaced by the
    step's ``spacing_s``. Each move evicts the pod (``PodRestarts``: a LeaderWorkerSet group
    through its leader); for an Argo Rollout a move sets ``spec.restartAt`` to ``clock()``
    (the wall clock: Argo compares it with pod creation times) unless Argo restarts that pod
    already (``RolloutRestart.plan_move``). Pods of other kinds are restarted by hand
    (``manual``).
    """
    mode: Literal["evict", "delete"] = "evict" if cfg.restart_method == "eviction" else "delete"

    def key_of_step(step: PlannedStep) -> RestartKey:
        namespace, name = workload_of(step).split("/")
        workload = resolve_workload(api, step.params.get("workload_kind") or "", namespace, name)
        if workload.kind == "Rollout":
            return "rollout", namespace, workload.name
        if workload.kind not in RESTARTABLE:
            why = f"the detector does not restart the pods of kind {workload.kind}"
            raise ActuatorError(Reason.MANUAL, restart_by_hand(workload, _pod_of(step), why))
        return "pods", namespace, workload.kind, workload.name

    def key_of_plan(plan: Plan) -> RestartKey:
        if plan.target.startswith(f"kubernetes:{ROLLOUTS.label}/"):
            namespace, name = _target_parts(plan.target, ROLLOUTS.label)[:2]
            return "rollout", namespace, name
        return "pods", _target_parts(plan.target, "pods")[0], "", ""

    def build(key: RestartKey) -> KubernetesActuator:
        if key[0] == "rollout":
            return RolloutRestart(api, key[1], key[2])
        workload = Workload(key[2], key[1], key[3]) if key[2] else None
        return PodRestarts(api, key[1], workload, mode=mode, grace_period_s=cfg.grace_period_s)

    def plan_for(act: KubernetesActuator, step: PlannedStep) -> Plan:
        pod, order = _pod_of(step), _pods_of(step)
        if isinstance(act, RolloutRestart):
            return act.plan_move(pod, clock())
        if not isinstance(act, PodRestarts):
            raise ActuatorError(Reason.INVALID_REQUEST, f"{act.target} restarts no pod")
        return act.plan_move(pod, order)

    binding: KeyedBinding[RestartKey, KubernetesActuator] = KeyedBinding(
        key_of_step=key_of_step, key_of_plan=key_of_plan, build=build, plan_for=plan_for
    )
    return ManualFallback(binding)


IngressKey = tuple[str, tuple[str, ...]]


def _ingress_key_of_step(cfg: KubernetesSettings) -> Callable[[PlannedStep], IngressKey]:
    """Return the step -> (namespace, Ingresses) of ``cfg.ingresses`` (default: the step's)."""

    def key_of_step(step: PlannedStep) -> IngressKey:
        key = workload_of(step, "ingress")
        namespace, ingress = key.split("/")
        return namespace, tuple(cfg.ingresses.get(key) or [ingress])

    return key_of_step


def _ingress_key_of_plan(plan: Plan) -> IngressKey:
    namespace, names = _target_parts(plan.target, "ingresses.networking.k8s.io")[:2]
    return namespace, tuple(names.split(","))


def ingress_admission(
    api: KubeApi, cfg: KubernetesSettings
) -> KeyedBinding[IngressKey, IngressNginxAdmission]:
    """Return the ``quarantine_requests`` binding through ingress-nginx's ``proxy-body-size``
    on the Ingresses the rate limit uses."""
    return KeyedBinding(
        key_of_step=_ingress_key_of_step(cfg),
        key_of_plan=_ingress_key_of_plan,
        build=lambda key: IngressNginxAdmission(api, key[0], list(key[1])),
        plan_for=lambda act, step: act.plan(admission_from_step(step)),
    )


def ingress_limits(
    api: KubeApi, cfg: KubernetesSettings
) -> KeyedBinding[IngressKey, IngressNginxRateLimit]:
    """Return the ``enable_rate_limit`` binding through ingress-nginx annotations."""
    configmap = (cfg.controller_configmap_namespace, cfg.controller_configmap_name)

    def plan_for(act: IngressNginxRateLimit, step: PlannedStep) -> Plan:
        plan = act.plan(ingress_limit_from_step(step))
        note = ingress_bound_note(step)
        return replace(plan, summary=f"{plan.summary}; {note}") if note else plan

    return KeyedBinding(
        key_of_step=_ingress_key_of_step(cfg),
        key_of_plan=_ingress_key_of_plan,
        build=lambda key: IngressNginxRateLimit(
            api, key[0], list(key[1]), controller_configmap=configmap
        ),
        plan_for=plan_for,
    )


POLICY_SUFFIX = "-detector-rate-limit"  # EnvoyGatewayRateLimit's default policy name


def gateway_policies(
    api: KubeApi, cfg: KubernetesSettings
) -> KeyedBinding[tuple[str, str], EnvoyGatewayRateLimit]:
    """Return the ``enable_rate_limit`` binding through an Envoy Gateway policy per route.

    The policy's local limit is the step's aggregate limit divided by
    ``cfg.envoy_gateway_replicas`` (each Envoy replica counts alone).
    """
    replicas = cfg.envoy_gateway_replicas

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
        plan_for=lambda act, step: act.plan(
            *policy_limit_from_step(step, replicas=replicas), replicas=replicas
        ),
    )
