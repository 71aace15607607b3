"""The outbox: queue what an incident's thread must tell, and claim it for sending.

``enqueue`` runs in the transaction that wrote the timeline entries (the pipeline's notify
stage, a decision's flow): it adds the incident's root-message row once and one
``Notification`` per told entry not queued yet, so the entries and their notifications commit
together. A sender takes the incident's thread on a lease (``take``), counts each attempt
in the store before it calls Slack, and marks what was sent after (``release``); a lease left
by a sender that died runs out, and an attempted message is first looked for in Slack (by the
key in its metadata) before it is posted again, so nothing is posted twice.

Told entries: the incident opening, stage changes, victims, a person's decision on a step
(``approval:<step>``, told at once with who, how and when), and every step event but the
"planned" lines (the root message lists the steps and their state) and the step taking up a
person's decision (``approved``, ``denied``: the decision was told when it was made; what the
step then does is told). Evidence lines are not told one by one: a storm of them would be
hundreds of replies. The untold entries stay on the timeline, the incident's record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import ColumnElement, and_, exists, not_, or_, select, update
from sqlalchemy.orm import Session

from detector import db
from detector.db import insert_ignore, store_errors
from detector.incidents.models import Incident, TimelineEntry
from detector.notify.models import Notification, NotificationThread
from detector.runbooks.transitions import Move

# A step's move that takes up a person's decision; ``approvals.decide`` told the decision.
TAKEN_UP = (Move.APPROVED, Move.DENIED)


def told() -> ColumnElement[bool]:
    """Return the SQL condition of the timeline entries a thread tells (see the module doc)."""
    e = TimelineEntry
    untold = ["%:planned", *(f"step:%:{move.value}" for move in TAKEN_UP)]
    return or_(
        e.kind.in_(("note", "stage")),
        and_(e.kind == "signal", e.dedupe_key.like("victim:%")),
        and_(e.kind == "step", *(not_(e.dedupe_key.like(key)) for key in untold)),
    )


@store_errors
def enqueue(*, session: Session, incident: Incident, channel: str, drill: bool = False) -> int:
    """Queue the incident's root message (once) and its told entries not queued yet.

    ``drill``: the thread tells a replay (set when the thread is first queued). Runs in the
    caller's transaction; returns how many entries were queued. Raises StoreError.
    """
    values = {
        "incident_id": incident.id,
        "channel": channel,
        "attempts": 0,
        "drill": drill,
        "error": "",
    }
    insert_ignore(session, NotificationThread, values, ["incident_id"])
    queued = exists().where(Notification.entry_id == TimelineEntry.id)
    stmt = (
        select(TimelineEntry.id, TimelineEntry.time)
        .where(TimelineEntry.incident_id == incident.id, told(), not_(queued))
        .order_by(TimelineEntry.id)
    )
    count = 0
    for entry_id, time in session.execute(stmt):
        values = {
            "incident_id": incident.id,
            "entry_id": entry_id,
            "time": time,
            "attempts": 0,
            "error": "",
        }
        count += insert_ignore(session, Notification, values, ["entry_id"])
    return count


@store_errors
def pending_incidents(*, session: Session) -> list[int]:
    """Return the ids of incidents with a root message or a reply still to send."""
    unsent = select(Notification.incident_id).where(Notification.sent_at.is_(None))
    unposted = select(NotificationThread.incident_id).where(NotificationThread.ts.is_(None))
    ids = set(session.scalars(unsent)) | set(session.scalars(unposted))
    return sorted(ids)


@store_errors
def open_threads(*, session: Session) -> list[int]:
    """Return the ids of incidents not resolved whose root message is posted: their state of
    now (pods, the load balancer) changes with nothing new to tell in the thread."""
    stmt = (
        select(NotificationThread.incident_id)
        .join(Incident, Incident.id == NotificationThread.incident_id)
        .where(NotificationThread.ts.is_not(None), Incident.resolved_at.is_(None))
        .order_by(NotificationThread.incident_id)
    )
    return list(session.scalars(stmt))


@dataclass(frozen=True, slots=True)
class Batch:
    """One reply: its key (in Slack's message metadata), its entries, and whether it was
    attempted before (Slack may hold it already: a crash or a lost answer)."""

    key: str
    entry_ids: list[int]
    attempted: bool


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a sender holds under the lease: the thread, whether its root message was
    attempted before (when it has no ``ts``), and the replies to send, oldest first."""

    thread: NotificationThread
    root_attempted: bool
    batches: list[Batch]


@store_errors
def take(
    *, session: Session, incident_id: int, lease_s: float, coalesce_s: float
) -> Delivery | None:
    """Lease the incident's thread, group its unsent rows into replies, count the attempts;
    commit. None: another sender holds the lease.

    One sender at a time per incident, across processes: the lease is a compare-and-set of
    ``claimed_at`` (wall clock); one older than ``lease_s`` seconds was left by a sender that
    died. Rows not in a reply yet are grouped in entry order: a row joins the open reply while
    its event time is within ``coalesce_s`` of the reply's first row; a reply keeps its rows
    once grouped (key ``<incident id>-<first row id>``), so a retry posts the same reply. The
    attempts are on record before Slack is called: one in one transaction, the sender's only
    write before it posts, in this process's write turn (``db.write_turn``). Raises StoreError.
    """
    with db.write_turn(session):
        return _take(session, incident_id, lease_s, coalesce_s)


def _take(session: Session, incident_id: int, lease_s: float, coalesce_s: float) -> Delivery | None:
    now = datetime.now(UTC)
    stale = now - timedelta(seconds=lease_s)
    stmt = (
        update(NotificationThread)
        .where(
            NotificationThread.incident_id == incident_id,
            or_(NotificationThread.claimed_at.is_(None), NotificationThread.claimed_at < stale),
        )
        .values(claimed_at=now)
        .execution_options(synchronize_session=False)
    )
    if session.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        return None
    thread = session.get(NotificationThread, incident_id, populate_existing=True)
    assert thread is not None
    root_attempted = thread.ts is None and thread.attempts > 0
    if thread.ts is None:
        thread.attempts += 1
    rows = list(
        session.scalars(
            select(Notification)
            .where(Notification.incident_id == incident_id, Notification.sent_at.is_(None))
            .order_by(Notification.entry_id)
        )
    )
    _group(rows, incident_id, coalesce_s)
    found: list[Batch] = []
    for key in dict.fromkeys(r.batch for r in rows if r.batch is not None):
        members = [r for r in rows if r.batch == key]
        found.append(Batch(key, [r.entry_id for r in members], any(r.attempts for r in members)))
        for r in members:
            r.attempts += 1
    session.commit()
    return Delivery(thread, root_attempted, found)


@store_errors
def renew(*, session: Session, thread: NotificationThread, lease_s: float) -> None:
    """Extend the sender's lease when a quarter of it has passed (a slow Slack keeps it)."""
    now = datetime.now(UTC)
    if thread.claimed_at is None or now - thread.claimed_at > timedelta(seconds=lease_s / 4):
        with db.write_turn(session):
            thread.claimed_at = now
            session.commit()


@store_errors
def release(*, session: Session, thread: NotificationThread, error: str = "") -> None:
    """Give the lease back with the delivery's error ("" when none); commit what was marked."""
    with db.write_turn(session):
        thread.claimed_at = None
        thread.error = error[:500]
        session.commit()


def _group(rows: Sequence[Notification], incident_id: int, coalesce_s: float) -> None:
    first: Notification | None = None
    for row in rows:
        if row.batch is not None:
            continue
        if first is None or abs((row.time - first.time).total_seconds()) > coalesce_s:
            first = row
            first.batch = f"{incident_id}-{row.id}"
        row.batch = first.batch


@store_errors
def mark_sent(*, session: Session, batch: str, ts: str) -> None:
    """Mark a reply's rows sent as Slack message ``ts`` and commit (with what the sender
    changed on the thread): a crash after it never posts the reply again, and no write lock
    is held while the next reply is posted."""
    with db.write_turn(session):
        session.execute(
            update(Notification)
            .where(Notification.batch == batch)
            .values(sent_at=datetime.now(UTC), ts=ts, error="")
            .execution_options(synchronize_session=False)
        )
        session.commit()
