"""Who contained an incident (``detector.report.recovery``): containment when a step that
changed the cluster was in force at the ``contained`` stage change, else the pods themselves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from detector.incidents.schemas import TimelineEntryOut
from detector.report.recovery import RecoveredBy, attribute, recovery
from detector.report.schemas import IncidentOut

T0 = datetime(2025, 3, 14, 9, 3, 37, tzinfo=UTC)
CONTAINED = "stage -> contained: no new GPU OOM for 60 s and 5xx under threshold (0.0/s)"


def move(position: int, event: str, mode: str | None = "live", state: str = "verifying") -> dict:
    """A step entry's detail as ``Transition.detail()`` writes it (the fields the rule reads)."""
    step = {1: "quarantine_requests", 2: "lower_batch_ceiling", 3: "enable_rate_limit"}[position]
    return {"step": step, "position": position, "event": event, "state": state, "mode": mode}


def entry(
    i: int, kind: str, message: str, detail: dict[str, Any] | None = None
) -> TimelineEntryOut:
    return TimelineEntryOut(
        id=i, time=T0 + timedelta(seconds=i), kind=kind, message=message, evidence_id=None,
        detail=detail,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("moves", "by", "in_force", "text"),
    [
        ([], RecoveredBy.PODS, [],
         "the cascade stopped without containment (no step changed the cluster; "
         "none was applied)"),
        ([move(3, "auto_approved", None), move(3, "applied", "dry_run")], RecoveredBy.PODS, [],
         "the cascade stopped without containment (no step changed the cluster; dry-run)"),
        ([move(3, "applied")], RecoveredBy.CONTAINMENT, [3],
         "containment did it (step 3 enable_rate_limit applied)"),
        ([move(1, "applied"), move(3, "applied"), move(3, "lifted")], RecoveredBy.CONTAINMENT,
         [1, 3], "containment did it (steps 1 quarantine_requests, 3 enable_rate_limit "
         "applied)"),
        # a live apply that failed restored the previous state: it changed nothing
        ([move(2, "applied", state="failed")], RecoveredBy.PODS, [],
         "the cascade stopped without containment (no step changed the cluster; "
         "none was applied)"),
        # undone before the stage change: no longer what held the incident
        ([move(2, "applied"), move(2, "rolled_back", state="rolled_back")], RecoveredBy.PODS, [],
         "the cascade stopped without containment (no step in force; "
         "step 2 lower_batch_ceiling undone before)"),
        ([move(1, "applied"), move(1, "removed", state="lifted")], RecoveredBy.PODS, [],
         "the cascade stopped without containment (no step in force; "
         "step 1 quarantine_requests undone before)"),
        # a removal that failed (state unchanged) leaves the step in force
        ([move(1, "applied"), move(1, "removed", state="verified")], RecoveredBy.CONTAINMENT,
         [1], "containment did it (step 1 quarantine_requests applied)"),
        # an escalated step is still in place: it counts; a dry-run one beside it does not
        ([move(2, "applied"), move(2, "escalated", None, "escalated"),
          move(3, "applied", "dry_run")], RecoveredBy.CONTAINMENT, [2],
         "containment did it (step 2 lower_batch_ceiling applied)"),
    ],
)  # fmt: skip
def test_the_rule(moves: list[dict], by: RecoveredBy, in_force: list[int], text: str) -> None:
    found = recovery(moves)
    assert found.by is by and [s.position for s in found.in_force] == in_force
    assert found.text == text


def test_only_the_moves_recorded_before_the_stage_change_count() -> None:
    timeline = [
        entry(1, "stage", "stage -> cascading: two pods died"),
        entry(2, "step", "step 3 would be applied [dry-run ...]", move(3, "applied", "dry_run")),
        entry(3, "stage", CONTAINED),
        entry(4, "step", "step 1 applied [live]", move(1, "applied")),  # after: not the cause
        entry(5, "stage", "stage -> suspected: new GPU OOM in pod b"),
        entry(6, "stage", CONTAINED),  # contained again, with step 1 in force this time
    ]
    out = attribute(timeline)
    assert [e.id for e in out] == [1, 2, 3, 4, 5, 6] and out[:2] == timeline[:2]
    first, second = out[2], out[5]
    assert first.message == f"{CONTAINED}; {recovery([move(3, 'applied', 'dry_run')]).text}"
    assert first.detail == {
        "recovered_by": "pods", "steps": [],
        "dry_run_steps": [{"position": 3, "step": "enable_rate_limit"}], "reverted_steps": [],
        "attribution": "the cascade stopped without containment (no step changed the "
        "cluster; dry-run)",
    }  # fmt: skip
    assert second.detail is not None and second.detail["recovered_by"] == "containment"
    assert second.message.endswith("; containment did it (step 1 quarantine_requests applied)")


def test_the_read_model_attributes_once_and_a_reread_dump_keeps_it() -> None:
    timeline = [entry(1, "step", "applied", move(1, "applied")), entry(2, "stage", CONTAINED)]
    inc = IncidentOut(
        id=1, key="llm/vllm-llama@1", pattern="gpu_oom_cascade", cluster=None, namespace="llm",
        workload="vllm-llama", workload_kind="Deployment", stage="contained", opened_at=T0,
        updated_at=T0, resolved_at=None, victims=[], evidence=[], timeline=timeline, runs=[],
        questions=[],
    )  # fmt: skip
    (stage,) = [t for t in inc.timeline if t.kind == "stage"]
    assert stage.message.count("containment did it") == 1
    again = IncidentOut.model_validate(inc.model_dump(mode="json"))
    assert again.timeline == inc.timeline
