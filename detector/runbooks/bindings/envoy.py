"""The Envoy local rate limit switch of a planned ``enable_rate_limit`` step.

The actuator is ``detector.actuators.envoy.EnvoyLocalRateLimiter``.
"""

from __future__ import annotations

from detector.actuators.base import ActuatorError, Reason
from detector.actuators.envoy import EnvoyRateLimit
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep


def envoy_limit_from_step(step: PlannedStep) -> EnvoyRateLimit:
    """Return the switch of a planned ``enable_rate_limit`` step: enabled and enforced 100%.

    The step's ``limit_rps`` is not applied: the token bucket comes with the filter config.
    Raises ActuatorError(``invalid_request``) for another action.
    """
    if step.action is not Action.ENABLE_RATE_LIMIT:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not enable_rate_limit",
        )
    return EnvoyRateLimit()
