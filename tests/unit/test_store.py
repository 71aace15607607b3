"""Fast checks of the store's pieces on SQLite: time type, text cleaning, engine, migrations path.

The service functions against both real backends are in
tests/integration/test_store_postgres.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Engine, MetaData, Table, func, select, text
from sqlalchemy.exc import StatementError
from sqlalchemy.orm import Session

from detector import db
from detector.db import Base, UTCDateTime, to_datetime, to_timestamp
from detector.errors import StoreError
from detector.events.model import SourcePos
from detector.incidents import service
from detector.incidents.models import RAW_LIMIT_BYTES, Evidence
from detector.incidents.schemas import EvidenceOut

T0 = 1_732_890_000.5


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    """Yield an engine on a SQLite file; the engine is disposed afterwards."""
    eng = db.make_engine(sqlite_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    """Yield a session on a schema made by create_all (unit tests only: fast)."""
    Base.metadata.create_all(engine)
    with db.session_factory(engine)() as s:
        yield s


def test_unix_seconds_convert_to_aware_utc_and_back() -> None:
    when = to_datetime(T0)
    assert when.tzinfo is UTC
    assert when == datetime(2024, 11, 29, 14, 20, 0, 500000, tzinfo=UTC)
    assert to_timestamp(when) == T0


def test_utc_datetime_round_trips_aware_on_sqlite(engine: Engine) -> None:
    table = Table("t", MetaData(), Column("at", UTCDateTime()))
    table.create(engine)
    paris = timezone(timedelta(hours=1))
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"at": datetime(2024, 11, 29, 15, 0, tzinfo=paris)}])
        stored = conn.execute(text("SELECT at FROM t")).scalar_one()
        read = conn.execute(select(table.c.at)).scalar_one()
    assert stored.startswith("2024-11-29 14:00:00")  # naive UTC on disk
    assert read == datetime(2024, 11, 29, 14, 0, tzinfo=UTC) and read.tzinfo is UTC


def test_utc_datetime_refuses_naive_values(engine: Engine) -> None:
    table = Table("t", MetaData(), Column("at", UTCDateTime()))
    table.create(engine)
    with pytest.raises(StatementError, match="naive datetime"), engine.begin() as conn:
        conn.execute(table.insert(), [{"at": datetime(2024, 11, 29)}])


def test_sqlite_engine_turns_on_foreign_keys_and_wal(engine: Engine) -> None:
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_in_memory_sqlite_skips_wal() -> None:
    eng = db.make_engine("sqlite://")
    try:
        with eng.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "memory"
    finally:
        eng.dispose()


def test_bad_url_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot use database URL"):
        db.make_engine("nosuchdb://user:secret@host/x")


def test_missing_or_foreign_migrations_is_a_clear_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="migrations not found"):
        db._alembic_config("sqlite://", migrations_dir=tmp_path / "migrations")
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "env.py").write_text("# some other project's Alembic env\n")
    with pytest.raises(StoreError, match="migrations not found"):
        db._alembic_config("sqlite://", migrations_dir=tmp_path / "migrations")


def test_migrations_dir_is_the_top_level_folder() -> None:
    assert (db.MIGRATIONS_DIR / "env.py").is_file()
    assert any(db.MIGRATIONS_DIR.glob("versions/2026_11_29_0001_*.py"))


def test_upgrade_failure_is_a_store_error(tmp_path: Path) -> None:
    missing_dir = tmp_path / "no" / "such" / "dir" / "x.db"
    with pytest.raises(StoreError, match="migrating"):
        db.upgrade(f"sqlite:///{missing_dir}")


def test_require_head_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(StoreError, match=r"no incident store at sqlite:///.*missing\.db"):
        db.require_head(f"sqlite:///{missing}")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(StoreError, match="in-memory"):
        db.require_head("sqlite://")


def test_require_head_refuses_an_unmigrated_store_then_accepts_it_at_head(
    sqlite_url: str,
) -> None:
    eng = db.make_engine(sqlite_url)
    try:
        with eng.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE other (x INTEGER)")
    finally:
        eng.dispose()
    with pytest.raises(StoreError, match="is not migrated, not at head"):
        db.require_head(sqlite_url)
    db.upgrade(sqlite_url, "0001")
    with pytest.raises(StoreError, match="at revision 0001, not at head"):
        db.require_head(sqlite_url)
    db.upgrade(sqlite_url)
    db.require_head(sqlite_url)


def test_require_head_hides_the_password() -> None:
    url = "postgresql+psycopg://ops:s3cret@127.0.0.1:1/nowhere"
    with pytest.raises(StoreError) as caught:
        db.require_head(url)
    assert "s3cret" not in str(caught.value) and "***" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain", "plain"),
        ("nul\x00byte", "nul\ufffdbyte"),
        ("lone \udcff surrogate", "lone ? surrogate"),
    ],
)
def test_clean_text_makes_log_text_storable(raw: str, clean: str) -> None:
    assert db.clean_text(raw) == clean


def test_clean_json_cleans_nested_strings_and_keys() -> None:
    value = {"a\x00": ["x\x00", 1, {"b": "\x00"}], "n": None, "t": ("y",)}
    assert db.clean_json(value) == {
        "a\ufffd": ["x\ufffd", 1, {"b": "\ufffd"}],
        "n": None,
        "t": ["y"],
    }


def test_evidence_source_maps_file_partition(session: Session) -> None:
    incident = service.get_or_create_incident(
        session=session,
        key="prod/llm/w@1",
        namespace="llm",
        workload="w",
        workload_kind="Deployment",
        cluster=None,
        stage="suspected",
        opened_at=T0,
    )
    file_pos = SourcePos(origin="pods.jsonl", position=7)
    ev = service.add_evidence(
        session=session,
        incident=incident,
        kind="gpu_oom",
        pod="w-1",
        time=T0,
        source=file_pos,
        summary="CUDA OOM",
        text="",
        attrs={},
    )
    session.commit()
    assert session.scalar(select(Evidence.source_partition)) == -1
    assert ev.source == file_pos
    assert EvidenceOut.model_validate(ev).source == "pods.jsonl:7"
    with pytest.raises(ValueError):
        service.add_evidence(
            session=session,
            incident=incident,
            kind="lb_response",  # a signal kind, not an evidence kind
            pod=None,
            time=T0,
            source=file_pos,
            summary="",
            text="",
            attrs={},
        )


def test_dead_letter_raw_is_truncated_to_the_limit(session: Session) -> None:
    raw = b"\x00\xff" * RAW_LIMIT_BYTES
    letter = service.add_dead_letter(
        session=session,
        source=SourcePos(origin="t", position=1, partition=0),
        reason="oversized",
        detail="d" * 10_000,
        raw=raw,
        time=T0,
    )
    assert letter is not None
    assert len(letter.raw) == RAW_LIMIT_BYTES and letter.raw_size_bytes == 2 * RAW_LIMIT_BYTES
    assert len(letter.detail) == service.DETAIL_LIMIT_CHARS
    assert letter.created_at == to_datetime(T0)


def test_the_same_record_from_another_source_adds_no_evidence(session: Session) -> None:
    incident = service.get_or_create_incident(
        session=session,
        key="llm/w@1",
        namespace="llm",
        workload="w",
        workload_kind="Deployment",
        cluster=None,
        stage="suspected",
        opened_at=T0,
    )

    def add(source: SourcePos, **changes: object) -> Evidence:
        values: dict[str, Any] = {
            "kind": "engine_config",
            "pod": "w-1",
            "time": T0,
            "summary": "vllm config",
            "text": "max_num_seqs=256",
            "attrs": {"max_num_seqs": 256},
        }
        return service.add_evidence(
            session=session, incident=incident, source=source, **(values | changes)
        )

    first = add(SourcePos(origin="a/container-logs.jsonl", position=5))
    again = add(SourcePos(origin="b/container-logs.jsonl", position=5))  # a copy of the file
    kafka = add(SourcePos(origin="k8s-logs", position=9, partition=0))  # produced as well
    assert first.id == again.id == kafka.id
    assert again.source == SourcePos(origin="a/container-logs.jsonl", position=5)
    others = [
        add(SourcePos(origin="b", position=1), time=T0 + 1),
        add(SourcePos(origin="b", position=2), pod="w-2"),
        add(SourcePos(origin="b", position=3), attrs={"max_num_seqs": 128}),
        add(SourcePos(origin="b", position=4), text="max_num_seqs=128"),
        add(SourcePos(origin="b", position=5), kind="gpu_oom"),
    ]
    assert len({first.id, *(row.id for row in others)}) == 6
    session.commit()
    assert session.scalar(select(func.count()).select_from(Evidence)) == 6
