"""The read model's view of the outbox: what was delivered to Slack for an incident.

A SQLite store with the schema by ``create_all`` (unit tests only); the rows are written as
the outbox and its sender write them (``detector.notify.outbox``: ``enqueue``, ``mark_sent``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session

from detector import db
from detector.db import Base
from detector.incidents.models import Incident, TimelineEntry
from detector.notify.models import Notification, NotificationThread
from detector.report.outbox import NOTIFICATIONS, THREADS, load_delivery

T0 = datetime(2025, 3, 14, 9, 3, 37, tzinfo=UTC)


def test_the_tables_read_are_the_outboxs_own() -> None:
    """report may not import notify: its table clauses name the ORM's tables and columns."""
    for clause, model in ((THREADS, NotificationThread), (NOTIFICATIONS, Notification)):
        orm = model.__table__
        assert clause.name == orm.name
        for col in clause.c:
            assert col.name in orm.c, f"{orm.name}.{col.name}"
            assert type(col.type) is type(orm.c[col.name].type), f"{orm.name}.{col.name}"


@pytest.fixture
def session(sqlite_url: str) -> Iterator[Session]:
    engine = db.make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    try:
        with db.session_factory(engine)() as s:
            yield s
    finally:
        engine.dispose()


def incident(session: Session, entries: int) -> Incident:
    inc = Incident(key="llm/w@1", namespace="llm", workload="w", workload_kind="Deployment",
                   stage="cascading", opened_at=T0, updated_at=T0)  # fmt: skip
    session.add(inc)
    session.flush()
    for i in range(entries):
        at = T0 + timedelta(seconds=i)
        session.add(TimelineEntry(incident_id=inc.id, time=at, kind="stage", message=f"e{i}",
                                  dedupe_key=f"e{i}"))  # fmt: skip
    session.flush()
    return inc


def test_nothing_queued_is_none(session: Session) -> None:
    inc = incident(session, 1)
    assert load_delivery(session=session, incident_id=inc.id) is None


def test_the_first_delivered_reply_gives_the_time(session: Session) -> None:
    inc = incident(session, 3)
    session.add(NotificationThread(incident_id=inc.id, channel="#oncall", ts="1741943019.000100",
                                   attempts=1, drill=False, error=""))  # fmt: skip
    ids = [e.id for e in session.query(TimelineEntry).order_by(TimelineEntry.id)]
    sent = [T0 + timedelta(seconds=4.5), T0 + timedelta(seconds=2.5), None]
    for entry_id, at in zip(ids, sent, strict=True):
        session.add(Notification(incident_id=inc.id, entry_id=entry_id, time=T0, sent_at=at,
                                 ts="1" if at else None, attempts=1, error=""))  # fmt: skip
    session.commit()
    found = load_delivery(session=session, incident_id=inc.id)
    assert found is not None
    assert (found.channel, found.drill, found.root_posted) == ("#oncall", False, True)
    assert (found.queued, found.sent) == (3, 2)
    assert found.first_sent_at == T0 + timedelta(seconds=2.5)
    assert found.first_told_at == T0
