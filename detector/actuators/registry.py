"""The actuators a process acts through, built from its settings.

``step_actuators(settings)`` returns the registry ``IncidentFlows`` uses, by runbook action.
Only the actuators whose target is configured are registered; an action without one is
recorded as a dry-run change (``detector.incidents.containment.DryRunActuator``). Wired today:
``enable_rate_limit`` -> plain nginx (``containment.nginx``). The Kubernetes, Kong, Envoy,
Triton and Ray Serve actuators exist as libraries (``detector.actuators.*``) but are not yet
configurable here.
"""

from __future__ import annotations

from detector.actuators.nginx import NginxGateway, NginxRateLimiter
from detector.actuators.nginx_config import rate_limit_from_step
from detector.config import NginxGatewaySettings, Settings
from detector.incidents.containment import ActuatorBinding, StepActuator
from detector.runbooks.definition import Action


def step_actuators(settings: Settings) -> dict[str, StepActuator]:
    """Return the configured actuators by action value (empty: everything is dry-run)."""
    registry: dict[str, StepActuator] = {}
    nginx = settings.containment.nginx
    if nginx is not None:
        registry[Action.ENABLE_RATE_LIMIT.value] = _nginx(nginx)
    return registry


def _nginx(cfg: NginxGatewaySettings) -> ActuatorBinding:
    gateway = NginxGateway(
        conf_path=cfg.conf_path,
        http_include=cfg.http_include,
        location_include=cfg.location_include,
        prefix=cfg.prefix,
        pid_file=cfg.pid_file,
        error_log=cfg.error_log,
        nginx_bin=cfg.nginx_bin,
    )
    limiter = NginxRateLimiter(gateway)
    return ActuatorBinding(
        limiter, lambda step: limiter.plan(rate_limit_from_step(step, burst=cfg.burst))
    )
