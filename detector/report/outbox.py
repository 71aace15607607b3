"""What the outbox delivered for an incident: the read model's view of its Slack thread.

The outbox (``detector.notify.models``: ``NotificationThread``, ``Notification``) keeps the
sends, which the timeline does not. ``report`` may not import ``detector.notify`` (the import
contract "report reads the store; it drives nothing"), so the columns read here are named as
lightweight table clauses over the same tables; ``tests/unit/test_report_outbox.py`` checks
them against the ORM. Reads only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from sqlalchemy import Boolean, String, Text, column, func, select, table
from sqlalchemy.orm import Session

from detector.db import IdType, UTCDateTime, store_errors
from detector.incidents.schemas import Out

THREADS: Final = table(
    "notification_threads",
    column("incident_id", IdType),
    column("channel", String),
    column("ts", String),
    column("drill", Boolean),
    column("error", Text),
)
NOTIFICATIONS: Final = table(
    "notifications",
    column("id", IdType),
    column("incident_id", IdType),
    column("time", UTCDateTime()),
    column("sent_at", UTCDateTime()),
)


class DeliveryOut(Out):
    """An incident's Slack thread as delivered.

    ``queued``/``sent``: its replies' timeline entries, and those marked sent;
    ``first_sent_at``: the wall-clock time of the first reply delivered (None: none was),
    ``first_told_at``: the event time of the entry that reply told; ``root_posted``: the root
    message has its Slack ``ts``; ``drill``: a replay's thread; ``error``: the last delivery's.
    """

    channel: str
    drill: bool
    root_posted: bool
    queued: int
    sent: int
    first_sent_at: datetime | None
    first_told_at: datetime | None
    error: str


@store_errors
def load_delivery(*, session: Session, incident_id: int) -> DeliveryOut | None:
    """Return the incident's Slack thread as delivered; None when none was ever queued.

    Raises StoreError.
    """
    thread = session.execute(
        select(THREADS.c.channel, THREADS.c.ts, THREADS.c.drill, THREADS.c.error).where(
            THREADS.c.incident_id == incident_id
        )
    ).first()
    if thread is None:
        return None
    rows = NOTIFICATIONS.c
    mine = rows.incident_id == incident_id
    queued, sent = session.execute(
        select(func.count(rows.id), func.count(rows.sent_at)).where(mine)
    ).one()
    first = session.execute(
        select(rows.sent_at, rows.time)
        .where(mine, rows.sent_at.is_not(None))
        .order_by(rows.sent_at, rows.id)
        .limit(1)
    ).first()
    return DeliveryOut(
        channel=thread.channel,
        drill=bool(thread.drill),
        root_posted=thread.ts is not None,
        queued=queued,
        sent=sent,
        first_sent_at=first.sent_at if first is not None else None,
        first_told_at=first.time if first is not None else None,
        error=thread.error or "",
    )
