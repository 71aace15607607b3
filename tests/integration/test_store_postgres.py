"""The incident store on real databases: migrations and every service function, idempotency.

Each test runs on both backends: a SQLite file and a fresh PostgreSQL database (skipped when
the server is unreachable, a failure under CI). The schema comes from ``alembic upgrade head``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session

from detector import db
from detector.db import Base
from detector.errors import StoreError
from detector.events.model import SourcePos
from detector.incidents import service
from detector.incidents.models import (
    DeadLetter,
    Evidence,
    Incident,
    IncidentPod,
    Question,
    TimelineEntry,
    Verdict,
)
from detector.incidents.schemas import DeadLetterOut, VerdictOut
from detector.report.schemas import IncidentOut
from detector.runbooks import service as run_service
from detector.runbooks.models import RunbookStep

T0 = 1_732_890_000.0
KEY = "prod/llm/vllm-llama@1732890000"
LOG = SourcePos(origin="examples/cascade/container.log", position=12)
KAFKA = SourcePos(origin="container-logs", position=4_000_000_000, partition=3)
TABLES = {
    "incidents",
    "incident_pods",
    "evidence",
    "timeline_entries",
    "verdicts",
    "runbook_runs",
    "runbook_steps",
    "questions",
    "dead_letters",
    "control_changes",
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest) -> str:
    """Return the URL of an empty database of each backend, migrated to head."""
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    value: str = request.getfixturevalue(fixture)
    db.upgrade(value)
    return value


@pytest.fixture
def session(url: str) -> Iterator[Session]:
    """Yield a session on the migrated database; the engine is disposed afterwards."""
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            yield s
    finally:
        engine.dispose()


def _incident(session: Session, key: str = KEY) -> Incident:
    return service.get_or_create_incident(
        session=session,
        key=key,
        namespace="llm",
        workload="vllm-llama",
        workload_kind="Deployment",
        cluster="prod",
        stage="suspected",
        opened_at=T0,
    )


def _count(session: Session, model: type[Base]) -> int:
    return int(session.scalar(select(func.count()).select_from(model)) or 0)


def test_migrated_schema_matches_models(url: str) -> None:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) >= TABLES
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
        db.upgrade(url)  # at head already: nothing to do
    finally:
        engine.dispose()


def test_downgrade_base_drops_everything_and_upgrade_restores(url: str) -> None:
    db.downgrade(url)
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) & TABLES == set()
        db.upgrade(url)
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) >= TABLES
    finally:
        engine.dispose()


def test_incident_is_created_once_and_survives_a_rerun(url: str, session: Session) -> None:
    first = _incident(session)
    session.commit()
    assert _incident(session).id == first.id
    assert first.opened_at == datetime.fromtimestamp(T0, tz=UTC)
    engine = db.make_engine(url)  # a restart: a new engine and session, same input
    try:
        with db.session_factory(engine)() as other:
            again = _incident(other)
            other.commit()
            assert again.id == first.id
            assert again.opened_at.tzinfo is not None
            assert again.opened_at == first.opened_at
            assert _count(other, Incident) == 1
    finally:
        engine.dispose()


def test_set_stage_reports_changes_and_stamps_resolution(session: Session) -> None:
    incident = _incident(session)
    assert service.set_stage(session=session, incident=incident, stage="cascading", time=T0 + 5)
    assert not service.set_stage(session=session, incident=incident, stage="cascading", time=T0 + 6)
    assert service.set_stage(session=session, incident=incident, stage="resolved", time=T0 + 99)
    session.commit()
    session.expire_all()
    assert incident.stage == "resolved"
    assert incident.resolved_at == datetime.fromtimestamp(T0 + 99, tz=UTC)
    assert incident.updated_at == incident.resolved_at
    with pytest.raises(ValueError):
        service.set_stage(session=session, incident=incident, stage="exploded", time=T0)


def test_victims_keep_their_order_of_failure(session: Session) -> None:
    incident = _incident(session)
    assert service.add_victim(session=session, incident=incident, pod="vllm-llama-7d9-a", time=T0)
    assert incident.victims[0].pod == "vllm-llama-7d9-a"  # collection loaded, then refreshed
    assert service.add_victim(session=session, incident=incident, pod="vllm-llama-7d9-b", time=T0)
    assert not service.add_victim(
        session=session, incident=incident, pod="vllm-llama-7d9-a", time=T0 + 9
    )
    assert service.add_victim(session=session, incident=incident, pod="vllm-llama-7d9-c", time=T0)
    session.commit()
    pods = [(v.pod, v.position) for v in incident.victims]
    assert pods == [("vllm-llama-7d9-a", 1), ("vllm-llama-7d9-b", 2), ("vllm-llama-7d9-c", 3)]
    assert _count(session, IncidentPod) == 3


def test_evidence_is_deduplicated_by_source_record(session: Session) -> None:
    incident = _incident(session)

    def add(source: SourcePos, time: float = T0 + 1.25) -> Evidence:
        return service.add_evidence(
            session=session,
            incident=incident,
            kind="gpu_oom",
            pod="vllm-llama-7d9-a",
            time=time,
            source=source,
            summary="CUDA out of memory: tried 2.00 GiB",
            text="torch.OutOfMemoryError: CUDA out of memory\x00",
            attrs={"bytes_tried": 2 * 1024**3, "framework": "vllm", "note": "nul\x00"},
        )

    first, again, kafka = add(LOG), add(LOG), add(KAFKA, T0 + 2.5)
    copy = add(SourcePos(origin="/var/log/pods/copy/0.log", position=LOG.position))
    session.commit()
    assert again.id == first.id
    assert copy.id == first.id  # the same record from another source adds nothing
    assert kafka.id != first.id
    assert _count(session, Evidence) == 2
    session.expire_all()
    assert first.source == LOG and first.source_partition == -1
    assert kafka.source == KAFKA
    assert first.attrs["bytes_tried"] == 2 * 1024**3
    assert "\x00" not in first.text and "\x00" not in first.attrs["note"]
    assert first.time == datetime.fromtimestamp(T0 + 1.25, tz=UTC)
    assert [e.id for e in incident.evidence] == [first.id, kafka.id]
    found = service.find_evidence(session=session, incident=incident, source=KAFKA)
    assert found is not None and found.id == kafka.id
    missing = SourcePos(origin="container-logs", position=1, partition=3)
    assert service.find_evidence(session=session, incident=incident, source=missing) is None


def test_timeline_dedupes_and_orders_by_time_then_id(session: Session) -> None:
    incident = _incident(session)
    ev = service.add_evidence(
        session=session,
        incident=incident,
        kind="crash_loop",
        pod="vllm-llama-7d9-a",
        time=T0 + 3,
        source=LOG,
        summary="Back-off restarting failed container",
        text="",
        attrs={},
    )
    late = service.add_timeline_entry(
        session=session,
        incident=incident,
        time=T0 + 10,
        kind="stage",
        message="cascading",
        dedupe_key="stage:cascading",
    )
    early = service.add_timeline_entry(
        session=session,
        incident=incident,
        time=T0 + 3,
        kind="signal",
        message="pod crash-looping",
        dedupe_key="ev:1",
        evidence=ev,
    )
    assert late is not None and early is not None
    assert (
        service.add_timeline_entry(
            session=session,
            incident=incident,
            time=T0 + 10,
            kind="stage",
            message="cascading",
            dedupe_key="stage:cascading",
        )
        is None
    )
    session.commit()
    entries = service.timeline(session=session, incident=incident)
    assert [e.id for e in entries] == [early.id, late.id]
    assert entries[0].evidence is not None and entries[0].evidence.id == ev.id
    assert [e.id for e in incident.timeline] == [early.id, late.id]
    assert _count(session, TimelineEntry) == 2


def test_verdicts_are_recorded_once(session: Session) -> None:

    def record() -> Verdict:
        return service.record_verdict(
            session=session,
            cluster=None,
            namespace="batch",
            workload="etl",
            verdict="not_gpu_oom_cascade",
            reason="host OOM: container OOMKilled (exit 137), no CUDA OOM",
            time=T0,
            source=KAFKA,
            dedupe_key="host_oom:container-logs[3]@4000000000",
        )

    first, again = record(), record()
    session.commit()
    assert again.id == first.id
    assert _count(session, Verdict) == 1
    [listed] = service.list_verdicts(session=session)
    out = VerdictOut.model_validate(listed)
    assert out.source == "container-logs[3]@4000000000"


def test_runs_and_steps_upsert_in_place(session: Session) -> None:
    incident = _incident(session)
    run = run_service.get_or_create_run(
        session=session,
        incident=incident,
        runbook="gpu-oom-containment",
        version="1",
        mode="dry_run",
    )
    same = run_service.get_or_create_run(
        session=session,
        incident=incident,
        runbook="gpu-oom-containment",
        version="1",
        mode="dry_run",
    )
    assert same.id == run.id
    for position, action in ((2, "enable_rate_limit"), (1, "lower_batch_ceiling")):
        run_service.upsert_step(
            session=session,
            run=run,
            position=position,
            action=action,
            title=action.replace("_", " "),
            status="planned",
            params={"max_num_seqs": 8},
            approval="auto",
        )
    step = run_service.upsert_step(
        session=session,
        run=run,
        position=1,
        action="lower_batch_ceiling",
        title="lower batch ceiling",
        status="succeeded",
        params={"max_num_seqs": 8},
        approval="auto",
        result={"ok": True, "rolled_out": ["vllm-llama-7d9-a"]},
        time=T0 + 30,
    )
    assert run_service.set_run_status(session=session, run=run, status="succeeded")
    assert not run_service.set_run_status(session=session, run=run, status="succeeded")
    session.commit()
    session.expire_all()
    assert _count(session, RunbookStep) == 2
    assert [(s.position, s.action, s.status) for s in run.steps] == [
        (1, "lower_batch_ceiling", "succeeded"),
        (2, "enable_rate_limit", "planned"),
    ]
    assert step.result == {"ok": True, "rolled_out": ["vllm-llama-7d9-a"]}
    assert step.updated_at == datetime.fromtimestamp(T0 + 30, tz=UTC)
    assert [r.id for r in incident.runs] == [run.id]


def test_question_answer_is_upserted_and_never_erased(session: Session) -> None:
    incident = _incident(session)
    ev = service.add_evidence(
        session=session,
        incident=incident,
        kind="engine_config",
        pod="vllm-llama-7d9-a",
        time=T0 - 60,
        source=LOG,
        summary="vLLM args",
        text="max_num_seqs=256",
        attrs={"max_num_seqs": 256},
    )

    def ask(answer: str | None, evidence: Evidence | None, time: float) -> Question:
        return service.upsert_question(
            session=session,
            incident=incident,
            qkey="batch_and_seq_len",
            question="What were the batch size and maximum sequence length before the OOM?",
            answer=answer,
            evidence=evidence,
            to_check="the engine's startup arguments",
            time=time,
        )

    unanswered = ask(None, None, T0)
    assert unanswered.answer is None and unanswered.answered_at is None
    answered = ask("max_num_seqs=256", ev, T0 + 1)
    kept = ask(None, None, T0 + 2)
    session.commit()
    session.expire_all()
    assert unanswered.id == answered.id == kept.id
    assert _count(session, Question) == 1
    assert kept.answer == "max_num_seqs=256"
    assert kept.evidence is not None and kept.evidence.id == ev.id
    assert kept.answered_at == datetime.fromtimestamp(T0 + 1, tz=UTC)


def test_dead_letters_keep_binary_raw_and_dedupe(session: Session) -> None:
    raw = bytes(range(256)) * 300  # 76,800 bytes with NUL and non-UTF-8 bytes
    letter = service.add_dead_letter(
        session=session, source=KAFKA, reason="malformed_json", detail="bad\x00byte", raw=raw
    )
    assert letter is not None
    assert (
        service.add_dead_letter(session=session, source=KAFKA, reason="x", detail="", raw=b"")
        is None
    )
    other = service.add_dead_letter(
        session=session, source=LOG, reason="unknown_format", detail="", raw=b"\xff\xfe\x00"
    )
    session.commit()
    session.expire_all()
    assert service.count_dead_letters(session=session) == 2
    assert letter.raw == raw[: 64 * 1024] and letter.raw_size_bytes == len(raw)
    assert other is not None and other.raw == b"\xff\xfe\x00" and other.source == LOG
    assert len(service.list_dead_letters(session=session)) == 2
    out = DeadLetterOut.model_validate(letter)
    assert out.source == "container-logs[3]@4000000000"
    assert _count(session, DeadLetter) == 2


def test_insert_race_loser_finds_the_winner_row(url: str, session: Session) -> None:
    _incident(session)
    session.commit()  # the winner committed first
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as loser:
            values = {
                "key": KEY,
                "pattern": "gpu_oom_cascade",
                "cluster": "prod",
                "namespace": "llm",
                "workload": "vllm-llama",
                "workload_kind": "Deployment",
                "stage": "suspected",
                "opened_at": datetime.fromtimestamp(T0, tz=UTC),
                "updated_at": datetime.fromtimestamp(T0, tz=UTC),
            }
            assert not db.insert_ignore(loser, Incident, values, ["key"])
            loser.commit()
    finally:
        engine.dispose()


def test_database_errors_become_store_errors(session: Session) -> None:
    ghost = Incident(id=999_999, key="ghost")
    with pytest.raises(StoreError, match="add_victim"):
        service.add_victim(session=session, incident=ghost, pod="p", time=T0)
    session.rollback()


def test_incident_out_reads_the_whole_incident(session: Session) -> None:
    incident = _incident(session)
    service.add_victim(session=session, incident=incident, pod="vllm-llama-7d9-a", time=T0)
    service.add_evidence(
        session=session,
        incident=incident,
        kind="gpu_oom",
        pod="vllm-llama-7d9-a",
        time=T0,
        source=LOG,
        summary="CUDA OOM",
        text="",
        attrs={},
    )
    service.add_timeline_entry(
        session=session, incident=incident, time=T0, kind="note", message="opened", dedupe_key="o"
    )
    run = run_service.get_or_create_run(
        session=session, incident=incident, runbook="rb", version="2", mode="live", time=T0
    )
    run_service.upsert_step(
        session=session,
        run=run,
        position=1,
        action="stagger_restarts",
        title="stagger restarts",
        status="awaiting_approval",
        params={},
        approval="oncall",
    )
    service.upsert_question(
        session=session,
        incident=incident,
        qkey="paged_attention",
        question="Is paged attention active?",
        answer=None,
        evidence=None,
        to_check="engine flags",
        time=T0,
    )
    session.commit()
    [listed] = service.list_incidents(session=session)
    fetched = service.get_incident(session=session, incident_id=listed.id)
    assert fetched is not None
    assert service.get_incident_by_key(session=session, key=KEY) is fetched
    out = IncidentOut.model_validate(fetched)
    assert out.key == KEY and out.stage == "suspected"
    assert [v.pod for v in out.victims] == ["vllm-llama-7d9-a"]
    assert out.evidence[0].source == str(LOG)
    assert out.timeline[0].message == "opened"
    assert out.runs[0].steps[0].status == "awaiting_approval"
    assert out.questions[0].answer is None
    assert '"opened_at":"2024-11-29T14:20:00Z"' in out.model_dump_json()
