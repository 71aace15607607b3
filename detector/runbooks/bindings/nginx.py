"""The plain-nginx rate limit of a planned ``enable_rate_limit`` step.

The actuator is ``detector.actuators.nginx.limiter.NginxRateLimiter``.
"""

from __future__ import annotations

from detector.actuators.base import ActuatorError, Reason
from detector.actuators.nginx.config import DEFAULT_ZONE_SIZE, GLOBAL_KEY, RateLimit, zone_name
from detector.capacity.numbers import coerce_int
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep


def rate_limit_from_step(
    step: PlannedStep,
    *,
    burst: int = 0,
    zone_size: str = DEFAULT_ZONE_SIZE,
    key: str = GLOBAL_KEY,
) -> RateLimit:
    """Return the RateLimit of a planned ``enable_rate_limit`` step.

    The rate is the step's ``limit_rps`` param, as computed by
    ``detector.runbooks.planner.build_variables`` (the healthy ok rate before the last victim,
    scaled to the replicas serving, never under the floor) and rendered by the runbook; the
    zone is named after its ``namespace`` and ``ingress`` params. Raises
    ActuatorError(``invalid_request``) for another action or a missing / non-integer rate.
    """
    if step.action is not Action.ENABLE_RATE_LIMIT:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not enable_rate_limit",
        )
    rate = coerce_int(step.params.get("limit_rps"))
    if rate is None:
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"step {step.step_id!r} has no integer limit_rps param"
        )
    zone = zone_name(step.params.get("namespace", ""), step.params.get("ingress", ""))
    return RateLimit(zone=zone, rate_per_s=rate, burst=burst, zone_size=zone_size, key=key)
