"""The outbox's events for services beside Slack (PagerDuty, Grafana): add, claim, mark.

An ``OutboxEvent`` is added (``add``) in the transaction of the timeline entry that causes it,
once per (target, dedupe key). A sender claims the oldest due event of a target (``take``)
whose incident has no earlier event of that target unsent (an incident's events go in order:
PagerDuty's resolve never overtakes its trigger), on a lease (a compare-and-set of
``claimed_at``; one older than ``lease_s`` was left by a sender that died), counting the
attempt in the store before the call; then marks it sent (``mark_sent``), holds it for a
later try (``retry_later``: Retry-After or back-off) or closes it unsent with the reason
(``give_up``: the service refused it as invalid). ``Worker`` runs a sender's ``drain`` in a
background thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import exists, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from detector.db import insert_ignore, store_errors
from detector.errors import StoreError
from detector.notify.models import OutboxEvent

log = logging.getLogger(__name__)

POLL_S = 2.0  # a worker drains at least this often (rows another process wrote)


@store_errors
def add(
    *,
    session: Session,
    incident_id: int,
    target: str,
    action: str,
    dedupe_key: str,
    time: datetime,
    drill: bool = False,
) -> bool:
    """Add one event unless (target, dedupe_key) exists; return True when added."""
    values = {
        "incident_id": incident_id,
        "target": target,
        "action": action,
        "dedupe_key": dedupe_key,
        "time": time,
        "due_at": datetime.now(UTC),
        "attempts": 0,
        "drill": drill,
        "error": "",
    }
    return insert_ignore(session, OutboxEvent, values, ["target", "dedupe_key"])


@store_errors
def queued_keys(*, session: Session, target: str, incident_id: int) -> set[str]:
    """Return the dedupe keys of the incident's events of ``target``."""
    stmt = select(OutboxEvent.dedupe_key).where(
        OutboxEvent.target == target, OutboxEvent.incident_id == incident_id
    )
    return set(session.scalars(stmt))


@store_errors
def pending(*, session: Session, target: str) -> int:
    """Return how many events of ``target`` are still to send."""
    stmt = select(func.count()).where(OutboxEvent.target == target, OutboxEvent.sent_at.is_(None))
    return int(session.scalar(stmt) or 0)


@store_errors
def take(*, session: Session, target: str, lease_s: float) -> OutboxEvent | None:
    """Claim the next due event of ``target`` (see the module doc), count its attempt,
    commit; None when nothing is due. Raises StoreError."""
    now = datetime.now(UTC)
    stale = now - timedelta(seconds=lease_s)
    free = or_(OutboxEvent.claimed_at.is_(None), OutboxEvent.claimed_at < stale)
    earlier = aliased(OutboxEvent)
    blocked = exists().where(
        earlier.target == target,
        earlier.incident_id == OutboxEvent.incident_id,
        earlier.sent_at.is_(None),
        earlier.id < OutboxEvent.id,
    )
    candidates = session.scalars(
        select(OutboxEvent.id)
        .where(
            OutboxEvent.target == target,
            OutboxEvent.sent_at.is_(None),
            OutboxEvent.due_at <= now,
            free,
            ~blocked,
        )
        .order_by(OutboxEvent.id)
        .limit(10)
    ).all()
    for event_id in candidates:
        claim = (
            update(OutboxEvent)
            .where(OutboxEvent.id == event_id, OutboxEvent.sent_at.is_(None), free)
            .values(claimed_at=now, attempts=OutboxEvent.attempts + 1)
            .execution_options(synchronize_session=False)
        )
        if session.execute(claim).rowcount == 1:  # type: ignore[attr-defined]
            session.commit()
            return session.get(OutboxEvent, event_id, populate_existing=True)
    session.rollback()
    return None


@store_errors
def mark_sent(*, session: Session, event: OutboxEvent) -> None:
    """Mark ``event`` sent and give its lease back; commit."""
    event.sent_at = datetime.now(UTC)
    event.claimed_at = None
    event.error = ""
    session.commit()


@store_errors
def retry_later(*, session: Session, event: OutboxEvent, delay_s: float, error: str) -> None:
    """Keep ``event`` for a try ``delay_s`` seconds from now, with the error; commit."""
    event.due_at = datetime.now(UTC) + timedelta(seconds=delay_s)
    event.claimed_at = None
    event.error = error[:500]
    session.commit()


@store_errors
def give_up(*, session: Session, event: OutboxEvent, error: str) -> None:
    """Close ``event`` unsent with the error (the service refused it as invalid); commit."""
    event.sent_at = datetime.now(UTC)
    event.claimed_at = None
    event.error = error[:500]
    session.commit()


def drain(
    make_session: Callable[[], Session],
    target: str,
    lease_s: float,
    send: Callable[[Session, OutboxEvent], int],
) -> int:
    """Send every due event of ``target``, each claimed in a session of its own, up to the
    first held for a later try; return how many were sent. ``send`` answers 1 (sent), 0 (not
    sent, closed) or -1 (held for a later try: the next drain, woken or polled, takes it up).
    Raises StoreError."""
    sent = 0
    while True:
        with make_session() as session:
            event = take(session=session, target=target, lease_s=lease_s)
            if event is None:
                return sent
            done = send(session, event)
            if done < 0:
                return sent
            sent += done


class Worker:
    """Run ``drain`` in a background thread whenever ``wake()`` is called, at least every
    ``POLL_S``; ``close`` is called once it stops."""

    def __init__(
        self, name: str, drain: Callable[[], int], close: Callable[[], None] = lambda: None
    ) -> None:
        self.name = name
        self._drain = drain
        self._close = close
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Ask the thread to drain now."""
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Let the thread finish what it holds, then stop it."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_S)
            self._wake.clear()
            try:
                self._drain()
            except StoreError as exc:
                log.warning("%s: store failed error=%s", self.name, exc)
            except Exception:  # the background loop's boundary: log, keep sending
                log.exception("%s failed unexpectedly", self.name)
