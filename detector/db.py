"""Database engine, sessions, schema migrations (Alembic) and the declarative ``Base``.

The ORM models live with the domain that owns them (``detector.incidents.models``,
``detector.runbooks.models``); they share the ``Base`` and the column types defined here.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
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
    bindparam,
    create_engine,
    event,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Session, configure_mappers, sessionmaker
from sqlalchemy.pool import QueuePool
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import ReturnTypeFromArgs

from detector.errors import StoreError

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

# The Alembic scripts live in the top-level migrations/ folder of the source tree.
MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"


_URL_VAR = "DETECTOR_DATABASE__URL"

# The key of the PostgreSQL advisory lock held while migrating (any fixed 64-bit number):
# the bytes of "detector", as a signed bigint.
MIGRATE_LOCK_KEY = int.from_bytes(b"detector", "big", signed=True)


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
MAX_ID = 2**63 - 1  # the largest id a row can have (BIGINT; SQLite's INTEGER is 64-bit too)


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
        given = make_url(url)
        parsed = _process_memory(given)
        pool = {"poolclass": QueuePool} if parsed is not given else {}
        engine = create_engine(parsed, pool_pre_ping=parsed.get_backend_name() != "sqlite", **pool)
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise StoreError(f"cannot use database URL {redact(url)}: {exc}") from exc
    if engine.dialect.name == "sqlite":
        is_file = _sqlite_file(parsed) is not None
        event.listen(engine, "connect", _sqlite_on_connect(wal=is_file))
    return engine


class WriteTurns:
    """Turns at one SQLite database's write lock among the threads of this process.

    SQLite has one writer at a time (https://www.sqlite.org/lockingv3.html; in WAL mode too,
    https://www.sqlite.org/wal.html): a thread that finds the lock taken sleeps in SQLite's
    busy handler, and the stream loop, which writes batch after batch with no pause between
    them, takes it again before the sleeper wakes. The Slack sender's one write before it
    posts then waited seconds. Here a thread that asks for a turn waits on a condition, not
    in the busy handler, and the loop (``after_others``) lets every waiting thread take its
    turn before it starts its next batch.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._waiting = 0

    @contextmanager
    def turn(self, *, after_others: bool = False) -> Iterator[None]:
        """Hold the write turn for the block; ``after_others``: let waiting threads go first."""
        with self._cond:
            self._waiting += not after_others
            self._cond.wait_for(lambda: not self._held and (not after_others or not self._waiting))
            self._waiting -= not after_others
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()


_TURNS: weakref.WeakKeyDictionary[Engine, WriteTurns] = weakref.WeakKeyDictionary()
_TURNS_LOCK = threading.Lock()


@contextmanager
def write_turn(session: Session, *, after_others: bool = False) -> Iterator[None]:
    """Hold this process's write turn at the session's SQLite database for the block (see
    ``WriteTurns``); on other databases, which lock rows and not the whole file, nothing."""
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    if engine.dialect.name != "sqlite":
        yield
        return
    with _TURNS_LOCK:
        turns = _TURNS.setdefault(engine, WriteTurns())
    with turns.turn(after_others=after_others):
        yield


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Return a session factory bound to ``engine``; objects stay readable after commit.

    The mappers imported by then are configured now (about 0.1 s), not by the first query,
    which in ``detector run`` is the first incident's.
    """
    configure_mappers()
    return sessionmaker(bind=engine, expire_on_commit=False)


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision`` (``alembic upgrade head``).

    Safe when several processes start at once on a new database: the migration runs under a
    lock (``migration_lock``), so one process migrates while the others wait, then find the
    schema at ``revision`` and do nothing. Raises ``StoreError`` when the migration scripts
    are missing, the lock cannot be taken or a migration fails.
    """
    config = _alembic_config(url)
    with migration_lock(url):
        try:
            command.upgrade(config, revision)
        except (CommandError, SQLAlchemyError) as exc:
            raise StoreError(f"migrating {redact(url)} to {revision} failed: {exc}") from exc
    log.info("database migrated url=%s revision=%s", redact(url), revision)


@contextmanager
def migration_lock(url: str) -> Iterator[None]:
    """Hold the store's migration lock for the duration of the ``with`` block.

    PostgreSQL: the session-level advisory lock ``MIGRATE_LOCK_KEY`` (``pg_advisory_lock``),
    taken on a connection of its own and released after (the server also releases it when the
    connection dies); https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS.
    A SQLite file: ``flock`` on ``<file>.migrate.lock`` beside it (the file is left there).
    In-memory SQLite and other databases: no lock. Blocks until the lock is free; raises
    ``StoreError`` when the database or the lock file cannot be reached.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"cannot use database URL {redact(url)}: {exc}") from exc
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        with _advisory_lock(url):
            yield
    elif backend == "sqlite" and (path := _sqlite_file(parsed)) is not None:
        with _file_lock(Path(f"{path}.migrate.lock"), url):
            yield
    else:
        yield


@contextmanager
def _advisory_lock(url: str) -> Iterator[None]:
    """Hold the PostgreSQL advisory migration lock on a dedicated connection."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            key = {"key": MIGRATE_LOCK_KEY}
            if not conn.scalar(text("SELECT pg_try_advisory_lock(:key)"), key):
                log.info("waiting for the migration lock url=%s", redact(url))
                conn.execute(text("SELECT pg_advisory_lock(:key)"), key)
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), key)
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot lock {redact(url)} for migrating: {exc}") from exc
    finally:
        engine.dispose()


@contextmanager
def _file_lock(path: Path, url: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot lock {redact(url)} for migrating: {exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for the migration lock url=%s", redact(url))
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield  # closing the descriptor releases the lock
    finally:
        os.close(fd)


def require_head(url: str) -> None:
    """Check that the store at ``url`` exists and is migrated to head; create nothing.

    For the commands that change a running detector's store (kill switch, arming, approvals):
    a mistyped URL must not yield a new empty store. A SQLite file must exist (in-memory
    SQLite is always empty); then Alembic's current revision must be the scripts' head.
    Raises ``StoreError`` with one line that names the URL (password hidden).
    """
    where = redact(url)
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"cannot use database URL {where}: {exc}") from exc
    if parsed.get_backend_name() == "sqlite":
        path = _sqlite_file(parsed)
        if path is None or not Path(path).is_file():
            what = "an in-memory database is empty" if path is None else "no such file"
            raise StoreError(
                f"no incident store at {where} ({what}): check --db or {_URL_VAR}, "
                f"or create one with `detector migrate --db {where}`"
            )
    heads = set(ScriptDirectory.from_config(_alembic_config(url)).get_heads())
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            current = set(MigrationContext.configure(conn).get_current_heads())
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot read the incident store at {where}: {_first_line(exc)}") from exc
    finally:
        engine.dispose()
    if current != heads:
        at = f"at revision {', '.join(sorted(current))}" if current else "not migrated"
        raise StoreError(
            f"the incident store at {where} is {at}, not at head {', '.join(sorted(heads))}: "
            f"check --db or {_URL_VAR}, or run `detector migrate --db {where}` once"
        )


@contextmanager
def existing_store(url: str) -> Iterator[Session]:
    """Yield a session on the detector's store at ``url``, which must exist at head.

    For the commands that read or change a running detector's store: ``require_head`` first,
    so a mistyped URL never creates an empty store. The caller commits. Raises StoreError.
    """
    require_head(url)
    engine = make_engine(url)
    try:
        with session_factory(engine)() as session:
            yield session
    finally:
        engine.dispose()


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the database at ``url`` down to ``revision`` (``alembic downgrade base``).

    Raises ``StoreError`` when the migration scripts are missing or a migration fails.
    """
    try:
        command.downgrade(_alembic_config(url), revision)
    except (CommandError, SQLAlchemyError) as exc:
        raise StoreError(f"migrating {redact(url)} down to {revision} failed: {exc}") from exc


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
    stmt = _insert(session, cast(Table, model.__table__)).values(**values)
    stmt = stmt.on_conflict_do_nothing(index_elements=list(keys))
    # rowcount of an INSERT is only kept when asked for: 1 inserted, 0 on conflict.
    result = session.connection().execute(stmt.execution_options(preserve_rowcount=True))
    return result.rowcount == 1


def _insert(session: Session, target: Any) -> Any:
    """Return the dialect's INSERT of ``target`` (a table or a mapped class), which has
    ``on_conflict_do_nothing``/``_do_update``; raises ``StoreError`` beyond SQLite/PostgreSQL."""
    dialect = session.connection().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(target)
    if dialect == "sqlite":
        return sqlite.insert(target)
    raise StoreError(f"unsupported database {dialect!r}: use SQLite or PostgreSQL")


def upsert(
    session: Session,
    model: Any,
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    update: Callable[[Any], Mapping[str, Any]],
) -> None:
    """Insert ``rows`` of ``model``; a row whose unique ``keys`` exist updates it instead.

    ``INSERT ... ON CONFLICT (keys) DO UPDATE SET ...`` on SQLite (3.24+) and PostgreSQL, one
    executemany: ``update(excluded)`` returns the SET clause, column name -> SQL expression,
    where ``excluded`` holds the proposed row's columns (``excluded.value``) and the model's
    own columns are the stored row's (https://www.sqlite.org/lang_upsert.html,
    https://www.postgresql.org/docs/current/sql-insert.html#SQL-ON-CONFLICT). Pending ORM
    changes are flushed first. The statement is built once per ``update`` function: pass a
    module-level one. Raises ``StoreError`` on any other database.
    """
    if not rows:
        return
    session.flush()
    dialect = session.connection().dialect.name
    stmt = _UPSERTS.get((dialect, model, tuple(keys), update))
    if stmt is None:  # built once per dialect, model, keys and ``update`` function
        stmt = _insert(session, cast(Table, model.__table__))
        stmt = stmt.on_conflict_do_update(
            index_elements=list(keys), set_=dict(update(stmt.excluded))
        )
        _UPSERTS[dialect, model, tuple(keys), update] = stmt
    session.connection().execute(stmt, [dict(row) for row in rows])


_UPSERTS: dict[tuple[str, Any, tuple[str, ...], Callable[[Any], Any]], Any] = {}


class greatest(ReturnTypeFromArgs[Any]):  # an SQL function: named as in SQL
    """The larger of its arguments: ``GREATEST`` on PostgreSQL, ``max(a, b)`` on SQLite."""

    inherit_cache = True


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: greatest, compiler: SQLCompiler, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


def get_or_insert(
    session: Session, model: type[M], values: dict[str, Any], keys: list[str]
) -> tuple[M, bool]:
    """Return the row of ``model`` with the unique ``keys`` of ``values`` and whether it is new.

    A SELECT; when it finds nothing, a Core ``INSERT ... ON CONFLICT (keys) DO NOTHING`` and
    the SELECT again, which reads the new row (or the one another session inserted meanwhile:
    then it is not new). Both statements are built once per model and keys with bind
    parameters (``_lookup_statements``), so a call pays neither their construction nor their
    cache key: on SQLite the three statements of a new row cost about 0.4x the SELECT built
    per call and the ORM ``INSERT ... RETURNING`` they replace. A key that is None (NULL
    never equals, nor conflicts) takes those statements, built for the call.
    """
    if any(values[key] is None for key in keys):
        return _get_or_insert_null(session, model, values, keys)
    find, insert = _lookup_statements(session, model, tuple(keys))
    params = {f"key_{key}": values[key] for key in keys}
    row = session.scalars(find, params).one_or_none()
    if row is not None:
        return row, False
    # rowcount of an INSERT is only kept when asked for: 1 inserted, 0 on conflict.
    inserted = session.connection().execute(insert, values).rowcount == 1
    return session.scalars(find, params).one(), inserted


_LOOKUPS: dict[tuple[str, type[Any], tuple[str, ...]], tuple[Any, Any]] = {}


def _lookup_statements(
    session: Session, model: type[Any], keys: tuple[str, ...]
) -> tuple[Any, Any]:
    """Return ``get_or_insert``'s SELECT by ``keys`` (bind parameters ``key_<name>``) and its
    insert-unless-present of ``model``'s table, built on first use per dialect."""
    dialect = session.connection().dialect.name
    found = _LOOKUPS.get((dialect, model, keys))
    if found is None:
        find = select(model).where(*(getattr(model, k) == bindparam(f"key_{k}") for k in keys))
        insert = _insert(session, cast(Table, model.__table__))
        insert = insert.on_conflict_do_nothing(index_elements=list(keys))
        found = _LOOKUPS[dialect, model, keys] = (
            find,
            insert.execution_options(preserve_rowcount=True),
        )
    return found


def _get_or_insert_null(
    session: Session, model: type[M], values: dict[str, Any], keys: list[str]
) -> tuple[M, bool]:
    """``get_or_insert`` with a key that is None: the statements built for the call
    (``IS NULL``), an ORM ``INSERT ... ON CONFLICT DO NOTHING RETURNING``."""
    stmt = select(model).filter_by(**{key: values[key] for key in keys})
    row = session.scalars(stmt).one_or_none()
    if row is not None:
        return row, False
    insert = _insert(session, model).values(**values)
    insert = insert.on_conflict_do_nothing(index_elements=list(keys)).returning(model)
    row = session.scalars(insert).one_or_none()
    if row is not None:
        return row, True
    return session.scalars(stmt).one(), False


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


_MEMORY_KEEPERS: dict[str, sqlite3.Connection] = {}


def _process_memory(parsed: URL) -> URL:
    """Return ``parsed``, with a plain in-memory SQLite URL (``sqlite://``) made one database
    per process: a named shared-cache in-memory database kept open by a connection held here,
    so the migration, the pipeline and the read model of one command see the same tables
    (each plain ``:memory:`` connection is a new, empty database).
    https://www.sqlite.org/inmemorydb.html"""
    if parsed.get_backend_name() != "sqlite" or (parsed.database or "") not in ("", ":memory:"):
        return parsed
    uri = f"file:detector-{os.getpid()}?mode=memory&cache=shared"
    if uri not in _MEMORY_KEEPERS:
        _MEMORY_KEEPERS[uri] = sqlite3.connect(uri, uri=True, check_same_thread=False)
    return make_url(f"sqlite:///{uri}&uri=true")


def _sqlite_file(parsed: URL) -> str | None:
    """Return the file of a SQLite URL, or None for an in-memory database."""
    database = parsed.database or ""
    if database in ("", ":memory:") or "mode=memory" in database:
        return None
    if parsed.query.get("mode") == "memory":
        return None
    if database.startswith("file:"):  # a URI filename (?uri=true)
        database = database.removeprefix("file:").partition("?")[0]
    return database


def _first_line(exc: SQLAlchemyError) -> str:
    """Return the first line of a database error's message (without SQLAlchemy's links)."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def redact(url: str) -> str:
    """Return ``url`` with any password hidden, for messages and logs (``***``).

    A URL whose user part holds an unencoded ``@`` has everything before its last ``@`` hidden
    (a parser would take part of the password for the host)."""
    if _ats_before_host(url) > 1:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparseable URL>"


def _ats_before_host(url: str) -> int:
    """Count the ``@`` in a URL's authority (``scheme://user:password@host:port``)."""
    _, sep, rest = url.partition("://")
    return rest.split("/", 1)[0].count("@") if sep else 0


def check_url(url: str) -> None:
    """Raise ``StoreError`` (one line, the password hidden) for a database URL no store can be
    at: one SQLAlchemy cannot parse, with a NUL byte, a port out of 1-65535, or an unencoded
    ``@`` in the user or password (which would send part of the password as the host)."""
    where = redact(url)
    if "\x00" in url or "%00" in url:
        raise StoreError(f"cannot use database URL {where}: it contains a NUL byte")
    if _ats_before_host(url) > 1:
        raise StoreError(
            f"cannot use database URL {where}: more than one '@' before the host; "
            "percent-encode an '@' in the user or password as %40"
        )
    try:
        port = make_url(url).port
    except (ArgumentError, ValueError) as exc:
        raise StoreError(f"cannot use database URL {where}: {exc}") from exc
    if port is not None and not 0 < port < 65536:
        raise StoreError(f"cannot use database URL {where}: port {port} is not in 1-65535")
