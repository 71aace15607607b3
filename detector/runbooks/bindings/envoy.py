"""The Envoy local rate limit switch of a planned ``enable_rate_limit`` step.

The actuator is ``detector.actuators.envoy.EnvoyLocalRateLimiter``.
"""

from __future__ import annotations

from detector.actuators.base import ActuatorError, Reason
from detector.actuators.envoy import EnvoyRateLimit
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep
from detector.runbooks.rate_limits import aggregate_limit


def envoy_limit_from_step(step: PlannedStep, *, replicas: int | None = None) -> EnvoyRateLimit:
    """Return the switch of a planned ``enable_rate_limit`` step: enabled and enforced 100%.

    The token bucket comes with the filter config, so the step's aggregate limit
    (``rate_limits.aggregate_limit``) is not applied: the plan's summary says what each of
    ``replicas`` Envoys (each counts alone; None: the ones the actuator drives) may let through
    for the aggregate to hold. Raises
    ActuatorError(``invalid_request``) for another action.
    """
    if step.action is not Action.ENABLE_RATE_LIMIT:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not enable_rate_limit",
        )
    planned = "aggregate_limit_rpm" in step.params  # a step planned before it: nothing to say
    limit = aggregate_limit(step.params) if planned else None
    return EnvoyRateLimit(
        aggregate_per_min=limit.rpm if limit is not None else None, replicas=replicas
    )
