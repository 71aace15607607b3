"""The runbook definition: pydantic models of ``runbooks/*.yaml`` (strict: unknown keys fail).

A runbook is an ordered list of steps. Each step names an action from a closed set, carries
its parameters as Jinja2 template strings (rendered by :mod:`detector.runbooks.render` from the
incident's variables), an approval policy, a verification, what to do when verification fails,
a cooldown and the floors its computed values may never go under. ``when`` names the failure
mechanisms a step answers (:mod:`detector.runbooks.mechanism`); a step whose turn comes under
another mechanism is passed over (``not_needed``, outcome ``skipped``) and the next one's
turn comes.

Approval policy: ``policy: auto`` applies a step as soon as its turn comes; ``policy: approval``
waits for a person on the approver allow-list (``approval: approver:<group>`` names who is
asked) until ``approval_expiry_s``. When ``policy`` is left out it follows ``approval``, and
when both are left out it is the action's default (``DEFAULT_POLICY``): ``approval`` for the
disruptive actions, those that restart pods (a rollout of new ceilings, staggered restarts),
``auto`` for the gateway rate limit, which restarts nothing, works at once and is lifted again.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from detector.runbooks.mechanism import Mechanism

_STRICT = ConfigDict(extra="forbid", frozen=True)

Seconds = Annotated[float, Field(strict=True, ge=0)]
Identifier = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)]
APPROVAL_PATTERN = r"^(auto|approver:[A-Za-z0-9][A-Za-z0-9._-]*)$"


class Action(StrEnum):
    """What a step does; the closed set of actions the actuators implement."""

    QUARANTINE_REQUESTS = "quarantine_requests"  # gateway admission rule: 413 over a size
    LOWER_BATCH_CEILING = "lower_batch_ceiling"  # patch engine args/env, one pod at a time
    ENABLE_RATE_LIMIT = "enable_rate_limit"  # gateway 429 backpressure
    STAGGER_RESTARTS = "stagger_restarts"  # evict crashed pods one at a time


class Check(StrEnum):
    """What a step's verification looks at before its deadline."""

    ERRORS_FALL = "errors_fall"  # 502/503/504 rate at the load balancer falls under threshold
    OOMS_STOP = "ooms_stop"  # no new GPU OOM in the workload's pods
    MEMORY_STOPS_RISING = "memory_stops_rising"  # GPU memory / KV-cache usage stops climbing
    PODS_READY = "pods_ready"  # the touched pods are Ready again


class OnFailure(StrEnum):
    """What happens when verification fails: go on to the next step, or undo this one."""

    ESCALATE = "escalate"
    ROLLBACK = "rollback"


class Policy(StrEnum):
    """Whether a step needs a person's approval before it is applied."""

    AUTO = "auto"
    APPROVAL = "approval"


# Disruptive actions (they restart pods) wait for a person unless the runbook says otherwise.
DEFAULT_POLICY: dict[str, Policy] = {
    Action.QUARANTINE_REQUESTS.value: Policy.AUTO,  # refuses one request class, lifted at once
    Action.LOWER_BATCH_CEILING.value: Policy.APPROVAL,  # a rollout restarts every pod
    Action.ENABLE_RATE_LIMIT.value: Policy.AUTO,  # restarts nothing, lifted step by step
    Action.STAGGER_RESTARTS.value: Policy.APPROVAL,  # restarts pods
}
DEFAULT_GROUP = "approvers"  # ``approval`` of a step with policy approval and no group named


class Verify(BaseModel):
    """How a step is verified: the checks that must hold within ``deadline_s`` seconds."""

    model_config = _STRICT

    deadline_s: Annotated[float, Field(strict=True, gt=0)]
    checks: tuple[Check, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_checks(self) -> Verify:
        if len(set(self.checks)) != len(self.checks):
            raise ValueError("checks must not repeat")
        return self


class Floors(BaseModel):
    """Lower bounds on the values a step computes; a plan never proposes less.

    ``batch_ceiling`` bounds the engine's concurrency ceiling (vLLM ``max_num_seqs``, TGI
    ``MAX_CONCURRENT_REQUESTS``, SGLang ``max_running_requests``); ``batched_tokens`` bounds
    vLLM ``max_num_batched_tokens`` / TGI ``MAX_BATCH_TOTAL_TOKENS``; ``rate_limit_rps`` and
    ``limit_connections`` bound the gateway limits; ``spacing_s`` bounds the restart spacing.
    """

    model_config = _STRICT

    batch_ceiling: Annotated[int, Field(strict=True, ge=1)] | None = None
    batched_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    rate_limit_rps: Annotated[int, Field(strict=True, ge=1)] | None = None
    limit_connections: Annotated[int, Field(strict=True, ge=1)] | None = None
    spacing_s: Annotated[float, Field(strict=True, gt=0)] | None = None


class Lift(BaseModel):
    """How a temporary measure is lifted once the incident is resolved (or, with ``after:
    contained``, once it is contained: a limit sized for the capacity left follows the pods
    coming back).

    Every ``interval_s`` the integer ``params`` are multiplied by ``factor`` and applied
    again; after ``max_steps`` relaxations, or once the first param reaches the value of the
    ``until`` param (e.g. the request rate seen before the incident), the measure is removed
    (the actuator reverts the change). Example: a 1 r/s limit goes 2, 4, then is removed.
    """

    model_config = _STRICT

    params: tuple[Identifier, ...] = Field(min_length=1)
    factor: Annotated[float, Field(strict=False, gt=1)] = 2.0
    interval_s: Annotated[float, Field(strict=False, gt=0)]
    max_steps: Annotated[int, Field(strict=True, ge=0)] = 4  # 0: removed at once
    until: Identifier | None = None
    after: Literal["contained", "resolved"] = "resolved"


class Step(BaseModel):
    """One containment step: an action, its parameter templates and its policy."""

    model_config = _STRICT

    id: Identifier
    action: Action
    title: str = Field(min_length=1)
    description: str = Field(min_length=1)
    params: dict[Identifier, str] = Field(min_length=1)
    policy: Policy
    approval: Annotated[str, Field(pattern=APPROVAL_PATTERN)]
    approval_expiry_s: Annotated[float, Field(strict=False, gt=0)] = 600.0
    verify: Verify
    on_failure: OnFailure
    cooldown_s: Seconds
    floors: Floors = Floors()
    lift: Lift | None = None
    when: tuple[Mechanism, ...] | None = None  # the mechanisms it answers (None: any)

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        """Fill ``policy`` from ``approval`` or the action's default, and the reverse."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        policy, approval = data.get("policy"), data.get("approval")
        if policy is None:
            if isinstance(approval, str):
                policy = Policy.AUTO.value if approval == "auto" else Policy.APPROVAL.value
            else:
                policy = DEFAULT_POLICY.get(str(data.get("action")), Policy.APPROVAL).value
            data["policy"] = policy
        if approval is None:
            auto = policy == Policy.AUTO.value
            data["approval"] = "auto" if auto else f"approver:{DEFAULT_GROUP}"
        elif (policy == Policy.AUTO.value) != (approval == "auto"):
            raise ValueError(f"policy {policy!r} contradicts approval {approval!r}")
        return data

    @model_validator(mode="after")
    def _lift_params(self) -> Step:
        if self.lift is not None:
            names = [*self.lift.params, *([self.lift.until] if self.lift.until else [])]
            missing = [n for n in names if n not in self.params]
            if missing:
                raise ValueError(f"lift names params the step does not have: {missing}")
        return self

    @property
    def approver(self) -> str | None:
        """Return the approver group, or None when the step is approved automatically."""
        return None if self.approval == "auto" else self.approval.removeprefix("approver:")


class Guidance(BaseModel):
    """One remediation or prevention item: a lasting fix, not an automated action."""

    model_config = _STRICT

    id: Identifier
    title: str = Field(min_length=1)
    description: str = Field(min_length=1)


class Runbook(BaseModel):
    """A whole runbook: versioned, ordered steps plus remediation and prevention guidance."""

    model_config = _STRICT

    version: Annotated[int, Field(strict=True, ge=1)]
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*$")]
    title: str = Field(min_length=1)
    description: str = Field(min_length=1)
    max_actions_per_hour: Annotated[int, Field(strict=True, ge=1)]
    steps: tuple[Step, ...] = Field(min_length=1)
    remediation: tuple[Guidance, ...] = Field(min_length=1)
    prevention: tuple[Guidance, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Runbook:
        ids = [step.id for step in self.steps]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"step ids must be unique; repeated: {', '.join(duplicates)}")
        seen: dict[str, str] = {}
        for step in self.steps:
            for key in step.floors.model_dump(exclude_none=True):
                if key in seen:
                    raise ValueError(f"floor {key!r} set in both {seen[key]!r} and {step.id!r}")
                seen[key] = step.id
        return self

    def floors(self) -> Floors:
        """Return the floors of all steps merged into one (each floor is set in one step)."""
        merged: dict[str, Any] = {}
        for step in self.steps:
            merged.update(step.floors.model_dump(exclude_none=True))
        return Floors(**merged)

    def step(self, step_id: str) -> Step:
        """Return the step with this id; raise KeyError when there is none."""
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)
