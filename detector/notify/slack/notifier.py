"""The Slack face of one process: a background sender, and Socket Mode when it is configured.

``Notifier.start()`` starts a thread that drains the outbox whenever ``wake()`` is called
(after each committed batch or decision) and at least every ``POLL_S`` (rows another process
wrote), at most once per ``SEND_INTERVAL_S`` after a drain that sent (Slack's guidance is about
one message a second per channel: https://api.slack.com/apis/rate-limits). A failed delivery
waits with exponential backoff (``BACKOFF_S``..``MAX_BACKOFF_S``) while the detector goes on
detecting; the outbox catches up once Slack answers. With an app token (``xapp-``) it also
connects over Socket Mode (https://api.slack.com/apis/socket-mode): each interactive
envelope is acknowledged first, then handled (``detector.notify.slack.interactions``), so no
public ingress is needed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from slack_sdk import WebClient
from slack_sdk.socket_mode import SocketModeClient
from slack_sdk.socket_mode.client import BaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from sqlalchemy.orm import Session

from detector import db
from detector.config import Settings
from detector.errors import NotifyError, StoreError
from detector.notify import outbox
from detector.notify.slack.client import web_client
from detector.notify.slack.interactions import Interactions
from detector.notify.slack.sender import SlackSender

log = logging.getLogger(__name__)

SOCKET_WATCH_S = 1.0  # how often the Socket Mode state is read, seconds
POLL_S = 2.0
SEND_INTERVAL_S = 0.25  # between drains that sent: Slack takes about 1 message/s per channel
BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


class Notifier:
    """Run the sender in the background and, with an app token, Socket Mode."""

    def __init__(
        self,
        settings: Settings,
        make_session: Callable[[], Session],
        client: WebClient | None = None,
    ) -> None:
        self._settings = settings
        self.client = client or web_client(settings.slack)
        self.sender = SlackSender(settings, self.client, make_session)
        self.interactions = Interactions(settings, self.client, make_session, self.wake)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._socket: SocketModeClient | None = None

    def start(self) -> None:
        """Start the sender thread, and Socket Mode when an app token is set."""
        self._thread = threading.Thread(target=self._run, name="slack-sender", daemon=True)
        self._thread.start()
        app_token = self._settings.slack.app_token
        if app_token is not None:
            self._socket = SocketModeClient(
                app_token=app_token.get_secret_value(), web_client=self.client
            )
            self._socket.socket_mode_request_listeners.append(self._on_socket_request)
            threading.Thread(target=self._connect, name="slack-socket", daemon=True).start()

    def wake(self) -> None:
        """Ask the sender to drain the outbox now."""
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Disconnect Socket Mode; let the sender finish what it holds, then stop it."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _connect(self) -> None:
        """Connect Socket Mode and log each change of its state as it is, until stopped.

        slack_sdk's ``connect()`` returns without raising when the WebSocket handshake fails
        (it logs and drops the session; its own monitor then reconnects), so the state is read
        from ``is_connected()``, never assumed. While ``connect()`` itself raises (Slack
        unreachable, a token refused) it is retried with backoff; the process (the approvals
        API, the sender) serves meanwhile."""
        backoff, started, logged = BACKOFF_S, False, None
        while not self._stop.is_set() and (socket := self._socket) is not None:
            try:
                if not started:
                    socket.connect()
                    started = True
                now = socket.is_connected()
            except Exception as exc:  # the connector's boundary: log, retry
                log.warning("slack socket mode connect failed error=%s backoff_s=%.0f",
                            exc, backoff)  # fmt: skip
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if now != logged:
                if now:
                    log.info("slack socket mode connected")
                else:
                    log.warning("slack socket mode not connected: the WebSocket failed; retrying")
                logged = now
            self._stop.wait(SOCKET_WATCH_S)

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            self._wake.wait(backoff or POLL_S)
            self._wake.clear()
            try:
                sent = self.sender.drain()
                backoff = 0.0
                if sent:  # what arrives meanwhile goes into fewer, fuller replies
                    self._stop.wait(SEND_INTERVAL_S)
            except (NotifyError, StoreError) as exc:
                backoff = min(max(backoff * 2, BACKOFF_S), MAX_BACKOFF_S)
                log.warning("slack sender retrying error=%s backoff_s=%.0f", exc, backoff)
            except Exception:  # the background loop's boundary: log, keep sending
                backoff = min(max(backoff * 2, BACKOFF_S), MAX_BACKOFF_S)
                log.exception("slack sender failed unexpectedly backoff_s=%.0f", backoff)

    def _on_socket_request(self, client: BaseSocketModeClient, request: SocketModeRequest) -> None:
        if request.type != "interactive":
            return
        client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))
        self.interactions.handle(request.payload)


@dataclass(frozen=True, slots=True)
class Sent:
    """What one delivery did: messages posted or updated, and incidents it could not take
    because another sender holds their lease (they are still to send)."""

    messages: int
    held: int


def deliver(settings: Settings, client: WebClient | None = None) -> Sent:
    """Send what the outbox holds once (``detector replay --notify``).

    Raises NotifyError (what failed stays in the outbox for the next try), StoreError.
    """
    engine = db.make_engine(settings.database.url)
    try:
        make_session = db.session_factory(engine)
        sender = SlackSender(settings, client or web_client(settings.slack), make_session)
        messages = sender.drain()
        with make_session() as session:
            held = len(outbox.pending_incidents(session=session))
        return Sent(messages, held)
    finally:
        engine.dispose()
