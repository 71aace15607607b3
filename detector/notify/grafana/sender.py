"""Queue and post the incident's Grafana annotations through the outbox.

``enqueue`` runs in the transaction that wrote the timeline entries (``notify.flows.queue``):
one event per annotated entry (``annotations.tag_of``; unique ``grafana:<entry id>``).
``GrafanaSender.drain()`` claims each due one (``notify.delivery``), reads the entry and its
incident from the read model, and posts the annotation with the service account token as a
bearer token (``notify.webhook.send``): sent events are marked; one Grafana refused (400,
401, 403 ...) is closed with its error; 429/5xx or no answer wait ``Retry-After`` or a back-off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from detector.config import GrafanaSettings, Settings
from detector.db import store_errors
from detector.incidents.models import Incident, TimelineEntry
from detector.notify import delivery, webhook
from detector.notify.grafana.annotations import TARGET, body, tag_of
from detector.notify.models import OutboxEvent
from detector.report.read import load_incidents

log = logging.getLogger(__name__)

BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0


@store_errors
def enqueue(*, session: Session, incident: Incident, drill: bool = False) -> int:
    """Queue the annotations of the incident's entries not queued yet; return how many.
    Raises StoreError."""
    done = delivery.queued_keys(session=session, target=TARGET, incident_id=incident.id)
    stmt = (
        select(TimelineEntry.id, TimelineEntry.time, TimelineEntry.dedupe_key)
        .where(TimelineEntry.incident_id == incident.id, TimelineEntry.kind.in_(("stage", "step")))
        .order_by(TimelineEntry.id)
    )
    count = 0
    for entry_id, time, key in session.execute(stmt):
        what = tag_of(key)
        dedupe = f"{TARGET}:{entry_id}"
        if what is not None and dedupe not in done:
            count += delivery.add(session=session, incident_id=incident.id, target=TARGET,
                                  action=what, dedupe_key=dedupe, time=time,
                                  drill=drill)  # fmt: skip
    return count


class GrafanaSender:
    """Post what the outbox holds for Grafana; ``drain`` returns how many annotations went."""

    def __init__(
        self,
        settings: Settings,
        make_session: Callable[[], Session],
        http: httpx.Client | None = None,
    ) -> None:
        self._grafana: GrafanaSettings = settings.grafana
        self._make_session = make_session
        self._http = http or httpx.Client(timeout=self._grafana.timeout_s)
        self._token = self._grafana.token.get_secret_value() if self._grafana.token else ""
        self._headers = {"Authorization": f"Bearer {self._token}"}
        self._url = self._grafana.url.rstrip("/") + "/api/annotations"

    def close(self) -> None:
        """Close the HTTP client."""
        self._http.close()

    def drain(self) -> int:
        """Post every due annotation, up to the first held for a later try; return how many
        were posted. Raises StoreError."""
        return delivery.drain(self._make_session, TARGET, self._grafana.lease_s, self._send)

    def _send(self, session: Session, event: OutboxEvent) -> int:
        """Send one claimed event: 1 sent, 0 not (closed), -1 held for a later try."""
        annotation = self._annotation(session, event)
        if annotation is None:
            delivery.give_up(session=session, event=event, error="the entry is gone")
            return 0
        answer = webhook.send(self._http, self._url, annotation, self._headers,
                              redact=[self._token])  # fmt: skip
        if answer.sent:
            delivery.mark_sent(session=session, event=event)
            return 1
        if not answer.retry:
            delivery.give_up(session=session, event=event, error=f"refused: {answer.error}")
            log.warning("grafana refused the annotation incident_id=%d error=%s",
                        event.incident_id, answer.error)  # fmt: skip
            return 0
        delay = answer.retry_after_s
        if delay is None:
            delay = min(BACKOFF_S * 2 ** max(event.attempts - 1, 0), MAX_BACKOFF_S)
        delivery.retry_later(session=session, event=event, delay_s=delay, error=answer.error)
        log.warning("grafana annotation retrying incident_id=%d error=%s delay_s=%.1f",
                    event.incident_id, answer.error, delay)  # fmt: skip
        return -1

    def _annotation(self, session: Session, event: OutboxEvent) -> dict[str, Any] | None:
        incident = session.get(Incident, event.incident_id)
        entry_id = int(event.dedupe_key.split(":")[1])
        if incident is None:
            return None
        inc = load_incidents(session=session, keys=[incident.key])[0].model_dump(mode="json")
        entry = next((e for e in inc["timeline"] if e["id"] == entry_id), None)
        if entry is None:
            return None
        return body(entry, inc, event.action, tags=self._grafana.tags,
                    dashboard_uid=self._grafana.dashboard_uid, drill=event.drill)  # fmt: skip


def annotator(settings: Settings, make_session: Callable[[], Session]) -> delivery.Worker:
    """Return the background worker that posts the annotations (start it)."""
    sender = GrafanaSender(settings, make_session)
    return delivery.Worker("grafana-sender", sender.drain, sender.close)
