"""Deliver the outbox to Slack: one root message per incident, updated in place; the thread.

``SlackSender.drain()`` delivers every incident with something unsent, each under the
thread's lease (``detector.notify.outbox``): the root message (``chat.postMessage`` with
metadata carrying the incident key), or its update (``chat.update``) when what it shows
changed, then the replies in order (``chat.postMessage`` with ``thread_ts``). It then redraws
the root message of each incident not resolved that it has not drawn for ``REDRAW_S``: the
state of now (pods back, the load balancer's rates) changes with nothing to tell in the
thread, and would otherwise show only with the next reply. A message attempted before (a
crash between the attempt and its mark, a lost answer) is first looked for in Slack by its
metadata (``conversations.history`` for a root, ``conversations.replies`` for a reply) so
that it is never posted twice.
Web API reference: https://api.slack.com/methods (chat.postMessage, chat.update,
conversations.history, conversations.replies; ``include_all_metadata`` returns metadata).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from http.client import HTTPException
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from sqlalchemy.orm import Session

from detector.config import Settings
from detector.errors import NotifyError
from detector.incidents.models import Incident
from detector.notify import outbox
from detector.notify.models import NotificationThread
from detector.notify.slack.blocks import (
    METADATA_EVENT,
    REPLY_EVENT,
    Message,
    Options,
    reply_message,
    root_message,
)
from detector.report.document import incident_document
from detector.report.now import state_now
from detector.report.read import load_incidents
from detector.report.series import load_series

log = logging.getLogger(__name__)

LOOKUP_PAGES = 5  # pages of 200 messages searched for a message attempted before
REDRAW_S = 10.0  # a root message with nothing new to tell is redrawn this often at most


class SlackSender:
    """Send what the outbox holds; ``drain`` returns how many messages it posted or updated."""

    def __init__(
        self, settings: Settings, client: WebClient, make_session: Callable[[], Session]
    ) -> None:
        self._slack = settings.slack
        self._correlate = settings.correlate
        self._base_url = settings.web.base_url
        self._client = client
        self._make_session = make_session
        self._drawn: dict[int, float] = {}  # incident id -> when its root was last drawn

    def drain(self) -> int:
        """Deliver every incident with an unsent message, then redraw the root messages due
        (see the module doc); raises NotifyError, StoreError.

        An incident that fails keeps its messages in the outbox; the others still go.
        """
        with self._make_session() as session:
            pending = outbox.pending_incidents(session=session)
            live = outbox.open_threads(session=session)
        now = time.monotonic()
        due = [
            i
            for i in live
            if i not in pending and now - self._drawn.get(i, now - REDRAW_S) >= REDRAW_S
        ]
        posted, failed = 0, None
        for incident_id in [*pending, *due]:
            try:
                posted += self.deliver(incident_id)
            except NotifyError as exc:
                log.warning("slack delivery failed incident_id=%d error=%s", incident_id, exc)
                failed = exc
        if failed is not None:
            raise failed
        return posted

    def deliver(self, incident_id: int) -> int:
        """Deliver one incident's unsent messages under its lease; return how many messages
        were posted or updated. Raises NotifyError (the lease is given back with the error
        and what was sent is marked), StoreError.
        """
        with self._make_session() as session:
            delivery = outbox.take(session=session, incident_id=incident_id,
                                   lease_s=self._slack.lease_s,
                                   coalesce_s=self._slack.coalesce_s)  # fmt: skip
            if delivery is None:
                return 0  # another sender holds it
            self._drawn[incident_id] = time.monotonic()
            try:
                posted = self._deliver(session, delivery)
            except NotifyError as exc:
                outbox.release(session=session, thread=delivery.thread, error=str(exc))
                raise
            outbox.release(session=session, thread=delivery.thread)
            return posted

    def _deliver(self, session: Session, delivery: outbox.Delivery) -> int:
        # The replies were grouped before this read: it holds every entry they tell (rows are
        # committed with their entries) and the incident's latest state.
        thread = delivery.thread
        inc, root = self._read(session, thread.incident_id, thread.drill)
        posted, digest = 0, _digest(root)
        if thread.ts is None:
            posted += self._post_root(thread, inc["key"], root, delivery.root_attempted)
        elif digest != thread.digest:  # the state first: a stage change shows at once
            self._call("chat.update", self._client.chat_update, channel=thread.channel,
                       ts=thread.ts, text=root.text, blocks=root.blocks)  # fmt: skip
            thread.digest = digest
            posted += 1
        entries = {e["id"]: e for e in inc["timeline"]}
        for batch in delivery.batches:
            told = [entries[i] for i in batch.entry_ids if i in entries]
            if len(told) != len(batch.entry_ids):  # never expected: keep it for the next try
                log.warning("reply entries not found batch=%s", batch.key)
                continue
            ts = self._find_reply(thread, batch.key) if batch.attempted else None
            if ts is None:
                outbox.renew(session=session, thread=thread, lease_s=self._slack.lease_s)
                reply = reply_message(inc, told, batch.key, self._slack.mention, thread.drill)
                ts = self._post(thread.channel, reply, thread_ts=thread.ts)
                posted += 1
            outbox.mark_sent(session=session, batch=batch.key, ts=ts)
        return posted

    def _read(
        self, session: Session, incident_id: int, drill: bool
    ) -> tuple[dict[str, Any], Message]:
        """Return the incident's read-model dump, read now, and its root message."""
        session.expire_all()
        incident = session.get(Incident, incident_id)
        assert incident is not None
        inc = load_incidents(session=session, keys=[incident.key])[0].model_dump(mode="json")
        series = [
            s.model_dump(mode="json") for s in load_series(session=session, incident_id=incident_id)
        ]
        options = Options(
            self._base_url,
            self._correlate.memory_ceiling,
            self._correlate.kv_cache_ceiling,
            datetime.now(UTC),
            drill,
        )
        now = state_now(inc, series)
        return inc, root_message(inc, incident_document(inc), options, now)

    def _post_root(
        self, thread: NotificationThread, key: str, root: Message, attempted: bool
    ) -> int:
        """Post the root message (found in Slack instead when attempted before); keep its id."""
        found = self._find_root(thread.channel, key) if attempted else None
        posted = 0
        if found is None:
            answer = self._call(
                "chat.postMessage",
                self._client.chat_postMessage,
                channel=thread.channel,
                text=root.text,
                blocks=root.blocks,
                metadata=root.metadata,
                unfurl_links=False,
                unfurl_media=False,
            )
            found, posted = (str(answer["channel"]), str(answer["ts"])), 1
        thread.channel, thread.ts = found
        thread.digest = _digest(root)
        return posted

    def _post(self, channel: str, message: Message, *, thread_ts: str | None) -> str:
        answer = self._call(
            "chat.postMessage",
            self._client.chat_postMessage,
            channel=channel,
            text=message.text,
            blocks=message.blocks,
            metadata=message.metadata,
            thread_ts=thread_ts,
            reply_broadcast=message.broadcast,
            unfurl_links=False,
            unfurl_media=False,
        )
        return str(answer["ts"])

    def _find_root(self, channel: str, key: str) -> tuple[str, str] | None:
        """Return (channel id, ts) of the incident's root message in Slack, None when absent."""
        for message in self._pages("conversations.history", self._client.conversations_history,
                                   channel=channel):  # fmt: skip
            if _tagged(message, METADATA_EVENT, incident=key):
                log.info("found root message already posted incident=%s ts=%s", key,
                         message["ts"])  # fmt: skip
                return channel, str(message["ts"])
        return None

    def _find_reply(self, thread: NotificationThread, batch: str) -> str | None:
        for message in self._pages("conversations.replies", self._client.conversations_replies,
                                   channel=thread.channel, ts=thread.ts):  # fmt: skip
            if _tagged(message, REPLY_EVENT, reply=batch):
                return str(message["ts"])
        return None

    def _pages(self, method: str, call: Callable[..., Any], **kwargs: Any) -> Iterator[Any]:
        cursor = None
        for _ in range(LOOKUP_PAGES):
            answer = self._call(method, call, include_all_metadata=True, limit=200,
                                cursor=cursor, **kwargs)  # fmt: skip
            yield from answer.get("messages") or []
            cursor = (answer.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return

    def _call(self, method: str, call: Callable[..., Any], **kwargs: Any) -> Any:
        """Call a Web API method; raises NotifyError with Slack's error code."""
        try:
            return call(**kwargs)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else None
            raise NotifyError(str(error or "slack_error"), f"{method}: {exc}") from exc
        except (SlackClientError, OSError, HTTPException) as exc:
            raise NotifyError("unreachable", f"{method}: {exc}") from exc


def _tagged(message: Mapping[str, Any], event_type: str, **payload: str) -> bool:
    metadata = message.get("metadata") or {}
    found = metadata.get("event_payload") or {}
    return metadata.get("event_type") == event_type and all(
        found.get(k) == v for k, v in payload.items()
    )


def _digest(message: Message) -> str:
    body = json.dumps([message.text, message.blocks], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()
