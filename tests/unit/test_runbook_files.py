"""Every runbook definition in runbooks/ loads and renders every step against sample incidents."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.correlate.context import IncidentContext
from detector.events.model import Signal, SignalKind, SourcePos
from detector.runbooks.definition import Action
from detector.runbooks.loader import default_runbook_path, load_runbook, runbooks_dir
from detector.runbooks.mechanism import Mechanism
from detector.runbooks.planner import build_variables, plan
from detector.runbooks.render import render_step

RUNBOOK_FILES = sorted(runbooks_dir().glob("*.yaml"))


def _sig(kind: SignalKind, t: float, pod: str | None = None, **attrs: object) -> Signal:
    return Signal(kind=kind, time=t, source=SourcePos("sample.log", int(t)), pod=pod, attrs=attrs)


def _ctx(engine: str | None, *, with_traffic: bool) -> IncidentContext:
    signals = [_sig(SignalKind.GPU_OOM, 100, "m-0"), _sig(SignalKind.GPU_OOM, 140, "m-1")]
    if engine is not None:
        signals.append(_sig(SignalKind.ENGINE_CONFIG, 10, "m-0", engine=engine, max_model_len=4096))
    if with_traffic:
        signals += [_sig(SignalKind.LB_RESPONSE, 130, status=200, upstream="ns-m-80", count=50)]
    return IncidentContext(
        key="c/ns/m",
        namespace="ns",
        workload="m",
        workload_kind="StatefulSet",
        stage="cascading",
        opened_at=100,
        victims=("m-0", "m-1"),
        pods_seen=("m-0", "m-1", "m-2"),
        signals=tuple(sorted(signals, key=lambda s: s.time)),
    )


SAMPLES = {
    f"{engine or 'none'}-{'traffic' if traffic else 'quiet'}": _ctx(engine, with_traffic=traffic)
    for engine in ("vllm", "tgi", "sglang", "triton", None)
    for traffic in (True, False)
}


def test_there_is_a_runbook() -> None:
    assert default_runbook_path() in RUNBOOK_FILES


@pytest.mark.parametrize("path", RUNBOOK_FILES, ids=[p.name for p in RUNBOOK_FILES])
@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_every_step_renders(path: Path, sample: str) -> None:
    runbook = load_runbook(path)
    ctx = SAMPLES[sample]
    variables = build_variables(ctx, floors=runbook.floors())
    for step in runbook.steps:
        params = render_step(step, variables)
        assert set(params) == set(step.params)
        assert all(isinstance(v, str) and v for v in params.values()), step.id
    assert len(plan(runbook, ctx, dry_run=False)) == len(runbook.steps)


def test_gpu_oom_cascade_runbook_content() -> None:
    runbook = load_runbook(default_runbook_path())
    assert runbook.version >= 1
    assert [s.id for s in runbook.steps] == [
        "quarantine_requests",
        "lower_batch_ceiling",
        "enable_rate_limit",
        "stagger_restarts",
    ]
    assert [s.action for s in runbook.steps] == list(Action)
    auto = [s.approver is None for s in runbook.steps]
    assert auto == [True, True, True, False]  # restarts need a named approver
    # each step answers the mechanisms it can stop; restarts answer any
    assert runbook.step("quarantine_requests").when == (Mechanism.OVERSIZED,)
    assert Mechanism.LOAD not in (runbook.step("lower_batch_ceiling").when or ())
    assert runbook.step("enable_rate_limit").when is None
    assert runbook.step("stagger_restarts").when is None
    assert {g.id for g in runbook.remediation} == {"paged_kv_cache", "admission_rules"}
    assert {g.id for g in runbook.prevention} == {
        "autoscale_on_vram_and_queue",
        "load_test_max_seq_len",
    }
    rate = runbook.step("enable_rate_limit")
    assert "limit-req-status-code" in rate.description
    assert rate.floors.rate_limit_rps is not None
    assert runbook.step("lower_batch_ceiling").floors.batch_ceiling == 1
    assert runbook.step("stagger_restarts").params["method"] == "eviction"


def test_gpu_oom_cascade_runbook_policy_and_lift() -> None:
    runbook = load_runbook(default_runbook_path())
    assert [s.policy.value for s in runbook.steps] == ["auto", "auto", "auto", "approval"]
    quarantine = runbook.step("quarantine_requests").lift
    assert quarantine is not None and quarantine.max_steps == 0  # removed whole at resolved
    assert runbook.step("enable_rate_limit").lift.after == "contained"  # type: ignore[union-attr]
    assert runbook.step("stagger_restarts").approval_expiry_s > 0
    lift = runbook.step("enable_rate_limit").lift
    assert lift is not None and lift.params == ("limit_rps", "limit_connections")
    assert lift.until == "observed_request_rate_per_s"
    ceiling = runbook.step("lower_batch_ceiling").lift
    assert ceiling is not None and ceiling.params == ("new_ceiling",)
    assert ceiling.until == "current_ceiling"  # lifted back to what was in force before
    assert runbook.step("stagger_restarts").lift is None
    assert "ooms_stop" in runbook.step("enable_rate_limit").verify.checks
