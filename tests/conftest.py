"""Shared database fixtures: a SQLite file and a fresh PostgreSQL database per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError

# The machine's PostgreSQL server: trust auth on 127.0.0.1:5432, database "test".
# DETECTOR_TEST_POSTGRES_URL replaces it, e.g. in a CI job with a password.
PG_ADMIN_URLS = (
    "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "postgresql+psycopg://root@127.0.0.1:5432/test",
)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """Return the URL of a new SQLite file database."""
    return f"sqlite:///{tmp_path / 'detector.db'}"


def _admin_url() -> tuple[URL | None, str]:
    """Return a PostgreSQL URL that accepts a connection, or None and why none did."""
    override = os.environ.get("DETECTOR_TEST_POSTGRES_URL")
    errors = []
    for candidate in (override,) if override else PG_ADMIN_URLS:
        url = make_url(candidate)
        engine = create_engine(
            url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        try:
            with engine.connect():
                return url, ""
        except OperationalError as exc:
            errors.append(f"{url.render_as_string()}: {str(exc.orig).strip()}")
        finally:
            engine.dispose()
    return None, "; ".join(errors)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """Create a fresh database on the PostgreSQL server, yield its URL, then drop it.

    Skips when the server is unreachable, except under CI (env ``CI`` set), where it fails.
    """
    admin, why = _admin_url()
    if admin is None:
        message = f"PostgreSQL unreachable ({why})"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{message}; CI must run the PostgreSQL tests")
        pytest.skip(message)
    name = f"detector_test_{uuid.uuid4().hex[:12]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield admin.set(database=name).render_as_string(hide_password=False)
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


# The Slack emulator lives beside this file (tests/ is on sys.path, as for recordings.py).
from slack_emulator import SlackEmulator  # noqa: E402


@pytest.fixture
def slack_emulator() -> Iterator[SlackEmulator]:
    """Start a Slack emulator (Web API over HTTP, Socket Mode over WebSocket), stop it after."""
    with SlackEmulator() as emulator:
        yield emulator
