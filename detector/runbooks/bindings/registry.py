"""The actuators a process acts through, built from its settings.

``step_actuators(settings)`` returns the registry ``ContainmentFlows`` uses, by runbook action.
Only the actions whose target is configured are registered; an action without one is
recorded as a dry-run change (``detector.runbooks.runner.DryRunActuator``). Even a
registered actuator acts for real only for an armed workload in a process that is not in
dry-run; otherwise it reads and records the exact change.

- ``enable_rate_limit``: the gateway ``containment.rate_limit_driver()`` names: plain nginx
  (``containment.nginx``), ingress-nginx annotations or an Envoy Gateway policy
  (``containment.kubernetes``), Kong's ``rate-limiting`` plugin (``containment.kong``), or
  Envoy's local rate limit switched on at runtime (``containment.envoy``);
- ``quarantine_requests``: plain nginx's admission include (``containment.nginx`` with
  ``admission_include``) when nginx is the gateway, ingress-nginx's ``proxy-body-size`` on
  the rate limit's Ingresses when ingress-nginx is; other gateways (Kong, Envoy): a dry-run
  record of the rule (not driven yet);
- ``lower_batch_ceiling``: ``containment.batch_ceiling_driver()``: the engine args or env
  in the pod template of the workload's controller, a Deployment, StatefulSet, Argo Rollout
  or LeaderWorkerSet (``kubernetes``), a Triton model reload (``triton``) or Ray Serve
  ``max_ongoing_requests`` (``rayserve``);
- ``stagger_restarts``: pod evictions (or deletes), a LeaderWorkerSet group through its
  leader, an Argo Rollout through ``spec.restartAt``, when ``containment.kubernetes`` is set.

A Kubernetes workload step the detector does not make is planned as what to do by hand and
fails with reason ``manual`` (``bindings.kubernetes.ManualFallback``).

The Kubernetes bindings are in :mod:`detector.runbooks.bindings.kubernetes`; each other
family's step translator (``rate_limit_from_step`` ...) in its own module of this package
(``nginx``, ``kong``, ``envoy``, ``triton``, ``rayserve``). Raises ConfigError for settings
that cannot work together or cannot be loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

from detector.actuators.base import ActuatorError, Plan, Reason
from detector.actuators.envoy import EnvoyLocalRateLimiter, EnvoyRuntimeKeys
from detector.actuators.http import AdminApi
from detector.actuators.kong import KongRateLimiter, KongScope
from detector.actuators.kubernetes.api import KubeApi
from detector.actuators.nginx.limiter import NginxAdmission, NginxGateway, NginxRateLimiter
from detector.actuators.rayserve import RayServeOngoingRequests
from detector.actuators.triton import TritonBatchCeiling
from detector.config import (
    ContainmentSettings,
    EnvoySettings,
    HttpAdminSettings,
    KongSettings,
    NginxGatewaySettings,
    RayServeSettings,
    Settings,
    TritonSettings,
)
from detector.errors import ConfigError
from detector.runbooks.bindings.base import ActuatorBinding, StepActuator
from detector.runbooks.bindings.envoy import envoy_limit_from_step
from detector.runbooks.bindings.keyed import KeyedBinding, workload_of
from detector.runbooks.bindings.kong import limit_from_step
from detector.runbooks.bindings.kubernetes import (
    ceilings,
    evictions,
    gateway_policies,
    ingress_admission,
    ingress_limits,
    kube_api,
)
from detector.runbooks.bindings.nginx import admission_from_step, rate_limit_from_step
from detector.runbooks.bindings.rayserve import ongoing_requests_from_step
from detector.runbooks.bindings.triton import batching_from_step
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep


def step_actuators(settings: Settings) -> dict[str, StepActuator]:
    """Return the configured actuators by action value (empty: everything is dry-run).

    Raises ConfigError when the targets are ambiguous or not configured, an admin URL is not
    http(s), or the Kubernetes credentials cannot be loaded.
    """
    c = settings.containment
    try:
        gateway, target = c.rate_limit_driver(), c.batch_ceiling_driver()
    except ValueError as exc:
        raise ConfigError(f"containment: {exc}") from exc
    kube = kube_api(c.kubernetes) if c.kubernetes is not None else None
    registry: dict[str, StepActuator] = {}
    try:
        if gateway is not None:
            registry[Action.ENABLE_RATE_LIMIT.value] = _rate_limiter(gateway, c, kube)
        if gateway == "nginx" and c.nginx is not None and c.nginx.admission_include is not None:
            registry[Action.QUARANTINE_REQUESTS.value] = _nginx_admission(c.nginx)
        if gateway == "ingress-nginx" and kube is not None and c.kubernetes is not None:
            registry[Action.QUARANTINE_REQUESTS.value] = ingress_admission(kube, c.kubernetes)
        if target is not None:
            registry[Action.LOWER_BATCH_CEILING.value] = _ceiling(target, c, kube)
    except ActuatorError as exc:
        raise ConfigError(f"containment: {exc}") from exc
    if kube is not None and c.kubernetes is not None:
        registry[Action.STAGGER_RESTARTS.value] = evictions(kube, c.kubernetes)
    return registry


def _rate_limiter(gateway: str, c: ContainmentSettings, kube: KubeApi | None) -> StepActuator:
    """Return the ``enable_rate_limit`` actuator of ``gateway`` (validated as configured)."""
    if gateway == "nginx" and c.nginx is not None:
        return _nginx(c.nginx)
    if gateway == "kong" and c.kong is not None:
        return _kong(c.kong)
    if gateway == "envoy" and c.envoy is not None:
        return _envoy(c.envoy)
    if kube is not None and c.kubernetes is not None:
        if gateway == "ingress-nginx":
            return ingress_limits(kube, c.kubernetes)
        if gateway == "envoy-gateway":
            return gateway_policies(kube, c.kubernetes)
    raise ConfigError(f"containment: rate_limit_gateway {gateway!r} is not configured")


def _ceiling(target: str, c: ContainmentSettings, kube: KubeApi | None) -> StepActuator:
    """Return the ``lower_batch_ceiling`` actuator of ``target`` (validated as configured)."""
    if target == "triton" and c.triton is not None:
        return _triton(c.triton)
    if target == "rayserve" and c.rayserve is not None:
        return _rayserve(c.rayserve)
    if target == "kubernetes" and kube is not None and c.kubernetes is not None:
        return ceilings(kube, c.kubernetes)
    raise ConfigError(f"containment: batch_ceiling_target {target!r} is not configured")


def _nginx_gateway(cfg: NginxGatewaySettings) -> NginxGateway:
    return NginxGateway(
        conf_path=cfg.conf_path,
        http_include=cfg.http_include,
        location_include=cfg.location_include,
        admission_include=cfg.admission_include,
        prefix=cfg.prefix,
        pid_file=cfg.pid_file,
        error_log=cfg.error_log,
        nginx_bin=cfg.nginx_bin,
    )


def _nginx_admission(cfg: NginxGatewaySettings) -> ActuatorBinding:
    admission = NginxAdmission(_nginx_gateway(cfg))
    return ActuatorBinding(admission, lambda step: admission.plan(admission_from_step(step)))


def _nginx(cfg: NginxGatewaySettings) -> ActuatorBinding:
    limiter = NginxRateLimiter(_nginx_gateway(cfg))
    return ActuatorBinding(
        limiter, lambda step: limiter.plan(rate_limit_from_step(step, burst=cfg.burst))
    )


def admin_api(cfg: HttpAdminSettings, url: str, headers: dict[str, str] | None = None) -> AdminApi:
    """Return the AdminApi of ``url`` with ``cfg``'s timeout and retries.

    Raises ActuatorError(``invalid_request``) for a URL that is not http(s).
    """
    return AdminApi(url, timeout_s=cfg.timeout_s, retries=cfg.retries, headers=headers or {})


def _mapped(
    step: PlannedStep, param: str, mapping: dict[str, str], default: str | None, what: str
) -> str:
    """Return ``mapping[namespace/<param>]`` or ``default``; ActuatorError(``not_configured``)."""
    key = workload_of(step, param)
    found = mapping.get(key, default)
    if found is None:
        raise ActuatorError(Reason.NOT_CONFIGURED, f"no {what} configured for {key}")
    return found


def kong_scope(text: str) -> KongScope:
    """Return the KongScope of ``services/NAME`` or ``routes/NAME``; ActuatorError otherwise."""
    kind, _, name = text.partition("/")
    if kind == "services":
        return KongScope("services", name)
    if kind == "routes":
        return KongScope("routes", name)
    raise ActuatorError(
        Reason.INVALID_REQUEST, f"a Kong scope is services/NAME or routes/NAME: {text}"
    )


def _kong(cfg: KongSettings) -> KeyedBinding[tuple[str, ...], KongRateLimiter]:
    token = cfg.admin_token.get_secret_value() if cfg.admin_token is not None else None
    api = admin_api(cfg, cfg.admin_url, {"Kong-Admin-Token": token} if token else None)

    def key_of_step(step: PlannedStep) -> tuple[str, ...]:
        scopes = cfg.scopes_by_workload.get(workload_of(step, "ingress")) or cfg.scopes
        if not scopes:
            raise ActuatorError(
                Reason.NOT_CONFIGURED, f"no Kong scope for {workload_of(step, 'ingress')}"
            )
        return tuple(scopes)

    def key_of_plan(plan: Plan) -> tuple[str, ...]:
        return tuple(c.target.removesuffix("/plugins/rate-limiting") for c in plan.changes)

    def build(scopes: Sequence[str]) -> KongRateLimiter:
        return KongRateLimiter(api, [kong_scope(s) for s in scopes])

    return KeyedBinding(
        key_of_step=key_of_step,
        key_of_plan=key_of_plan,
        build=build,
        plan_for=lambda act, step: act.plan(
            limit_from_step(step, nodes=cfg.nodes, policy=cfg.policy)
        ),
    )


def _envoy(cfg: EnvoySettings) -> ActuatorBinding:
    keys = EnvoyRuntimeKeys(enabled=cfg.enabled_key, enforced=cfg.enforced_key)
    admins = [admin_api(cfg, url) for url in cfg.admin_urls]
    limiter = EnvoyLocalRateLimiter(admins, keys=keys, admin_layer=cfg.admin_layer)
    return ActuatorBinding(limiter, lambda step: limiter.plan(envoy_limit_from_step(step)))


def _triton(cfg: TritonSettings) -> KeyedBinding[str, TritonBatchCeiling]:
    servers = [admin_api(cfg, url) for url in cfg.urls]

    def plan_for(act: TritonBatchCeiling, step: PlannedStep) -> Plan:
        return act.plan(batching_from_step(step, max_queue_size=cfg.max_queue_size))

    return KeyedBinding(
        key_of_step=lambda s: _mapped(s, "workload", cfg.models, cfg.model, "Triton model"),
        key_of_plan=lambda plan: plan.target.removeprefix("triton:"),
        build=lambda model: TritonBatchCeiling(servers, model, load_timeout_s=cfg.load_timeout_s),
        plan_for=plan_for,
    )


def _rayserve(cfg: RayServeSettings) -> KeyedBinding[str, RayServeOngoingRequests]:
    api = admin_api(cfg, cfg.url)
    default = f"{cfg.app}/{cfg.deployment}" if cfg.app and cfg.deployment else None

    def key_of_plan(plan: Plan) -> str:
        app, _, deployment = plan.changes[0].target.removeprefix("applications/").partition("/")
        return f"{app}/{deployment.removeprefix('deployments/')}"

    def build(key: str) -> RayServeOngoingRequests:
        app, deployment = key.split("/", 1)
        return RayServeOngoingRequests(api, app, deployment, deploy_timeout_s=cfg.deploy_timeout_s)

    def plan_for(act: RayServeOngoingRequests, step: PlannedStep) -> Plan:
        return act.plan(ongoing_requests_from_step(step))

    return KeyedBinding(
        key_of_step=lambda s: _mapped(s, "workload", cfg.deployments, default, "Serve deployment"),
        key_of_plan=key_of_plan,
        build=build,
        plan_for=plan_for,
    )
