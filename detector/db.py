"""Database engine, sessions, schema migrations (Alembic) and the declarative ``Base``.

The ORM models live with the domain that owns them (``detector.incidents.models``,
``detector.runbooks.models``); they share the ``Base`` and the column types defined here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import (
    BigInteger,
    DateTime,
    Dialect,
    Engine,
    Integer,
    MetaData,
    Table,
    TypeDecorator,
    create_engine,
    event,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from detector.errors import StoreError

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

# The Alembic scripts live in the top-level migrations/ folder of the source tree.
MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"


# Constraint names are fixed so that migrations (and SQLite batch mode) can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# 64-bit ids on PostgreSQL; SQLite only auto-increments a column declared INTEGER.
IdType = BigInteger().with_variant(Integer(), "sqlite")


def to_datetime(ts: float) -> datetime:
    """Convert Unix seconds (UTC) to a timezone-aware UTC datetime."""
    return datetime.fromtimestamp(ts, tz=UTC)


def to_timestamp(value: datetime) -> float:
    """Convert a timezone-aware datetime to Unix seconds."""
    return value.timestamp()


class UTCDateTime(TypeDecorator[datetime]):
    """Store timezone-aware datetimes as UTC and read them back timezone-aware UTC.

    PostgreSQL keeps them in ``timestamptz``; SQLite has no time zones, so the value is stored
    as naive UTC and UTC is attached again on the way out. Naive datetimes are refused
    (``ValueError``): they are ambiguous.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Normalize to UTC before writing."""
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Attach or convert to UTC after reading."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of the incident store (incidents and runbook runs)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


M = TypeVar("M", bound=Base)


def make_engine(url: str) -> Engine:
    """Create an engine for a database URL (``sqlite:///path`` or ``postgresql+psycopg://...``).

    SQLite connections get foreign keys on and, for a file database, write-ahead logging so
    that readers (the web UI) do not block the writer (the stream loop). Raises ``StoreError``
    for a URL SQLAlchemy cannot use.
    """
    try:
        parsed = make_url(url)
        engine = create_engine(parsed, pool_pre_ping=parsed.get_backend_name() != "sqlite")
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise StoreError(f"cannot use database URL {_redact(url)}: {exc}") from exc
    if engine.dialect.name == "sqlite":
        is_file = parsed.database not in (None, "", ":memory:") and "mode=memory" not in url
        event.listen(engine, "connect", _sqlite_on_connect(wal=is_file))
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Return a session factory bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision`` (``alembic upgrade head``).

    Raises ``StoreError`` when the migration scripts are missing or a migration fails.
    """
    try:
        command.upgrade(_alembic_config(url), revision)
    except (CommandError, SQLAlchemyError) as exc:
        raise StoreError(f"migrating {_redact(url)} to {revision} failed: {exc}") from exc
    log.info("database migrated url=%s revision=%s", _redact(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the database at ``url`` down to ``revision`` (``alembic downgrade base``).

    Raises ``StoreError`` when the migration scripts are missing or a migration fails.
    """
    try:
        command.downgrade(_alembic_config(url), revision)
    except (CommandError, SQLAlchemyError) as exc:
        raise StoreError(f"migrating {_redact(url)} down to {revision} failed: {exc}") from exc


def store_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap a store function so that SQLAlchemy errors surface as ``StoreError``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except SQLAlchemyError as exc:
            raise StoreError(f"{fn.__name__} failed: {type(exc).__name__}: {exc}") from exc

    return wrapper


def insert_ignore(
    session: Session, model: Any, values: Mapping[str, Any], keys: Sequence[str]
) -> bool:
    """Insert one row of ``model`` unless its unique ``keys`` exist; return True when inserted.

    ``INSERT ... ON CONFLICT (keys) DO NOTHING`` on SQLite (3.24+) and PostgreSQL: no
    exception and no aborted transaction when another session inserted the same key first.
    Pending ORM changes are flushed first. Raises ``StoreError`` on any other database.
    """
    session.flush()
    connection = session.connection()
    dialect = connection.dialect.name
    table = cast(Table, model.__table__)
    if dialect == "postgresql":
        stmt: Any = postgresql.insert(table).values(**values)
    elif dialect == "sqlite":
        stmt = sqlite.insert(table).values(**values)
    else:
        raise StoreError(f"unsupported database {dialect!r}: use SQLite or PostgreSQL")
    stmt = stmt.on_conflict_do_nothing(index_elements=list(keys))
    # rowcount of an INSERT is only kept when asked for: 1 inserted, 0 on conflict.
    result = connection.execute(stmt.execution_options(preserve_rowcount=True))
    return result.rowcount == 1


def get_or_insert(
    session: Session, model: type[M], values: dict[str, Any], keys: list[str]
) -> tuple[M, bool]:
    """Return the row of ``model`` with the unique ``keys`` of ``values`` and whether it is new."""
    stmt = select(model).filter_by(**{key: values[key] for key in keys})
    row = session.scalars(stmt).one_or_none()
    if row is not None:
        return row, False
    inserted = insert_ignore(session, model, values, keys)
    return session.scalars(stmt).one(), inserted


def clean_text(text: str) -> str:
    """Make log text storable: NUL (which PostgreSQL refuses) and lone surrogates replaced."""
    text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def clean_json(value: Any) -> Any:
    """Apply ``clean_text`` to every string (keys included) inside a JSON-like value."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def _alembic_config(url: str, migrations_dir: Path = MIGRATIONS_DIR) -> Config:
    """Build an Alembic config for ``url`` that points at the migration scripts."""
    env_py = migrations_dir / "env.py"
    # Check that it is ours: an installed package may sit next to some other migrations/.
    if not env_py.is_file() or "detector.incidents.models" not in env_py.read_text("utf-8"):
        raise StoreError(
            f"Alembic migrations not found at {migrations_dir}: run the detector from a source "
            "checkout or an editable install (pip install -e .), where migrations/ sits next "
            "to the detector package"
        )
    config = Config()
    config.set_main_option("script_location", str(migrations_dir))
    config.set_main_option("path_separator", "os")
    # Passed as an attribute, not an ini option, so a '%' in a password needs no escaping.
    config.attributes["url"] = url
    return config


def _sqlite_on_connect(*, wal: bool) -> Any:
    """Return a connect listener that sets the SQLite pragmas."""

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys=ON")
            if wal:
                cursor.execute("PRAGMA journal_mode=WAL")
        finally:
            cursor.close()

    return on_connect


def _redact(url: str) -> str:
    """Return ``url`` with any password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"
