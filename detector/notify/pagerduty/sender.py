"""Deliver the outbox's PagerDuty events, each once, in order per incident.

``PagerSender.drain()`` claims each due event (``queue.take``: the attempt is counted and
committed before the call), reads the incident from the read model, builds the event
(``events.event``) and sends it (``notify.webhook.send``): a sent event is marked; one PagerDuty
refused as invalid (400) is marked with its error and not tried again; one that may pass later
(429, 5xx, no answer) waits ``Retry-After`` when given, else an exponential back-off
(``BACKOFF_S`` doubling per attempt up to ``MAX_BACKOFF_S``). A crash between the send and
its mark sends the event again on the next claim (its lease runs out): PagerDuty folds a
repeated event into the alert of its ``dedup_key``, so it pages once.
``pager`` returns the background worker that runs ``drain``, woken after each commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
from sqlalchemy.orm import Session

from detector.config import PagerDutySettings, Settings
from detector.incidents.models import Incident
from detector.notify import delivery, webhook
from detector.notify.models import OutboxEvent
from detector.notify.pagerduty import events, queue
from detector.report.document import incident_document
from detector.report.read import load_incidents

log = logging.getLogger(__name__)

BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0


class PagerSender:
    """Send what the outbox holds for PagerDuty; ``drain`` returns how many events went."""

    def __init__(
        self,
        settings: Settings,
        make_session: Callable[[], Session],
        http: httpx.Client | None = None,
    ) -> None:
        self._pd: PagerDutySettings = settings.pagerduty
        self._base_url = settings.web.base_url
        self._make_session = make_session
        self._http = http or httpx.Client(timeout=self._pd.timeout_s)

    def close(self) -> None:
        """Close the HTTP client."""
        self._http.close()

    def drain(self) -> int:
        """Send every due event, up to the first held for a later try; return how many were
        sent. Raises StoreError."""
        return delivery.drain(self._make_session, queue.TARGET, self._pd.lease_s, self._send)

    def _send(self, session: Session, event: OutboxEvent) -> int:
        """Send one claimed event: 1 sent, 0 not (closed), -1 held for a later try."""
        body = self._body(session, event)
        if body is None:
            delivery.mark_sent(session=session, event=event)  # its incident is gone
            return 0
        routing_key = self._pd.routing_key.get_secret_value() if self._pd.routing_key else ""
        answer = webhook.send(self._http, self._pd.events_url, body, redact=[routing_key])
        if answer.sent:
            delivery.mark_sent(session=session, event=event)
            log.info("pagerduty event sent action=%s incident_id=%d", event.action,
                     event.incident_id)  # fmt: skip
            return 1
        if not answer.retry:
            delivery.give_up(session=session, event=event, error=f"refused: {answer.error}")
            log.warning("pagerduty refused the event action=%s incident_id=%d error=%s",
                        event.action, event.incident_id, answer.error)  # fmt: skip
            return 0
        delay = answer.retry_after_s
        if delay is None:
            delay = min(BACKOFF_S * 2 ** max(event.attempts - 1, 0), MAX_BACKOFF_S)
        delivery.retry_later(session=session, event=event, delay_s=delay, error=answer.error)
        log.warning("pagerduty event retrying action=%s incident_id=%d error=%s delay_s=%.1f",
                    event.action, event.incident_id, answer.error, delay)  # fmt: skip
        return -1

    def _body(self, session: Session, event: OutboxEvent) -> dict[str, object] | None:
        incident = session.get(Incident, event.incident_id)
        if incident is None:
            return None
        inc = load_incidents(session=session, keys=[incident.key])[0].model_dump(mode="json")
        routing_key = self._pd.routing_key.get_secret_value() if self._pd.routing_key else ""
        return events.event(event.action, inc, incident_document(inc), routing_key=routing_key,
                            base_url=self._base_url, drill=event.drill)  # fmt: skip


def pager(settings: Settings, make_session: Callable[[], Session]) -> delivery.Worker:
    """Return the background worker that sends the PagerDuty events (start it)."""
    sender = PagerSender(settings, make_session)
    return delivery.Worker("pagerduty-sender", sender.drain, sender.close)
