"""Operator controls through the one decide flow: history, timeline notes, unknown workloads.

Each test runs on a SQLite file and on a fresh PostgreSQL database (skipped when the server is
unreachable, a failure under CI), migrated with ``alembic upgrade head``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.orm import Session

from detector import db
from detector.errors import ApprovalError
from detector.events.model import SourcePos
from detector.incidents import service
from detector.incidents.models import Incident
from detector.runbooks import approvals, controls
from detector.runbooks.flows import DecisionKind, DecisionRequest, decide

T0 = 1_741_943_000.0
NOW = 1_796_000_000.0  # the wall clock of the decisions, passed in


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def session(request: pytest.FixtureRequest) -> Iterator[Session]:
    """Yield a session on an empty database of each backend, migrated to head."""
    url: str = request.getfixturevalue(
        "sqlite_url" if request.param == "sqlite" else "postgres_url"
    )
    db.upgrade(url)
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            yield s
    finally:
        engine.dispose()


def incident(session: Session, key: str, workload: str, stage: str) -> Incident:
    namespace, _, name = workload.partition("/")
    return service.get_or_create_incident(
        session=session,
        key=key,
        namespace=namespace,
        workload=name,
        workload_kind="Deployment",
        cluster=None,
        stage=stage,
        opened_at=T0,
    )


def control_notes(session: Session, inc: Incident) -> list[dict[str, Any]]:
    return [
        t.detail
        for t in service.timeline(session=session, incident=inc)
        if t.detail is not None and t.detail.get("event") == "control"
    ]


def ask(session: Session, kind: DecisionKind, now: float, **fields: Any) -> None:
    decide(DecisionRequest(kind, "cli", **fields), session=session, approvers=(), now=now)
    session.commit()


def test_every_change_is_kept_and_noted_on_the_incidents_it_touches(session: Session) -> None:
    open_one = incident(session, "llm/a@1", "llm/a", "cascading")
    other_open = incident(session, "llm/b@1", "llm/b", "suspected")
    closed_a = incident(session, "llm/a@0", "llm/a", "resolved")
    closed_b = incident(session, "llm/b@0", "llm/b", "resolved")
    session.commit()
    kill = {"actor": "ops", "reason": "drill", "host": "bastion-1"}
    ask(session, DecisionKind.KILL_SWITCH_ON, NOW, **kill)
    ask(session, DecisionKind.ARM, NOW + 60, actor="alice", workload="llm/a", host="laptop")
    ask(session, DecisionKind.KILL_SWITCH_OFF, NOW + 120, actor="ops")

    rows = controls.history(session=session)
    assert [(r.name, r.scope, r.enabled) for r in rows] == [
        ("kill_switch", "*", False),
        ("armed", "llm/a", True),
        ("kill_switch", "*", True),
    ]
    first = rows[-1]
    assert (first.changed_by, first.via, first.host, first.reason) == (
        "ops",
        "cli",
        "bastion-1",
        "drill",
    )
    assert first.changed_at == datetime.fromtimestamp(NOW, tz=UTC)
    assert [r.enabled for r in controls.history(session=session, limit=1)] == [False]
    assert approvals.kill_switch_on(session=session) is False  # the latest state still rules

    # the kill switch: every open incident; arming: the open ones and every one of llm/a
    events = {
        inc.key: [(n["control"], n["enabled"]) for n in control_notes(session, inc)]
        for inc in (open_one, other_open, closed_a, closed_b)
    }
    both_switches = [("kill_switch", True), ("armed", True), ("kill_switch", False)]
    assert events == {
        "llm/a@1": both_switches,
        "llm/b@1": both_switches,
        "llm/a@0": [("armed", True)],
        "llm/b@0": [],
    }
    note = service.timeline(session=session, incident=open_one)[0]
    assert note.message == (
        "kill switch on by ops via cli from bastion-1 at 2026-11-30T00:53:20+00:00: drill"
    )
    assert note.time == datetime.fromtimestamp(NOW, tz=UTC)


def test_arming_a_workload_the_store_never_saw_needs_force(session: Session) -> None:
    incident(session, "llm/vllm-llama@1", "llm/vllm-llama", "resolved")
    service.record_verdict(
        session=session,
        cluster=None,
        namespace="llm",
        workload="vllm-mistral",
        verdict="host_oom",
        reason="OOMKilled",
        time=T0,
        source=SourcePos("k8s-events", 7),
        dedupe_key="verdict:1",
    )
    session.commit()
    assert controls.known_workloads(session=session) == {"llm/vllm-llama", "llm/vllm-mistral"}
    with pytest.raises(ApprovalError, match="did you mean llm/vllm-llama") as caught:
        ask(session, DecisionKind.ARM, NOW, workload="llm/vllm-lama")
    assert caught.value.reason == "not_found"
    session.rollback()
    assert controls.history(session=session) == []
    ask(session, DecisionKind.DISARM, NOW, workload="batch/train")  # the safe way: no --force
    ask(session, DecisionKind.ARM, NOW, workload="llm/vllm-mistral")  # a verdict: known
    ask(session, DecisionKind.ARM, NOW, workload="llm/vllm-lama", force=True)
    kw = {"session": session, "namespace": "llm", "armed_workloads": ()}
    assert approvals.is_armed(**kw, workload="vllm-lama") is True
    assert [r.scope for r in controls.history(session=session)] == [
        "llm/vllm-lama",
        "llm/vllm-mistral",
        "batch/train",
    ]


def test_close_workloads_suggests_what_looks_like_a_typo() -> None:
    known = {"llm/vllm-llama", "llm/vllm-mistral", "batch/train"}
    assert controls.close_workloads("llm/vllm-lama", known)[0] == "llm/vllm-llama"
    assert controls.close_workloads("web/frontend", known) == []
