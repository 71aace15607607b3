"""Several detector processes starting at once on a new store: one migrates, the others wait.

Three real processes are held at a barrier (a file each writes when ready, one file that lets
them all go) and then call ``detector.db.upgrade`` together, on one new PostgreSQL database
and on one new SQLite file. Without the migration lock two of them used to die with
``UniqueViolation ... pg_type_typname_nsp_index`` or ``table incidents already exists``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import inspect

from detector import db

PROCESSES = 3

# Wait for the go file, then migrate: the processes meet at the barrier and start together.
MIGRATE = """
import sys, time
from pathlib import Path
from detector import db
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.001)
db.upgrade(sys.argv[1])
"""


def migrate_at_once(url: str, tmp_path: Path) -> list[subprocess.CompletedProcess[str]]:
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(PROCESSES)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATE, url, str(flag), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag in ready
    ]
    try:
        while not all(flag.exists() for flag in ready):
            if any(p.poll() is not None for p in procs):
                break  # one died before the barrier: its output says why
            time.sleep(0.001)
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out, err)
        for p, (out, err) in zip(procs, outs, strict=True)
    ]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def new_url(request: pytest.FixtureRequest) -> str:
    """Return the URL of a new, empty database of each backend (not migrated)."""
    value: str = request.getfixturevalue(
        "sqlite_url" if request.param == "sqlite" else "postgres_url"
    )
    return value


def test_three_processes_migrating_a_new_store_at_once_all_succeed(
    new_url: str, tmp_path: Path
) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    results = migrate_at_once(new_url, barrier)
    for proc in results:
        assert proc.returncode == 0, proc.stderr
    db.require_head(new_url)  # raises unless the schema is at head
    engine = db.make_engine(new_url)
    try:
        with engine.connect() as conn:
            assert {"incidents", "controls", "alembic_version"} <= set(
                inspect(conn).get_table_names()
            )
    finally:
        engine.dispose()


def test_the_sqlite_lock_file_sits_beside_the_store(sqlite_url: str, tmp_path: Path) -> None:
    db.upgrade(sqlite_url)
    assert (tmp_path / "detector.db.migrate.lock").is_file()
    db.upgrade(sqlite_url)  # the lock is free again: a second run finds the schema at head
