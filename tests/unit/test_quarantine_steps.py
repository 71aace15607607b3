"""The step machine by mechanism: the quarantine of a request class and the steps passed over
(``when``), waiting for a victim's requests, following the class, judging the spread by
what each victim held, removal at ``resolved`` (pure, table-driven like test_step_transitions)."""

from __future__ import annotations

from dataclasses import replace

from detector.correlate.context import IncidentContext
from detector.correlate.requests import RequestEvidence
from detector.events.model import Signal, SignalKind, SourcePos
from detector.runbooks.health import Health
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import PlannedStep, plan
from detector.runbooks.steps import StepRecord, StepState
from detector.runbooks.transitions import Conditions, Move, next_transition

T0 = 1_741_943_000.0
RUNBOOK = load_runbook(default_runbook_path())
CHAT = tuple(sorted(700 + 4 * n for n in range(200, 2200, 20)))
POISON = 700 + 4 * 12_000
VLLM = Signal(SignalKind.ENGINE_CONFIG, T0 - 600, SourcePos("c", 1), "llm", "a",
              attrs={"engine": "vllm", "max_num_seqs": 256})  # fmt: skip


# the correlator's window summary of the gateway's lines: 8 ok/s before the last victim
TRAFFIC = Signal(SignalKind.LB_RESPONSE, T0 - 1, SourcePos("lb", 1), "llm",
                 attrs={"status": 200, "baseline_ok_rate_per_s": 8.0})  # fmt: skip


def steps(
    *deaths: tuple[str, float, tuple[int, ...], bool], traffic: bool = False
) -> dict[str, PlannedStep]:
    ctx = IncidentContext(
        key="llm/m@1",
        namespace="llm",
        workload="m",
        workload_kind="Deployment",
        stage="cascading",
        opened_at=T0,
        victims=tuple(d[0] for d in deaths),
        pods_seen=("a", "b", "c", "d"),
        signals=(VLLM, TRAFFIC) if traffic else (VLLM,),
        requests=RequestEvidence(CHAT, tuple((p, T0 + at, s, ok) for p, at, s, ok in deaths)),
    )
    return {s.step_id: s for s in plan(RUNBOOK, ctx, dry_run=False)}


POISONED = steps(("a", 0, (POISON, 3000), True))
LOADED = steps(("a", 0, (9000, 3000), True))
SHEDDABLE = steps(("a", 0, (9000, 3000), True), traffic=True)  # the 429 step is sized
UNKNOWN = steps(("a", 0, (), False))


def cond(now: float, current: dict[str, PlannedStep], stage: str = "suspected",
         victims: tuple[str, ...] = ("a",)) -> Conditions:  # fmt: skip
    last = (T0 + 1, victims[-1]) if victims else None
    health = Health(time=now, stage=stage, victims=victims, last_oom=last)
    return Conditions(now=now, health=health, current=current)


def ordered(plan_now: dict[str, PlannedStep]) -> list[PlannedStep]:
    return list(plan_now.values())


def test_a_poison_class_is_quarantined_first_and_follows_the_class() -> None:
    quarantine = POISONED["quarantine_requests"]
    assert quarantine.params["mechanism"] == "oversized_requests"
    assert quarantine.params["max_body_bytes"] == str(int(0.9 * POISON))
    assert "refuses 0.0%" in quarantine.params["refused_share_text"]
    t = next_transition(ordered(POISONED), {}, cond(T0 + 1, POISONED))
    assert t is not None and t.move is Move.AUTO_APPROVE
    assert t.replan is not None and t.replan["max_body_bytes"] == str(int(0.9 * POISON))
    # applied, verifying; a larger request of the same victim comes in: the rule follows
    base = Health(time=T0 + 1, stage="suspected", victims=("a",)).as_record()
    applied = StepRecord(state=StepState.VERIFYING.value, since=T0 + 1, mode="live",
                         applied_at=T0 + 1, params=dict(quarantine.params), in_place=True,
                         deadline_at=T0 + 121, baseline=base)  # fmt: skip
    bigger = steps(("a", 0, (POISON + 4000, POISON, 3000), True))
    t = next_transition([quarantine], {quarantine.step_id: applied}, cond(T0 + 2, bigger))
    assert t is not None and t.move is Move.RESIZE
    assert t.params is not None and t.params["max_body_bytes"] == str(int(0.9 * (POISON + 4000)))
    held = replace(cond(T0 + 2, bigger), kill_switch=True)  # the rails hold a resize too
    t = next_transition([quarantine], {quarantine.step_id: applied}, held)
    assert t is not None and t.move is Move.BLOCKED


def test_a_victim_that_held_the_class_does_not_fail_the_quarantine() -> None:
    quarantine = POISONED["quarantine_requests"]
    base = Health(time=T0 + 1, stage="suspected", victims=("a",)).as_record()
    applied = StepRecord(state=StepState.VERIFYING.value, since=T0 + 1, mode="live",
                         applied_at=T0 + 1, params=dict(quarantine.params), in_place=True,
                         deadline_at=T0 + 121, baseline=base)  # fmt: skip
    records = {quarantine.step_id: applied}
    # b died holding the class too (admitted before the rule): no verdict against it
    both = steps(("a", 0, (POISON, 3000), True), ("b", 0.4, (POISON, 2000), True))
    now = cond(T0 + 2, both, "cascading", ("a", "b"))
    assert next_transition([quarantine], records, now) is None
    # b's requests are not all in yet: the verdict waits
    partial = steps(("a", 0, (POISON, 3000), True), ("b", 0.4, (2000,), False))
    assert (
        next_transition([quarantine], records, cond(T0 + 2, partial, "cascading", ("a", "b")))
        is None
    )
    # b held chat only, all in: the class does not explain it, the next step's turn
    chat = steps(("a", 0, (POISON, 3000), True), ("b", 0.4, (4000, 2000), True))
    t = next_transition([quarantine], records, cond(T0 + 2, chat, "cascading", ("a", "b")))
    assert t is not None and t.move is Move.ESCALATE


def test_steps_for_other_mechanisms_are_passed_over() -> None:
    records: dict[str, StepRecord] = {}
    now = cond(T0 + 30, SHEDDABLE, "cascading")
    t = next_transition(ordered(SHEDDABLE), records, now)
    assert t is not None and t.move is Move.NOT_NEEDED
    assert t.record.outcome == "skipped" and "not for this mechanism: load" in t.reason
    records[t.step.step_id] = t.record
    t = next_transition(ordered(SHEDDABLE), records, now)
    assert t is not None and t.step.step_id == "lower_batch_ceiling"  # vLLM pages: not load's
    assert t.move is Move.NOT_NEEDED
    records[t.step.step_id] = t.record
    t = next_transition(ordered(SHEDDABLE), records, now)
    assert t is not None and (t.step.step_id, t.move) == ("enable_rate_limit", Move.AUTO_APPROVE)
    assert SHEDDABLE["enable_rate_limit"].params["aggregate_budget_rps"] == "6.0"  # 8 x 3 / 4


def test_a_429_step_with_no_traffic_is_not_sized_and_passes_its_turn() -> None:
    """No load-balancer line before the last victim: the budget is unknown. The step is not
    approved (auto or by a person) nor applied on a floor: it waits while the victims'
    evidence may still come, then passes its turn to the restarts, saying what it lacks."""
    passed = StepRecord(state=StepState.NOT_NEEDED.value, outcome="skipped", since=T0 + 1)
    for plan_now in (LOADED, UNKNOWN):
        rate = plan_now["enable_rate_limit"]
        assert rate.params["aggregate_budget_rps"] == "unknown"
        assert rate.lacks is not None and "no load-balancer line" in rate.lacks
        for policy in ("auto", "approval"):  # a person is not asked to approve a floor either
            gated = {**plan_now, "enable_rate_limit": replace(rate, policy=policy)}
            records = {"quarantine_requests": passed, "lower_batch_ceiling": passed}
            until = rate.params["evidence_until"]
            if until:  # undetermined: the victims' requests (and lines) are due until then
                assert next_transition(ordered(gated), records, cond(T0 + 5, gated)) is None
            t = next_transition(ordered(gated), records, cond(T0 + 30, gated))
            assert t is not None and (t.step.step_id, t.move) == (
                "enable_rate_limit",
                Move.NOT_NEEDED,
            )
            assert t.record.outcome == "skipped" and t.params is None
            assert t.reason.startswith("not sized, nothing applied: it lacks the request rate")
            records["enable_rate_limit"] = t.record
            t = next_transition(ordered(gated), records, cond(T0 + 30, gated))
            assert t is not None and t.step.step_id == "stagger_restarts"
            assert t.move is Move.REQUEST_APPROVAL


def test_a_step_for_one_mechanism_waits_for_the_evidence_then_goes_on() -> None:
    assert UNKNOWN["quarantine_requests"].params["mechanism"] == "undetermined"
    assert next_transition(ordered(UNKNOWN), {}, cond(T0 + 1, UNKNOWN)) is None  # waits
    t = next_transition(ordered(UNKNOWN), {}, cond(T0 + 11, UNKNOWN))  # no sizes came
    assert t is not None and t.move is Move.NOT_NEEDED and t.record.outcome == "skipped"


def test_the_quarantine_is_removed_whole_at_resolved() -> None:
    quarantine = POISONED["quarantine_requests"]
    verified = StepRecord(state=StepState.VERIFIED.value, outcome="passed", since=T0 + 60,
                          mode="live", applied_at=T0 + 1, params=dict(quarantine.params),
                          in_place=True)  # fmt: skip
    records = {quarantine.step_id: verified}
    assert next_transition([quarantine], records, cond(T0 + 100, POISONED, "contained")) is None
    t = next_transition([quarantine], records, cond(T0 + 400, POISONED, "resolved"))
    assert t is not None and t.move is Move.REMOVE and t.live


def test_the_gateway_limit_relaxes_from_contained() -> None:
    rate = replace(LOADED["enable_rate_limit"])
    assert rate.lift is not None and rate.lift.after == "contained"
    assert rate.params["queue_burst"] == "0"  # no traffic seen here: no budget to queue for
    applied = StepRecord(state=StepState.VERIFIED.value, outcome="passed", since=T0 + 60,
                         mode="live", applied_at=T0 + 1, params=dict(rate.params),
                         in_place=True)  # fmt: skip
    t = next_transition([rate], {rate.step_id: applied}, cond(T0 + 100, LOADED, "contained"))
    assert t is not None and t.move in (Move.LIFT, Move.REMOVE)  # not waiting for resolved
