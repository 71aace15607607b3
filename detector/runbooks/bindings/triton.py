"""The Triton batch ceilings of a planned ``lower_batch_ceiling`` step.

The actuator is ``detector.actuators.triton.TritonBatchCeiling``.
"""

from __future__ import annotations

from detector.actuators.base import ActuatorError, Reason
from detector.actuators.triton import QueuePolicy, TritonBatching
from detector.capacity.numbers import coerce_int
from detector.runbooks.definition import Action
from detector.runbooks.planner import PlannedStep


def batching_from_step(step: PlannedStep, *, max_queue_size: int | None = None) -> TritonBatching:
    """Return the Triton ceilings of a planned ``lower_batch_ceiling`` step.

    ``max_batch_size`` is the step's computed ``new_ceiling``; ``max_queue_size`` (when given)
    bounds the queue with ``REJECT`` on timeout. Raises ActuatorError(``invalid_request``).
    """
    if step.action is not Action.LOWER_BATCH_CEILING:
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"step {step.step_id!r} is {step.action.value}, not a ceiling"
        )
    size = coerce_int(step.params.get("new_ceiling"))
    if size is None:
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"step {step.step_id!r} has no integer new_ceiling"
        )
    policy = None if max_queue_size is None else QueuePolicy(max_queue_size=max_queue_size)
    return TritonBatching(size, default_queue_policy=policy)
