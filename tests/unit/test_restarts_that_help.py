"""Restarts that help: a zombie (engine dead, probe Ready) is told and restarted first; a
restart that cannot start because the GPU's memory is still held is told apart from a new
death and escalates at once (``SignalKind.START_FAILED``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from test_step_transitions import CASCADING, RESTART, T0, cond, failed, rec

from detector.config import CorrelateSettings
from detector.correlate.context import IncidentContext
from detector.correlate.correlator import ZOMBIE_AFTER_S, Correlator
from detector.correlate.state import EvidenceAdded, VictimAdded
from detector.events.container_log import signals_from_log_line
from detector.events.model import LogLine, Signal, SignalKind, SourcePos
from detector.runbooks.health import Health
from detector.runbooks.planner import restart_plan, zombies
from detector.runbooks.steps import StepRecord, StepState
from detector.runbooks.transitions import Move, Transition, _step_move, next_transition

POD, OTHER, IP = "vllm-m-7d9f8b6c5d-x2k4p", "vllm-m-7d9f8b6c5d-q8w2n", "10.0.0.7"
# vllm/v1/worker/gpu_worker.py's start-up check, as vllm#42017 quotes it
START_LINE = (
    "ERROR 03-14 09:04:10 [core.py:700] ValueError: Free memory on device cuda:0 "
    "(9.50/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB). "
    "Decrease GPU memory utilization or reduce GPU memory used by other processes."
)


def sig(kind: SignalKind, t: float, pod: str | None = POD, ns: str = "llm", **attrs: Any) -> Signal:
    return Signal(kind, T0 + t, SourcePos("t", int(t * 1000) + 10_000), ns, pod, attrs=attrs)


def slice_(t: float, ready: bool) -> Signal:
    return sig(SignalKind.POD_ADDRESS, t, pod_ip=IP, ready=ready, service="vllm-m")


def timeout(t: float, status: int = 504) -> Signal:
    attrs = {"status": status, "upstream": "llm-vllm-m-8000", "upstream_addr": f"{IP}:8000",
             "upstream_status": status, "count": 1}  # fmt: skip
    return sig(SignalKind.LB_RESPONSE, t, "ingress-nginx-controller-x", "ingress", **attrs)


def died(corr: Correlator) -> list[Any]:
    return corr.observe_all([slice_(-100, True), sig(SignalKind.GPU_OOM, 0, framework="pytorch")])


def zombie_evidence(out: list[Any]) -> list[EvidenceAdded]:
    return [d for d in out if isinstance(d, EvidenceAdded) and d.signal.attrs.get("zombie")]


def test_a_timeout_on_a_dead_victims_address_later_on_is_a_zombie() -> None:
    corr = Correlator(CorrelateSettings())
    died(corr)
    assert zombie_evidence(corr.observe(timeout(ZOMBIE_AFTER_S - 1))) == []  # in flight at death
    found = zombie_evidence(corr.observe_all([timeout(58), timeout(59)]))
    assert len(found) == 1  # once per death
    assert found[0].signal.pod == POD and found[0].signal.kind is SignalKind.ENGINE_DEAD
    assert "zombie" in found[0].summary and "504" in found[0].summary


def test_endpoints_that_still_list_a_dead_victim_ready_say_zombie() -> None:
    corr = Correlator(CorrelateSettings())
    died(corr)
    found = zombie_evidence(corr.observe(slice_(30, True)))
    assert len(found) == 1 and "endpoints still list it Ready" in found[0].summary


def test_a_pod_that_restarts_or_leaves_the_endpoints_is_no_zombie() -> None:
    for sign in (
        slice_(2, False),  # its probe saw the death
        sig(SignalKind.CRASH_LOOP, 1, reason="BackOff"),  # the container exited
        sig(SignalKind.POD_READY, 40, ready=True),
    ):
        corr = Correlator(CorrelateSettings())
        died(corr)
        corr.observe(sign)
        assert zombie_evidence(corr.observe_all([timeout(58), slice_(60, True)])) == [], sign
    # a 502 (connections reset: the process went) is no timeout
    corr = Correlator(CorrelateSettings())
    died(corr)
    assert zombie_evidence(corr.observe(timeout(58, 502))) == []


def test_a_start_that_finds_the_gpu_memory_held_is_no_new_death() -> None:
    line = LogLine(T0 + 20, START_LINE, "llm", POD, "vllm")
    (start,) = signals_from_log_line(line, SourcePos("c", 1))
    assert start.kind is SignalKind.START_FAILED
    assert start.attrs["free_bytes"] < start.attrs["capacity_bytes"]
    corr = Correlator(CorrelateSettings())
    died(corr)
    out = corr.observe(start)
    assert not any(isinstance(d, VictimAdded) for d in out)
    (evidence,) = [d for d in out if isinstance(d, EvidenceAdded)]
    assert evidence.kind == "start_failed" and "restarting again does not help" in evidence.summary
    # without an incident a start failure opens none: it is no cascade
    assert Correlator(CorrelateSettings()).observe(replace(start, pod=OTHER)) == []


def context(*signals: Signal) -> IncidentContext:
    return IncidentContext(
        key="llm/m@1", namespace="llm", workload="m", workload_kind="Deployment",
        stage="cascading", opened_at=T0, victims=(OTHER, POD), signals=signals,
    )  # fmt: skip


def test_zombies_are_restarted_first() -> None:
    ctx = context(
        sig(SignalKind.GPU_OOM, -5, OTHER),
        sig(SignalKind.GPU_OOM, 0),
        sig(SignalKind.ENGINE_DEAD, 30, zombie=True, died_at=T0),
    )
    assert zombies(ctx) == [POD]
    crashed, _, basis = restart_plan(ctx)
    assert crashed == [POD, OTHER] and f"zombies first: {POD}" in basis
    # once it was seen started again it is none
    assert zombies(replace(ctx, signals=(*ctx.signals, sig(SignalKind.POD_READY, 90)))) == []


def test_a_zombie_restart_does_not_wait_for_the_steps_before() -> None:
    step = replace(RESTART, params={**RESTART.params, "pods": f'["{POD}"]',
                                    "zombie_pods": f'["{POD}"]'})  # fmt: skip
    plain = replace(step, params={**step.params, "zombie_pods": "[]"})
    in_play = StepRecord(state=StepState.VERIFYING.value, since=T0)  # no outcome yet
    worked = StepRecord(state=StepState.VERIFIED.value, outcome="passed", since=T0)
    planned = rec(StepState.PLANNED)
    assert _step_move(plain, planned, in_play, cond()) is None  # waits its turn
    assert move(_step_move(plain, planned, worked, cond())) is Move.NOT_NEEDED
    assert move(_step_move(plain, planned, failed(), cond())) is Move.REQUEST_APPROVAL
    for before in (in_play, worked):  # a zombie's restart: its turn now, still approved
        assert move(_step_move(step, planned, before, cond())) is Move.REQUEST_APPROVAL


def move(t: Transition | None) -> Move | None:
    return None if t is None else t.move


def test_a_restart_whose_pod_cannot_start_escalates_at_once() -> None:
    step = replace(RESTART, params={**RESTART.params, "pods": f'["{POD}", "{OTHER}"]'})
    restarted = rec(StepState.APPLYING, since=T0, mode="live", applied_at=T0, in_place=True,
                    restarts=({"pod": POD, "at": T0},),
                    baseline=replace(CASCADING).as_record())  # fmt: skip
    # the evicted pod came back under a new name and could not start
    held = replace(CASCADING, time=T0 + 20, start_failed={"vllm-m-7d9f8b6c5d-new01": T0 + 20})
    t = next_transition([step], {step.step_id: restarted}, cond(T0 + 20, health=held))
    assert t is not None and t.move is Move.ESCALATE
    assert "could not start" in t.reason and "still held" in t.reason
    # a start failure before the restart does not count, nor one that was Ready again after
    before = replace(held, start_failed={POD: T0 - 5})
    again = replace(held, ready={"vllm-m-7d9f8b6c5d-new01": T0 + 40}, time=T0 + 40)
    for health in (before, again):
        t = next_transition([step], {step.step_id: restarted}, cond(health.time, health=health))
        assert t is None or t.move is not Move.ESCALATE


def test_health_round_trips_its_start_failures() -> None:
    h = Health(time=T0, stage="cascading", start_failed={POD: T0})
    assert Health.from_record(h.as_record()) == h
