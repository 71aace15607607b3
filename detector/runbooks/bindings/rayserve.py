"""The Ray Serve ``max_ongoing_requests`` of a planned ``lower_batch_ceiling`` step.

The actuator is ``detector.actuators.rayserve.RayServeOngoingRequests``.
"""

from __future__ import annotations

from detector.actuators.base import ActuatorError, Reason
from detector.capacity.numbers import coerce_int
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep


def ongoing_requests_from_step(step: PlannedStep) -> int:
    """Return ``max_ongoing_requests`` of a planned ``lower_batch_ceiling`` step.

    The step's computed ``new_ceiling`` (>= 1). Raises ActuatorError(``invalid_request``).
    """
    if step.action is not Action.LOWER_BATCH_CEILING:
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"step {step.step_id!r} is {step.action.value}, not a ceiling"
        )
    value = coerce_int(step.params.get("new_ceiling"))
    if value is None or value < 1:
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"step {step.step_id!r} has no integer new_ceiling >= 1"
        )
    return value
