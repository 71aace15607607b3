"""The outbox: what is to be said about an incident, written with the timeline that causes it.

``NotificationThread`` is an incident's root message (one per incident: its channel, its Slack
``ts`` once posted, the digest of what it shows); ``Notification`` is one timeline entry that
the thread must tell, with the reply (``batch``) it went into and that reply's ``ts``. Rows
are written in the transaction of the entries (``detector.notify.outbox.enqueue``) and sent
after the commit (``detector.notify.slack.sender``); claims and sent marks make a crash, a
restart or a second process neither lose nor repeat a message (``detector.notify.outbox``).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from detector.db import Base, IdType, UTCDateTime


class NotificationThread(Base):
    """An incident's root message: posted once, then updated in place."""

    __tablename__ = "notification_threads"

    incident_id: Mapped[int] = mapped_column(
        IdType, ForeignKey("incidents.id", ondelete="CASCADE"), primary_key=True
    )
    channel: Mapped[str] = mapped_column(String(255))
    ts: Mapped[str | None] = mapped_column(String(32))  # Slack's message id, once posted
    digest: Mapped[str | None] = mapped_column(String(64))  # of the blocks last posted
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # the lease, wall clock
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # of posting the root message
    drill: Mapped[bool] = mapped_column(Boolean, default=False)  # a replay: labelled, no mention
    error: Mapped[str] = mapped_column(Text, default="")


class Notification(Base):
    """One timeline entry to tell in the incident's thread; sent once, in one reply."""

    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_pending", "incident_id", "sent_at"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    entry_id: Mapped[int] = mapped_column(
        IdType, ForeignKey("timeline_entries.id", ondelete="CASCADE"), unique=True
    )
    time: Mapped[datetime] = mapped_column(UTCDateTime())  # the entry's event time
    batch: Mapped[str | None] = mapped_column(String(64))  # the reply it goes into
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # wall clock
    ts: Mapped[str | None] = mapped_column(String(32))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str] = mapped_column(Text, default="")


class OutboxEvent(Base):
    """One event for a service beside Slack (``target``: ``pagerduty``), sent once.

    Written in the transaction of the timeline entry that causes it, unique per
    (target, dedupe_key); a sender claims it under a lease (``claimed_at``), counts the attempt
    before the call, marks ``sent_at`` after; ``due_at`` holds a retry back (Retry-After,
    back-off). ``detector.notify.pagerduty.queue`` writes and claims them.
    """

    __tablename__ = "outbox_events"
    __table_args__ = (
        UniqueConstraint("target", "dedupe_key"),
        Index("ix_outbox_events_pending", "target", "sent_at"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    target: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(32))  # trigger | acknowledge | resolve
    dedupe_key: Mapped[str] = mapped_column(String(255))
    time: Mapped[datetime] = mapped_column(UTCDateTime())  # the cause's event time
    due_at: Mapped[datetime] = mapped_column(UTCDateTime())  # not sent before (wall clock)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    drill: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str] = mapped_column(Text, default="")
