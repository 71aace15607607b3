"""Alembic environment of the incident store.

The database URL comes from the Alembic config: the ``url`` attribute that
``detector.db.upgrade`` sets, else the ``sqlalchemy.url`` option, else the environment variable
``DETECTOR_DATABASE__URL`` (for ``alembic upgrade head`` from the command line).
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from alembic.util import CommandError

import detector.incidents.models  # registers the incident tables on Base
import detector.notify.models  # registers the outbox tables on Base
import detector.runbooks.models  # registers the runbook tables on Base
import detector.web.models  # noqa: F401  (registers the ended web sessions on Base)
from detector.db import Base, make_engine

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    """Return the URL to migrate, or fail with a message that says where to set it."""
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    url = url or os.environ.get("DETECTOR_DATABASE__URL")
    if not url:
        raise CommandError(
            "no database URL: set DETECTOR_DATABASE__URL (e.g. sqlite:///detector.db)"
        )
    return str(url)


def run_migrations_offline() -> None:
    """Emit the migration SQL to stdout (``alembic upgrade head --sql``)."""
    context.configure(
        url=_database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Apply the migrations through a live connection, then release it."""
    engine = make_engine(_database_url())
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                # SQLite cannot ALTER most things; batch mode recreates the table instead.
                render_as_batch=connection.dialect.name == "sqlite",
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


# Logging is configured from alembic.ini only when run from the command line; a programmatic
# upgrade (no config file) leaves the host application's logging alone.
if config.config_file_name is not None and config.attributes.get("url") is None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
