"""The plain-nginx rate limit of a planned ``enable_rate_limit`` step, and the admission rule of
a ``quarantine_requests`` step.

The actuators are ``detector.actuators.nginx.limiter.NginxRateLimiter`` and ``NginxAdmission``.
Plain nginx limits in aggregate: ``limit_req`` and ``limit_conn`` on one constant key per
workload zone (``GLOBAL_KEY``), so the planned aggregate budget is the limit itself.
"""

from __future__ import annotations

from detector.actuators.base import ActuatorError, Reason
from detector.actuators.nginx.config import (
    DEFAULT_ZONE_SIZE,
    GLOBAL_KEY,
    AdmissionRule,
    RateLimit,
    zone_name,
)
from detector.capacity.numbers import coerce_int
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep
from detector.runbooks.rate_limits import aggregate_limit


def rate_limit_from_step(
    step: PlannedStep,
    *,
    burst: int = 0,
    zone_size: str = DEFAULT_ZONE_SIZE,
    key: str = GLOBAL_KEY,
) -> RateLimit:
    """Return the RateLimit of a planned ``enable_rate_limit`` step.

    The rate is the step's aggregate limit (``detector.runbooks.rate_limits.aggregate_limit``:
    ``aggregate_limit_rpm``, the healthy ok rate before the last victim scaled to the replicas
    serving, relaxed by the lift), as ``r/s`` when it is whole requests per second, else
    ``r/m``; ``limit_conn`` is its ``aggregate_connections``; a ``queue_burst`` param makes the
    burst a queue (requests over the rate wait for it: no ``nodelay``). With the default
    constant ``key`` every client shares the one bucket. The zone is named after the step's
    ``namespace`` and ``ingress`` params. Raises ActuatorError(``invalid_request``) for another
    action or a step without a usable rate.
    """
    if step.action is not Action.ENABLE_RATE_LIMIT:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not enable_rate_limit",
        )
    limit = aggregate_limit(step.params)
    if limit is None:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} has no integer aggregate_limit_rpm or limit_rps param",
        )
    zone = zone_name(step.params.get("namespace", ""), step.params.get("ingress", ""))
    per_s, per_min = (limit.rpm // 60, None) if limit.rpm % 60 == 0 else (None, limit.rpm)
    queue = coerce_int(step.params.get("queue_burst")) or 0
    return RateLimit(
        zone=zone,
        rate_per_s=per_s,
        rate_per_min=per_min,
        burst=queue or burst,
        queue=queue > 0,
        zone_size=zone_size,
        key=key,
        connections=limit.connections,
    )


def admission_from_step(step: PlannedStep) -> AdmissionRule:
    """Return the AdmissionRule of a planned ``quarantine_requests`` step (``max_body_bytes``).

    Raises ActuatorError(``invalid_request``) for another action or a step without a size
    (no request class was found: nothing to refuse).
    """
    if step.action is not Action.QUARANTINE_REQUESTS:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not quarantine_requests",
        )
    size = coerce_int(step.params.get("max_body_bytes"))
    if size is None:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} has no max_body_bytes: no request class to refuse",
        )
    return AdmissionRule(size)
