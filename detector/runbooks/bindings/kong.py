"""The Kong rate limit of a planned ``enable_rate_limit`` step.

The actuator is ``detector.actuators.kong.KongRateLimiter``; its ``limit_by: service`` counts
every client of the service together, so the step's aggregate limit is the limit itself.
"""

from __future__ import annotations

import math

from detector.actuators.base import ActuatorError, Reason
from detector.actuators.kong import KongLimit
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep
from detector.runbooks.rate_limits import aggregate_limit


def limit_from_step(step: PlannedStep, *, nodes: int = 1, policy: str = "local") -> KongLimit:
    """Return the KongLimit of a planned ``enable_rate_limit`` step, by service.

    The step's aggregate limit R requests per minute (``rate_limits.aggregate_limit``, relaxed
    by the lift) becomes ``minute`` R and ``second`` ceil(R / 60): over a minute the service
    gets at most the budget, in any second at most the budget rounded up. With ``policy:
    local`` each of ``nodes`` Kong nodes counts alone, so each gets ``floor(second / nodes)``
    and ``floor(R / nodes)``, never under 1 (Kong also needs minute >= second). Raises
    ActuatorError(``invalid_request``).
    """
    if step.action is not Action.ENABLE_RATE_LIMIT:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not enable_rate_limit",
        )
    limit = aggregate_limit(step.params)
    if limit is None or nodes < 1:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} needs an aggregate_limit_rpm or integer limit_rps >= 1, "
            "and nodes >= 1",
        )
    share = nodes if policy == "local" else 1
    second = max(1, math.ceil(limit.rpm / 60) // share)
    minute = max(second, limit.rpm // share)
    return KongLimit(second=second, minute=minute, policy=policy)
