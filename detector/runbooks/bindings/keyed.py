"""A step actuator whose actuator depends on the step: one per key, built on first use.

The runbook's steps name their object in their params (``namespace``, ``workload``,
``ingress``, ``pod``), so one registry entry serves every workload: ``KeyedBinding`` maps a
planned step to a key (``("llm", "vllm-llama")``), builds that key's actuator once, and plans
through it. Apply and revert look the actuator up by the plan's target; a plan read back from
the store after a restart (``Plan.from_record``) rebuilds it from the key its target names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from detector.actuators.base import ActionResult, Actuator, ActuatorError, Plan, Reason
from detector.runbooks.planner import PlannedStep

A = TypeVar("A", bound=Actuator)
K = TypeVar("K", bound=Hashable)


def workload_of(step: PlannedStep, name: str = "workload") -> str:
    """Return ``namespace/<param name>`` of ``step`` (the key of the settings' mappings).

    Raises ActuatorError(``invalid_request``) when either param is missing.
    """
    namespace, workload = step.params.get("namespace"), step.params.get(name)
    if not namespace or not workload:
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"step {step.step_id!r} has no namespace/{name}"
        )
    return f"{namespace}/{workload}"


class KeyedBinding(Generic[K, A]):
    """Plan each step through its key's actuator; apply and revert through the plan's.

    ``key_of_step`` and ``key_of_plan`` raise ActuatorError when the step or plan names no
    object this binding can act on (``not_configured``, ``invalid_request``); the step runner
    records that as a failed step.
    """

    def __init__(
        self,
        *,
        key_of_step: Callable[[PlannedStep], K],
        key_of_plan: Callable[[Plan], K],
        build: Callable[[K], A],
        plan_for: Callable[[A, PlannedStep], Plan],
    ) -> None:
        self.key_of_step = key_of_step
        self.key_of_plan = key_of_plan
        self.build = build
        self.plan_for = plan_for
        self._by_key: dict[K, A] = {}
        self._by_target: dict[str, A] = {}
        self._mutex = threading.Lock()

    def actuator(self, key: K) -> A:
        """Return the actuator of ``key``, built on first use."""
        with self._mutex:
            found = self._by_key.get(key)
            if found is None:
                found = self._by_key[key] = self.build(key)
            return found

    def plan_step(self, step: PlannedStep) -> Plan:
        """Return the plan of ``step`` from its key's actuator (which reads the current state)."""
        actuator = self.actuator(self.key_of_step(step))
        plan = self.plan_for(actuator, step)
        with self._mutex:
            self._by_target[plan.target] = actuator
        return plan

    def _for_plan(self, plan: Plan) -> A:
        with self._mutex:
            found = self._by_target.get(plan.target)
        return found if found is not None else self.actuator(self.key_of_plan(plan))

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Apply ``plan`` through the actuator that planned it (dry-run by default)."""
        return self._for_plan(plan).apply(plan, dry_run=dry_run)

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Revert ``plan`` through the actuator of its target (dry-run by default)."""
        return self._for_plan(plan).revert(plan, dry_run=dry_run)
