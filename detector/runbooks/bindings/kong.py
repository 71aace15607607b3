"""The Kong rate limit of a planned ``enable_rate_limit`` step.

The actuator is ``detector.actuators.kong.KongRateLimiter``.
"""

from __future__ import annotations

import math

from detector.actuators.base import ActuatorError, Reason
from detector.actuators.kong import KongLimit
from detector.capacity.numbers import coerce_int
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep


def limit_from_step(step: PlannedStep, *, nodes: int = 1, policy: str = "local") -> KongLimit:
    """Return the KongLimit of a planned ``enable_rate_limit`` step: ``limit_rps`` per node.

    With ``policy: local`` each of ``nodes`` Kong nodes counts alone, so the per-node limit is
    ``floor(limit_rps / nodes)``, never under 1. Raises ActuatorError(``invalid_request``).
    """
    if step.action is not Action.ENABLE_RATE_LIMIT:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} is {step.action.value}, not enable_rate_limit",
        )
    rate = coerce_int(step.params.get("limit_rps"))
    if rate is None or rate < 1 or nodes < 1:
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"step {step.step_id!r} needs an integer limit_rps >= 1 and nodes >= 1",
        )
    per_node = rate if policy != "local" else max(1, math.floor(rate / nodes))
    return KongLimit(second=per_node, policy=policy)
