"""The step machine: decide whether and when each planned step acts. Pure, time passed in.

``next_transition(steps, records, conditions)`` returns the one next ``Transition`` of an
incident's planned steps, or None when nothing is due. The caller
(:mod:`detector.runbooks.runner`) performs it (``ACTUATOR_MOVES`` go through an actuator
and are completed by ``settle``), stores the record, approval and timeline entry (``dedupe``
keeps them idempotent), and asks again.

A step's turn comes when it is the first, or the step before it failed (verification failed,
denied, expired, failed to apply); a verified step ends the run (the later ones are not
needed). Policy ``auto`` approves at once, ``approval`` waits for a person until it expires.
A step whose plan says what its sizing lacks (the ``lacks`` param) is never approved nor
applied: it waits for the input until ``evidence_until``, then passes its turn.
Before every actuator call: the kill switch; before applies and restarts, the cap of actions
per workload per hour; before an apply, the cooldown per workload and step and the floors.
Staggered restarts: one pod per move, the next after the spacing (and warm-up after Ready).
Verification passes when the incident is contained, fails at once when the cascade spreads
(``ooms_stop``), else the checks decide at the deadline; a failure escalates or rolls back.
Once the incident is resolved a step with a ``lift`` is relaxed step by step, then removed.
Records only move forward and nothing moves before a record's last move (event time), so a
re-run over the same input changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from detector.actuators.base import ActionResult, Status
from detector.capacity.numbers import coerce_int
from detector.runbooks.definition import Action, Lift, OnFailure
from detector.runbooks.health import Health, evaluate, hms, spread
from detector.runbooks.planner import PlannedStep
from detector.runbooks.steps import Approval, StepRecord, StepState

ENGINE_ACTOR = "detector"
CALM_STAGES = ("contained", "resolved")
PASS_TURN = frozenset({"failed", "skipped"})  # outcomes that give the next step its turn
FLOOR_PARAMS = {  # param -> the Floors field it may never go under
    "new_ceiling": "batch_ceiling",
    "limit_rps": "rate_limit_rps",
    "limit_connections": "limit_connections",
    "spacing_s": "spacing_s",
}


class Move(StrEnum):
    """What one transition does; the value is the timeline's word for it."""

    NOT_NEEDED = "not_needed"
    AUTO_APPROVE = "auto_approved"
    REQUEST_APPROVAL = "approval_requested"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    BLOCKED = "blocked"
    REFUSED = "refused"
    APPLY = "applied"
    RESTART = "restarted"
    VERIFIED = "verified"
    ESCALATE = "escalated"
    ROLLBACK = "rolled_back"
    LIFT = "lifted"
    RESIZE = "resized"  # an applied quarantine follows the class the evidence shows now
    REMOVE = "removed"
    WITHDRAWN = "withdrawn"
    REREQUEST = "approval_re_requested"


ACTUATOR_MOVES = frozenset(
    {Move.APPLY, Move.RESTART, Move.ROLLBACK, Move.LIFT, Move.RESIZE, Move.REMOVE}
)
REVERT_MOVES = frozenset({Move.ROLLBACK, Move.REMOVE})  # revert the first apply's plan
COUNTED_MOVES = frozenset({Move.APPLY, Move.RESTART})  # count against the hourly cap
_VERDICTS = frozenset({Move.VERIFIED, Move.ESCALATE, Move.ROLLBACK})


@dataclass(frozen=True, slots=True)
class Conditions:
    """Everything besides the steps that the step machine decides on, at event time ``now``.

    ``live``: the process acts for real and the workload is armed; ``actuated``: the actions
    with a real actuator (the others are recorded as dry-run); ``approvals`` by step id;
    ``actions_last_hour``: applies and restarts on the workload in the hour up to ``now``;
    ``last_apply_at``: by step id, the latest apply of that step on the workload by another
    incident (for the cooldown); ``current``: by step id, the step as planned from the
    evidence at ``now`` (a step acts on the state of now: its targets and precondition are
    taken from it; a step missing here is taken as stored).
    """

    now: float
    health: Health
    live: bool = False
    actuated: frozenset[str] = frozenset()
    kill_switch: bool = False
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    actions_last_hour: int = 0
    max_actions_per_hour: int = 6
    last_apply_at: Mapping[str, float] = field(default_factory=dict)
    current: Mapping[str, PlannedStep] = field(default_factory=dict)
    dry_run_why: str = ""  # why nothing acts for real while ``live`` is False


@dataclass(frozen=True, slots=True)
class Transition:
    """One move of one step: the record after it, who did it and why.

    For ``ACTUATOR_MOVES`` the caller plans ``params`` (apply, restart, lift) or reverts
    ``record.plan`` (rollback, removal), for real when ``live``, and calls ``settle``.
    ``replan`` is set when the step's stored params must become these (a re-requested or
    narrowed plan); ``last`` marks the restart after which no pod is left.
    """

    step: PlannedStep
    move: Move
    record: StepRecord
    actor: str
    reason: str
    dedupe: str
    params: Mapping[str, str] | None = None
    live: bool = False
    diff: str = ""
    replan: Mapping[str, str] | None = None
    last: bool = False
    dry_why: str = ""  # a dry-run actuator move: why it did not act for real

    @property
    def message(self) -> str:
        """Return the timeline line: step, what happened, mode, actor and reason.

        A dry-run actuator move says what *would* have been done: nothing was changed.
        """
        step = f"step {self.step.position} {self.step.step_id}"
        if self.move not in ACTUATOR_MOVES:
            return f"{step} {self.move.value} by {self.actor}: {self.reason}"
        if self.live:
            return f"{step} {self.move.value} [live] by {self.actor}: {self.reason}"
        why = f"; {self.dry_why}" if self.dry_why else ""
        return f"{step} would be {self.move.value} [dry-run: nothing changed{why}]: {self.reason}"

    def detail(self) -> dict[str, Any]:
        """Return the structured timeline detail: status, actor, reason, diff, approval."""
        rec = self.record
        return {
            "step": self.step.step_id,
            "position": self.step.position,
            "action": self.step.action.value,
            "event": self.move.value,
            "state": rec.state,
            "actor": self.actor,
            "reason": self.reason,
            "mode": rec.mode if self.move in ACTUATOR_MOVES else None,
            "diff": self.diff,
            "approval": rec.approval,
            "verification": rec.verification if self.move in _VERDICTS else None,
        }


def next_transition(
    steps: Sequence[PlannedStep], records: Mapping[str, StepRecord], cond: Conditions
) -> Transition | None:
    """Return the next move of the first step that has one due, or None."""
    previous: StepRecord | None = None
    for step in steps:
        rec = records.get(step.step_id) or StepRecord()
        if rec.since is None or cond.now >= rec.since:  # never before the last move
            found = _step_move(step, rec, previous, cond)
            if found is not None:
                return found
        previous = rec
    return None


def _to(state: StepState, outcome: str | None = None, **more: Any) -> dict[str, Any]:
    return {"state": state.value, **({"outcome": outcome} if outcome else {}), **more}


def _t(
    step: PlannedStep,
    move: Move,
    rec: StepRecord,
    now: float,
    reason: str,
    update: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    actor: str = ENGINE_ACTOR,
    params: Mapping[str, str] | None = None,
    live: bool = False,
    replan: Mapping[str, str] | None = None,
    last: bool = False,
) -> Transition:
    record = replace(rec, since=now, reason=reason, **(update or {}))
    dedupe = f"step:{step.step_id}:{key or move.value}"
    return Transition(step, move, record, actor, reason, dedupe, params, live, "", replan, last)


def _step_move(
    step: PlannedStep, rec: StepRecord, prev: StepRecord | None, cond: Conditions
) -> Transition | None:
    state = StepState(rec.state)
    if state is StepState.PLANNED or _reopened(rec, prev):
        return _turn(step, rec, prev, cond)
    if state is StepState.AWAITING_APPROVAL:
        return _awaiting(step, rec, cond)
    if state is StepState.APPROVED:
        return _apply(step, rec, cond)
    if state is StepState.APPLYING:
        return _next_restart(step, rec, cond)
    if state is StepState.VERIFYING:
        return _verify(step, rec, cond)
    if state is StepState.VERIFIED and (resumed := _resumed(step, rec, cond)) is not None:
        return resumed
    lifting = state in (StepState.VERIFIED, StepState.ESCALATED, StepState.LIFTING)
    if lifting and rec.in_place and step.lift is not None and _may_lift(step.lift, cond):
        return _lift(step, rec, cond)
    return None


_PREVIOUS_WORKED = "the step before worked"


def _reopened(rec: StepRecord, prev: StepRecord | None) -> bool:
    """Return True for a step skipped because the one before worked, which then escalated."""
    skipped = rec.state == StepState.NOT_NEEDED.value and rec.reason == _PREVIOUS_WORKED
    return skipped and prev is not None and prev.outcome == "failed"


def _resumed(step: PlannedStep, rec: StepRecord, cond: Conditions) -> Transition | None:
    """Escalate a verified step again when the cascade resumed after its verification."""
    verified_at = float((rec.verification or {}).get("at") or rec.since or 0.0)
    oom = cond.health.last_oom
    if cond.health.stage != "cascading" or oom is None or oom[0] <= verified_at:
        return None
    if step.action is Action.QUARANTINE_REQUESTS:
        rest, due = _unexplained(step, [oom[1]], cond)
        if due or not rest:
            return None  # it held the class (admitted before the rule), or its requests are due
    why = (
        f"the cascade resumed after the verification at {hms(verified_at)}: GPU OOM in pod "
        f"{oom[1]} at {hms(oom[0])}; next step"
    )
    update = _to(StepState.ESCALATED, "failed")
    return _t(step, Move.ESCALATE, rec, cond.now, why, update, key=f"resumed:{int(oom[0])}")


def _turn(
    step: PlannedStep, rec: StepRecord, prev: StepRecord | None, cond: Conditions
) -> Transition | None:
    now, not_needed = cond.now, _to(StepState.NOT_NEEDED, "not_needed")
    undead = _pods(current_step(step, cond), "zombie_pods")
    if undead:
        pass  # a zombie serves nothing and nothing else restarts it: its turn is now
    elif prev is not None and prev.outcome is None:
        return None  # the step before is still in play
    elif prev is not None and prev.outcome not in PASS_TURN:
        why = (
            _PREVIOUS_WORKED
            if prev.state != StepState.WITHDRAWN.value
            else ("the step before was withdrawn: " + prev.reason)
        )
        return _t(step, Move.NOT_NEEDED, rec, now, why, not_needed)
    if cond.health.stage in CALM_STAGES:
        why = f"the incident was {cond.health.stage} before its turn"
        return _t(step, Move.NOT_NEEDED, rec, now, why, not_needed)
    step = current_step(step, cond)
    if step.when:
        mechanism = step.params.get("mechanism", "")
        wait = _number(step.params.get("evidence_until"))
        if mechanism == "undetermined" and wait is not None and now < wait:
            return None  # the victims' requests come just after their death
        if mechanism not in step.when:
            why = (
                f"not for this mechanism: {mechanism or 'unknown'} (the step answers "
                f"{', '.join(step.when)}); {step.params.get('mechanism_evidence', '')}"
            )
            return _t(step, Move.NOT_NEEDED, rec, now, why.rstrip("; "),
                      _to(StepState.NOT_NEEDED, "skipped"))  # fmt: skip
    if step.lacks:  # not sized: never approved nor applied; it waits while the input may come
        wait = _number(step.params.get("evidence_until"))
        return None if wait is not None and now < wait else _not_sized(step, rec, now)
    if (withdrawn := _precondition_gone(step, cond)) is not None:
        update = _to(StepState.NOT_NEEDED, "not_needed")
        return _t(step, Move.NOT_NEEDED, rec, now, withdrawn, update)
    if step.policy == "auto":
        approval = {"status": "approved", "by": "policy:auto", "via": "policy", "at": now}
        update = _to(StepState.APPROVED, approval=approval)
        # a quarantine acts on the request class of now, whatever was planned before
        replan = dict(step.params) if step.action is Action.QUARANTINE_REQUESTS else None
        return _t(step, Move.AUTO_APPROVE, rec, now, "policy auto", update, replan=replan)
    return _request(step, rec, now, Move.REQUEST_APPROVAL, "asks")


def _not_sized(step: PlannedStep, rec: StepRecord, now: float) -> Transition:
    """Pass over a step whose plan lacks an input of its sizing, saying what it lacks."""
    why = f"not sized, nothing applied: it lacks {step.lacks}; next step"
    return _t(step, Move.NOT_NEEDED, rec, now, why, _to(StepState.NOT_NEEDED, "skipped"))


def _request(step: PlannedStep, rec: StepRecord, now: float, move: Move, verb: str) -> Transition:
    """Ask the step's approvers to decide on ``step``'s plan (digest shown) until expiry."""
    group = step.approval.removeprefix("approver:")
    expires = now + step.approval_expiry_s
    digest = plan_digest(step)
    approval = {"status": "pending", "group": group, "at": now, "expires_at": expires,
                "digest": digest}  # fmt: skip
    update = _to(StepState.AWAITING_APPROVAL, approval=approval, expires_at=expires)
    why = f"{verb} {group} until {hms(expires)} (plan {digest}): {plan_text(step)}"
    key = move.value if move is Move.REQUEST_APPROVAL else f"{move.value}:{digest}"
    return _t(step, move, rec, now, why, update, key=key, replan=dict(step.params))


TARGET_PARAMS = {  # the params that say what a step changes: a change of them is a new plan
    Action.QUARANTINE_REQUESTS: ("ingress", "max_body_bytes"),
    Action.STAGGER_RESTARTS: ("pods", "method", "spacing_s"),
    Action.LOWER_BATCH_CEILING: ("workload", "settings", "set_via"),
    Action.ENABLE_RATE_LIMIT: ("ingress", "limit_rps", "limit_connections"),
}


def plan_digest(step: PlannedStep) -> str:
    """Return a short digest of what ``step`` would change (its ``TARGET_PARAMS``).

    An approver's decision names the digest it saw; a plan that changed has another one.
    """
    keys = TARGET_PARAMS.get(step.action, tuple(sorted(step.params)))
    text = json.dumps({k: step.params.get(k) for k in keys}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def current_step(step: PlannedStep, cond: Conditions) -> PlannedStep:
    """Return ``step`` with the params planned from the evidence at ``cond.now``, if known."""
    now = cond.current.get(step.step_id)
    return step if now is None else replace(step, params=dict(now.params))


def _precondition_gone(step: PlannedStep, cond: Conditions) -> str | None:
    """Return why ``step`` (as planned now) is no longer needed, or None while it is."""
    stage = cond.health.stage
    if stage in CALM_STAGES:
        return f"withdrawn: the incident is {stage} (no new GPU OOM, 5xx under threshold)"
    if step.action is Action.STAGGER_RESTARTS and not _pods(step):
        return "withdrawn: no pod is still down or at the memory ceiling"
    return None


def plan_text(step: PlannedStep) -> str:
    """Return what the step will do, in one line (for staggered restarts, the restart plan)."""
    p = step.params
    if step.action is Action.STAGGER_RESTARTS:
        return (  # the order's basis (memory headroom) is in the step's params
            f"restart {', '.join(_pods(step)) or 'no pod'} one at a time, crashed pods first, "
            f"at least {p.get('spacing_s')} s apart plus {p.get('warmup_s', '0')} s warm-up "
            f"after Ready, at most {p.get('max_unavailable', '1')} unavailable"
        )
    if step.action is Action.LOWER_BATCH_CEILING:
        return f"{p.get('current_settings', '?')} -> {p.get('settings', '?')}"
    if step.action is Action.QUARANTINE_REQUESTS and coerce_int(p.get("max_body_bytes")) is None:
        return f"nothing to refuse: no request class stands out (mechanism {p.get('mechanism')})"
    if step.action is Action.QUARANTINE_REQUESTS:
        return (
            f"refuse requests over {p.get('max_body_bytes')} bytes at the gateway with "
            f"{p.get('status_code', '413')} (mechanism {p.get('mechanism')}; "
            f"{p.get('refused_share_text', '')})"
        )
    if lacks := step.lacks:
        return f"not sized: it lacks {lacks}"
    if p.get("aggregate_budget_rps") is not None:  # the containment figure, for all clients
        return (
            f"shed load over the healthy capacity left: {p.get('aggregate_budget_rps')}/s and "
            f"{p.get('aggregate_connections')} connections in all (gateway values in the params)"
        )
    return f"limit-rps {p.get('limit_rps')}, limit-connections {p.get('limit_connections')}"


def _awaiting(step: PlannedStep, rec: StepRecord, cond: Conditions) -> Transition | None:
    now, got, base = cond.now, cond.approvals.get(step.step_id), dict(rec.approval or {})
    if got is not None and got.event_at is not None and now < got.event_at:
        return None  # decided at a later event time than this tick: its turn comes then
    fresh = current_step(step, cond)
    if got is not None and got.status in ("approved", "denied"):
        approval = {**base, "status": got.status, "by": got.by, "via": got.via, "at": now}
        why = f"via {got.via}" + (f": {got.reason}" * bool(got.reason))  # the message says by whom
        actor = got.by or "?"
        if got.status == "denied":
            update = _to(StepState.DENIED, "failed", approval=approval)
            return _t(step, Move.DENIED, rec, now, f"{why}; nothing applied", update, actor=actor)
        if (gone := _precondition_gone(fresh, cond)) is not None:
            update = _to(StepState.WITHDRAWN, "not_needed", approval=approval)
            why = f"{gone}; nothing applied"  # as _apply says it: the decision was told already
            return _t(step, Move.WITHDRAWN, rec, now, why, update, replan=dict(fresh.params))
        narrowed = _narrowed(step, fresh)
        if narrowed is not None:
            why += f"; acting on the state of now: {plan_text(narrowed)}"
        update = _to(StepState.APPROVED, approval=approval)
        return _t(step, Move.APPROVED, rec, now, why, update, actor=actor, replan=(
            None if narrowed is None else dict(narrowed.params)))  # fmt: skip
    if got is not None and got.status == "withdrawn":
        return None  # the runner withdraws the row with the step: the record moves first
    if (gone := _precondition_gone(fresh, cond)) is not None:
        approval = {**base, "status": "withdrawn", "at": now}
        update = _to(StepState.WITHDRAWN, "not_needed", approval=approval)
        why = f"approval {gone}; nothing applied"
        return _t(step, Move.WITHDRAWN, rec, now, why, update, replan=dict(fresh.params))
    if base.get("digest") not in (None, plan_digest(fresh)):
        return _request(fresh, rec, now, Move.REREQUEST, "the plan changed: asks")
    expired = (got is not None and got.status == "expired") or now >= (rec.expires_at or now)
    if not expired:
        return None
    update = _to(StepState.EXPIRED, "failed", approval={**base, "status": "expired", "at": now})
    why = f"no decision by {hms(rec.expires_at or now)}; nothing applied"
    return _t(step, Move.EXPIRED, rec, now, why, update)


def _narrowed(approved: PlannedStep, fresh: PlannedStep) -> PlannedStep | None:
    """Return the approved restart plan cut to the pods still down now, or None if unchanged.

    Never wider than what was approved: a pod that went down since is left to a new plan.
    """
    if approved.action is not Action.STAGGER_RESTARTS:
        return None
    still = set(_pods(fresh))
    pods = [p for p in _pods(approved) if p in still]
    if pods == _pods(approved):
        return None
    return replace(approved, params={**approved.params, "pods": json.dumps(pods)})


def _rails(step: PlannedStep, cond: Conditions, move: Move) -> str | None:
    """Return why ``move`` may not act now ("code: explanation"), or None."""
    if cond.kill_switch:
        return "kill_switch: the kill switch is on, nothing is changed"
    if move in COUNTED_MOVES and cond.actions_last_hour >= cond.max_actions_per_hour:
        return (
            f"cap: {cond.actions_last_hour} actions on this workload in the last hour "
            f"(cap {cond.max_actions_per_hour})"
        )
    last = cond.last_apply_at.get(step.step_id)
    if move is Move.APPLY and last is not None and cond.now - last < step.cooldown_s:
        return (
            f"cooldown: applied to this workload at {hms(last)} by another incident; "
            f"cooldown {step.cooldown_s:g} s, until {hms(last + step.cooldown_s)}"
        )
    return None


def _blocked(step: PlannedStep, rec: StepRecord, now: float, why: str) -> Transition | None:
    code = why.split(":", 1)[0]
    if rec.blocked == code:
        return None  # already on the timeline
    key = f"blocked:{code}:{int(now)}"
    return _t(step, Move.BLOCKED, rec, now, why, {"blocked": code}, key=key)


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def below_floor(step: PlannedStep) -> str | None:
    """Return which param of the step is under its floor, or None (``FLOOR_PARAMS``)."""
    for param, floor_name in FLOOR_PARAMS.items():
        floor = getattr(step.floors, floor_name)
        value = _number(step.params.get(param))
        if floor is not None and value is not None and value < floor:
            return f"{param} {value:g} is under its floor {floor:g}"
    return None


def _live(step: PlannedStep, cond: Conditions) -> bool:
    return cond.live and step.action.value in cond.actuated


def _dry_why(step: PlannedStep, cond: Conditions) -> str:
    """Return why ``step`` would not act for real now ("" when it would)."""
    if not cond.live:
        return cond.dry_run_why
    if step.action.value not in cond.actuated:
        return f"no actuator is configured for {step.action.value}"
    return ""


def _baseline(rec: StepRecord, cond: Conditions) -> dict[str, Any]:
    """Keep the evidence at the first apply as the baseline of the verification."""
    return {} if rec.baseline is not None else {"baseline": cond.health.as_record()}


def _apply(step: PlannedStep, rec: StepRecord, cond: Conditions) -> Transition | None:
    now = cond.now
    if (under := below_floor(step)) is not None:
        update = _to(StepState.FAILED, "failed")
        return _t(step, Move.REFUSED, rec, now, f"{under}: nothing applied", update)
    if (gone := _precondition_gone(_still(step, cond), cond)) is not None:
        update = _to(StepState.WITHDRAWN, "not_needed")
        return _t(step, Move.WITHDRAWN, rec, now, f"{gone}; nothing applied", update)
    if step.action is Action.STAGGER_RESTARTS:
        return _next_restart(step, rec, cond)
    if (why := _rails(step, cond, Move.APPLY)) is not None:
        return _blocked(step, rec, now, why)
    params, live = dict(step.params), _live(step, cond)
    t = _t(step, Move.APPLY, rec, now, plan_text(step), _baseline(rec, cond), params=params,
           live=live)  # fmt: skip
    return replace(t, dry_why=_dry_why(step, cond))


def _pods(step: PlannedStep, param: str = "pods") -> list[str]:
    """Return the pods a step's JSON list ``param`` names ([] when absent or malformed)."""
    try:
        pods = json.loads(step.params.get(param) or "[]")
    except ValueError:
        return []
    return [str(p) for p in pods] if isinstance(pods, list) else []


def next_restart_at(step: PlannedStep, rec: StepRecord, health: Health) -> float:
    """Return when the next pod may restart: never two at once.

    After the previous restart at t: t + spacing_s, or its Ready time + warmup_s if later,
    when that pod was seen Ready after t; else t + spacing_s + warmup_s (an evicted pod comes
    back under a new name, so its Ready is often not in the evidence).
    """
    if not rec.restarts:
        return float("-inf")
    at, pod = float(rec.restarts[-1]["at"]), str(rec.restarts[-1]["pod"])
    spacing = _number(step.params.get("spacing_s")) or 0.0
    warmup = _number(step.params.get("warmup_s")) or 0.0
    ready = health.ready.get(pod)
    if ready is not None and ready > at:
        return max(at + spacing, ready + warmup)
    return at + spacing + warmup


def _still(step: PlannedStep, cond: Conditions) -> PlannedStep:
    """Return ``step`` as approved, its restart list cut to the pods still down now."""
    return _narrowed(step, current_step(step, cond)) or step


def _held(rec: StepRecord, h: Health) -> list[str]:
    """Return the workload's pods that could not start since the step's first restart (their
    GPU's memory held) and were not Ready since: an evicted pod comes back under a new name,
    so any pod of the workload counts."""
    if not rec.restarts:
        return []
    return h.failed_to_start(h.start_failed, float(rec.restarts[0]["at"]))


def _held_why(held: list[str]) -> str:
    return (
        f"{', '.join(held)} could not start after the restart: the GPU's memory is still held "
        "(by the dead engine or another process), so restarting again does not help; free it "
        "(nvidia-smi on the node shows the process) or move the pod to another node"
    )


def _next_restart(step: PlannedStep, rec: StepRecord, cond: Conditions) -> Transition | None:
    if held := _held(rec, cond.health):  # escalate now: more restarts would land on held GPUs
        verification = {"result": "failed", "at": cond.now, "checks": []}
        update = _to(StepState.ESCALATED, "failed", verification=verification)
        reason = f"{_held_why(held)}; next step"
        return _t(step, Move.ESCALATE, rec, cond.now, reason, update, key="start_failed")
    done = {str(r["pod"]) for r in rec.restarts}
    still = _pods(_still(step, cond))
    remaining = [p for p in _pods(step) if p not in done and p in still]
    if not remaining:
        return _rest_recovered(step, rec, cond, done) if rec.restarts else None
    if cond.now < next_restart_at(step, rec, cond.health):
        return None
    if (why := _rails(step, cond, Move.RESTART)) is not None:
        return _blocked(step, rec, cond.now, why)
    pod, total = remaining[0], len(done) + len(remaining)
    why = f"pod {pod} ({len(done) + 1} of {total}), one at a time"
    t = _t(step, Move.RESTART, rec, cond.now, why, _baseline(rec, cond), key=f"restart:{pod}",
           params={**step.params, "pod": pod}, live=_live(step, cond),
           last=len(remaining) == 1)  # fmt: skip
    return replace(t, dry_why=_dry_why(step, cond))


def _rest_recovered(
    step: PlannedStep, rec: StepRecord, cond: Conditions, done: set[str]
) -> Transition | None:
    """Stop restarting when the pods left recovered by themselves; verify what was done."""
    if rec.state != StepState.APPLYING.value:
        return None
    skipped = [p for p in _pods(step) if p not in done]
    deadline = cond.now + step.verify.deadline_s
    why = (
        f"the rest is not restarted (recovered or no longer at the ceiling): "
        f"{', '.join(skipped)}; the restarts done are verified by {hms(deadline)}"
    )
    update = {"state": StepState.VERIFYING.value, "deadline_at": deadline}
    return _t(step, Move.WITHDRAWN, rec, cond.now, why, update, key="withdrawn:rest")


def _resize(step: PlannedStep, rec: StepRecord, cond: Conditions) -> Transition | None:
    """Re-size an applied quarantine to the request class the evidence shows now.

    The gateway logs the requests a victim held one by one, and a later victim may hold
    another class: the bound follows the diagnosis while the step is verified, in either
    direction (only while the mechanism is still a request class).
    """
    if step.action is not Action.QUARANTINE_REQUESTS or rec.mode is None:
        return None
    fresh, applied = current_step(step, cond).params, dict(rec.params or step.params)
    size, old = fresh.get("max_body_bytes"), applied.get("max_body_bytes")
    if fresh.get("mechanism") != "oversized_requests" or _number(size) is None or size == old:
        return None
    if (why := _rails(step, cond, Move.RESIZE)) is not None:
        return _blocked(step, rec, cond.now, why)
    keys = ("max_body_bytes", "refused_share_text", "annotations", "mechanism_evidence", "basis")
    params = {**applied, **{k: fresh[k] for k in keys if k in fresh}}
    why = f"max_body_bytes {old} -> {size}: {fresh.get('mechanism_evidence', '')}"
    return _t(step, Move.RESIZE, rec, cond.now, why, key=f"resize:{size}", params=params,
              live=rec.mode == "live")  # fmt: skip


def _unexplained(step: PlannedStep, victims: list[str], cond: Conditions) -> tuple[list[str], bool]:
    """Return (the victims a quarantine does not explain, whether evidence is still due).

    A victim that held the request class (``class_victims`` of the plan of now) died of a
    request admitted before the rule: no sign that the rule fails. While a victim's requests
    are not in yet (``evidence_until``), the verdict waits.
    """
    fresh = current_step(step, cond).params
    due = _number(fresh.get("evidence_until"))
    pending = due is not None and cond.now < due
    if fresh.get("mechanism") != "oversized_requests":
        return victims, pending
    try:
        held = set(json.loads(fresh.get("class_victims") or "[]"))
    except ValueError:
        held = set()
    rest = [p for p in victims if p not in held]
    return rest, bool(rest) and pending


def _verify(step: PlannedStep, rec: StepRecord, cond: Conditions) -> Transition | None:
    if (resized := _resize(step, rec, cond)) is not None:
        return resized
    now, h = cond.now, cond.health
    base = Health.from_record(rec.baseline or {"time": rec.applied_at or now, "stage": h.stage})
    touched = [str(r["pod"]) for r in rec.restarts] or list(base.victims)
    wanted = [c.value for c in step.verify.checks]
    checks = [asdict(c) for c in evaluate(wanted, base, h, pods=touched)]
    new = spread(base, h) if "ooms_stop" in wanted else []
    if new and step.action is Action.QUARANTINE_REQUESTS:
        new, pending = _unexplained(step, new, cond)
        if pending:
            return None  # a victim's requests are not in yet: they may show the class
    after = "after the apply" if rec.mode == "live" else "afterwards"
    if held := _held(rec, h):
        passed, why = False, _held_why(held)
    elif h.stage in CALM_STAGES:
        passed, why = True, f"the incident is {h.stage}: no new GPU OOM, 5xx under threshold"
    elif new:
        passed, why = False, f"the cascade spread to {', '.join(new)} {after}"
    elif now >= (rec.deadline_at or now):
        passed = all(c["ok"] for c in checks)
        why = "; ".join(str(c["detail"]) for c in checks) + f" (deadline {hms(now)})"
    else:
        return None
    verification = {"result": "passed" if passed else "failed", "at": now, "checks": checks}
    if rec.mode != "live":
        why = f"dry-run, nothing was applied; observed: {why}"
        verification["dry_run"] = True
    if passed:
        update = _to(StepState.VERIFIED, "passed", verification=verification)
        return _t(step, Move.VERIFIED, rec, now, why, update)
    if step.on_failure is OnFailure.ROLLBACK and rec.in_place:
        if (block := _rails(step, cond, Move.ROLLBACK)) is not None:
            return _blocked(step, rec, now, block)
        live, update = rec.mode == "live", {"verification": verification}
        return _t(step, Move.ROLLBACK, rec, now, f"verification failed: {why}", update, live=live)
    update = _to(StepState.ESCALATED, "failed", verification=verification)
    return _t(step, Move.ESCALATE, rec, now, f"verification failed: {why}; next step", update)


def _may_lift(lift: Lift, cond: Conditions) -> bool:
    """Return whether the incident is calm enough for ``lift`` (its ``after`` stage)."""
    stage = cond.health.stage
    return stage == "resolved" or (lift.after == "contained" and stage == "contained")


def _lift(step: PlannedStep, rec: StepRecord, cond: Conditions) -> Transition | None:
    lift, now = step.lift, cond.now
    assert lift is not None
    if rec.lift_at is not None and now < rec.lift_at + lift.interval_s:
        return None
    if (why := _rails(step, cond, Move.LIFT) or _lift_held(rec, cond)) is not None:
        return _blocked(step, rec, now, why)
    applied, level, live = rec.params or dict(step.params), rec.lift_level + 1, rec.mode == "live"
    scale, numbers = lift.factor**level, {p: _number(applied.get(p)) for p in lift.params}
    values = {p: str(math.floor(v * scale)) for p, v in numbers.items() if v is not None}
    if step.action is Action.LOWER_BATCH_CEILING and "new_ceiling" in values:
        ceiling = str(applied.get("ceiling_param", ""))
        settings = relaxed_settings(applied.get("settings", ""), ceiling, values["new_ceiling"])
        values["settings"] = settings
    until = _number(applied.get(lift.until)) if lift.until else None
    first = _number(values.get(lift.params[0]))
    if level > lift.max_steps or first is None or (until is not None and first >= until):
        why = f"temporary measure removed after {level - 1} relaxation(s)"
        return _t(step, Move.REMOVE, rec, now, why, key="remove", live=live)
    shown = ", ".join(f"{k} {applied.get(k)} -> {v}" for k, v in values.items())
    return _t(step, Move.LIFT, rec, now, f"relaxed x{scale:g}: {shown}", key=f"lift:{level}",
              params={**applied, **values}, live=live)  # fmt: skip


def _lift_held(rec: StepRecord, cond: Conditions) -> str | None:
    """Return why the next relaxation waits: a GPU OOM or memory at the ceiling since the last."""
    since, h = rec.lift_at, cond.health  # the first relaxation: the incident is resolved
    for what, event in (("GPU OOM", h.last_oom), ("memory at the ceiling", h.last_pressure)):
        if since is not None and event is not None and event[0] > since:
            return f"lift_held: {what} in pod {event[1]} at {hms(event[0])} since the last change"
    return None


def relaxed_settings(settings: str, param: str, value: str) -> str:
    """Return engine ``settings`` (``--max-num-seqs=13 ...`` / ``MAX_CONCURRENT_REQUESTS=13``)
    with the ``param`` setting (``max_num_seqs``) set to ``value``; other settings as they are."""
    out = []
    for token in settings.split(" "):
        key, sep, _ = token.partition("=")
        same = sep and key.lstrip("-").replace("-", "_").lower() == param.lower()
        out.append(f"{key}={value}" if same else token)
    return " ".join(out)


def settle(t: Transition, result: ActionResult, plan: dict[str, Any] | None) -> Transition:
    """Return ``t`` completed with the actuator's ``result``; ``plan`` is the plan's record.

    A failed apply, restart or rollback fails the step (the next step's turn); a failed lift
    or removal is tried again after the lift interval.
    """
    rec, now = t.record, float(t.record.since or 0.0)
    mode = "live" if t.live else "dry_run"
    if not result.ok:
        state = "previous state restored" if result.restored else "previous state NOT restored"
        why = f"{t.reason}: failed, {result.reason}: {result.error} ({state})"
        if t.move in (Move.LIFT, Move.REMOVE):
            return replace(t, reason=why, diff=result.diff, record=replace(rec, lift_at=now))
        failed = replace(rec, reason=why, mode=rec.mode or mode, **_to(StepState.FAILED, "failed"))
        return replace(t, reason=why, diff=result.diff, record=failed)
    reason = t.reason
    if result.status is Status.UNCHANGED:
        reason += (
            " (the pod was replaced since: nothing to restart)"
            if t.move is Move.RESTART
            else " (already in place)"
        )
    new = replace(rec, mode=rec.mode or mode, blocked=None, current=plan)
    if rec.mode is None:
        new = replace(new, applied_at=now, params=dict(t.params or {}), plan=plan)
    last = t.move is Move.APPLY
    if t.move is Move.RESTART:
        pod = (t.params or {}).get("pod", "?")
        new = replace(new, restarts=(*rec.restarts, {"pod": pod, "at": now}), in_place=True)
        last = t.last
        if not last:
            nxt = next_restart_at(t.step, new, Health(time=now, stage=""))
            new, reason = replace(new, state=StepState.APPLYING.value), f"{reason}; next {hms(nxt)}"
    if last:
        deadline = now + t.step.verify.deadline_s
        new = replace(new, state=StepState.VERIFYING.value, in_place=True, deadline_at=deadline)
        reason = f"{reason}; verify by {hms(deadline)}"
    elif t.move is Move.ROLLBACK:
        new = replace(new, in_place=False, **_to(StepState.ROLLED_BACK, "failed"))
    elif t.move is Move.RESIZE:
        new = replace(new, params=dict(t.params or {}))
    elif t.move is Move.LIFT:
        new = replace(
            new, state=StepState.LIFTING.value, lift_level=rec.lift_level + 1, lift_at=now
        )
    elif t.move is Move.REMOVE:
        new = replace(new, state=StepState.LIFTED.value, in_place=False, lift_at=now)
    return replace(t, reason=reason, diff=result.diff, record=replace(new, reason=reason))
