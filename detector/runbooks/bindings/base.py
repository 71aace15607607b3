"""What the step runner needs of an actuator, and the binding of an ``Actuator`` to a step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from detector.actuators.base import ActionResult, Actuator, Plan
from detector.runbooks.planner import PlannedStep


class StepActuator(Protocol):
    """What the step runner needs of an actuator: plan a step's change, apply it, revert it."""

    def plan_step(self, step: PlannedStep) -> Plan:
        """Return the exact change ``step`` makes, read against the current content."""
        ...

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Make the change (dry-run: record it only)."""
        ...

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Undo the change (dry-run: record it only)."""
        ...


@dataclass(frozen=True, slots=True)
class ActuatorBinding:
    """An ``Actuator`` with the function that plans its change from a planned step.

    E.g. ``ActuatorBinding(limiter, lambda s: limiter.plan(rate_limit_from_step(s)))`` for
    the nginx rate limit (detector.actuators.nginx.limiter).
    """

    actuator: Actuator
    plan_for: Callable[[PlannedStep], Plan]

    def plan_step(self, step: PlannedStep) -> Plan:
        """Return ``plan_for(step)``."""
        return self.plan_for(step)

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Apply through the actuator."""
        return self.actuator.apply(plan, dry_run=dry_run)

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Revert through the actuator."""
        return self.actuator.revert(plan, dry_run=dry_run)
