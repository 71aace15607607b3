"""The background senders of the outbox's events beside Slack, for one process.

``workers(settings, make_session)`` returns one ``delivery.Worker`` per configured service:
PagerDuty (``DETECTOR_PAGERDUTY__ROUTING_KEY``) and Grafana annotations
(``DETECTOR_GRAFANA__URL`` and ``__TOKEN``); ``detector run`` and ``detector serve`` start
them beside Slack's ``Notifier`` and wake them after each commit; ``deliver`` sends once
(``detector replay --page/--annotate``).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from detector import db
from detector.config import Settings
from detector.notify import delivery
from detector.notify.delivery import Worker
from detector.notify.grafana.annotations import TARGET as GRAFANA
from detector.notify.grafana.sender import GrafanaSender, annotator
from detector.notify.pagerduty.queue import TARGET as PAGERDUTY
from detector.notify.pagerduty.sender import PagerSender, pager


def workers(settings: Settings, make_session: Callable[[], Session]) -> list[Worker]:
    """Return the workers of the configured services (not started)."""
    found = []
    if settings.pagerduty.enabled:
        found.append(pager(settings, make_session))
    if settings.grafana.enabled:
        found.append(annotator(settings, make_session))
    return found


def deliver(settings: Settings, *, page: bool, annotate: bool) -> dict[str, tuple[int, int]]:
    """Send what is due once (``detector replay --page/--annotate``); return, per service
    (``pagerduty``, ``grafana``), (sent, still pending). Raises StoreError."""
    engine = db.make_engine(settings.database.url)
    make_session = db.session_factory(engine)
    found: dict[str, tuple[int, int]] = {}
    try:
        chosen: list[tuple[str, PagerSender | GrafanaSender]] = []
        if page:
            chosen.append((PAGERDUTY, PagerSender(settings, make_session)))
        if annotate:
            chosen.append((GRAFANA, GrafanaSender(settings, make_session)))
        for target, sender in chosen:
            try:
                sent = sender.drain()
            finally:
                sender.close()
            with make_session() as session:
                found[target] = (sent, delivery.pending(session=session, target=target))
        return found
    finally:
        engine.dispose()
