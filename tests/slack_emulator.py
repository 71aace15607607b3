"""A local Slack for tests: the Web API over HTTP and Socket Mode over WebSocket.

The official ``slack_sdk`` clients talk to it as they would to slack.com::

    WebClient(base_url=emu.api_url, token=emu.bot_token)
    SocketModeClient(app_token=emu.app_token, web_client=WebClient(base_url=emu.api_url))

Shapes follow Slack's references: https://docs.slack.dev/reference/methods (Web API),
https://docs.slack.dev/apis/events-api/using-socket-mode/ (Socket Mode envelopes),
https://docs.slack.dev/reference/interaction-payloads/block_actions-payload (block_actions) and
https://docs.slack.dev/authentication/verifying-requests-from-slack/ (request signatures).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlencode, urlsplit

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

log = logging.getLogger(__name__)

TEAM_ID = "T0001"
TEAM_DOMAIN = "emulated"
APP_ID = "A0EMULATOR"
BOT_ID = "B0EMULATOR"
BOT_USER_ID = "U0EMULATOR"
# Form-encoded bodies carry these as JSON strings; Slack decodes them.
_JSON_FIELDS = ("blocks", "attachments", "metadata")
_APP_TOKEN_METHODS = frozenset({"apps.connections.open"})
_FAULT_ERRORS = {429: "ratelimited", 500: "internal_error", 503: "service_unavailable"}


class Call(NamedTuple):
    """One Web API call the emulator answered: the method and its decoded parameters."""

    method: str
    params: dict[str, Any]


class FailedCall(NamedTuple):
    """One call answered by an injected fault; ``status`` 0 means the connection was dropped."""

    method: str
    params: dict[str, Any]
    status: int


class _Fault:
    def __init__(self, status: int, times: int, retry_after_s: int, error: str | None) -> None:
        self.status, self.remaining, self.retry_after_s = status, times, retry_after_s
        self.error = error or _FAULT_ERRORS.get(status, f"http_{status}")


class _ApiError(Exception):
    """A Slack error answer (HTTP 200, ``{"ok": false, "error": ...}``)."""


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true")


def _ts_key(ts: str) -> tuple[int, int]:
    seconds, _, micros = ts.partition(".")
    return int(seconds or 0), int(micros.ljust(6, "0")[:6])


class SlackEmulator:
    """Emulate the Slack Web API methods the product calls, and Socket Mode.

    Start with ``start()`` or as a context manager; every attribute is safe to read from tests
    while the server threads answer the clients.
    """

    def __init__(
        self, *, known_channels: set[str] | None = None, ping_interval_s: float = 0.25
    ) -> None:
        """Configure the emulator; ``known_channels`` None accepts every channel.

        ``ping_interval_s``: how often the WebSocket server pings clients, as Slack does. Short,
        because the builtin SocketModeClient holds a lock through a blocking 3 s ``recv``, which
        its ``close()`` and reconnections wait for unless a frame (a ping) arrives.
        """
        self.ping_interval_s = ping_interval_s
        self.bot_token = f"xoxb-test-{uuid.uuid4().hex[:12]}"
        self.app_token = f"xapp-test-{uuid.uuid4().hex[:12]}"
        self.known_channels = known_channels  # None: every channel id or name exists
        self.users: dict[str, str] = {}  # user id -> email
        self._lock = threading.RLock()
        self._calls: list[Call] = []
        self._failed_calls: list[FailedCall] = []
        self._faults: dict[str, list[_Fault]] = {}
        self._messages: dict[str, list[dict[str, Any]]] = {}  # channel -> messages, post order
        self._ephemerals: list[dict[str, Any]] = []
        self._edits: list[dict[str, Any]] = []
        self._last_ts_us = 0
        self._unpaused = threading.Event()
        self._unpaused.set()
        self._stopping = False
        self._held = 0
        self._tickets: set[str] = set()
        self._sockets: list[ServerConnection] = []
        self._socket_connects = 0
        self._frames: list[dict[str, Any]] = []
        self._http: _HttpServer | None = None
        self._ws: Server | None = None
        self._threads: list[threading.Thread] = []
        self._methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "conversations.history": self._conversations_history,
            "conversations.replies": self._conversations_replies,
            "users.info": self._users_info,
            "apps.connections.open": self._apps_connections_open,
        }

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> SlackEmulator:
        """Bind the HTTP and WebSocket servers on free 127.0.0.1 ports and serve in threads."""
        self._http = _HttpServer(("127.0.0.1", 0), _Handler)
        self._http.emulator = self
        self._ws = serve(
            self._socket_session,
            "127.0.0.1",
            0,
            compression=None,
            ping_interval=self.ping_interval_s,
        )
        http_serve = partial(self._http.serve_forever, poll_interval=0.05)
        for name, target in (("http", http_serve), ("ws", self._ws.serve_forever)):
            thread = threading.Thread(target=target, name=f"slack-emulator-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Release held requests, close every connection, and join the server threads."""
        self._stopping = True
        self._unpaused.set()
        if self._ws is not None:
            self._ws.shutdown()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()  # joins the request threads
        self._ws = self._http = None
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads.clear()

    def __enter__(self) -> SlackEmulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def api_url(self) -> str:
        """Return the Web API base URL that ``WebClient(base_url=...)`` takes."""
        assert self._http is not None, "start() the emulator first"
        return f"http://127.0.0.1:{self._http.server_address[1]}/api/"

    @property
    def ws_port(self) -> int:
        """Return the port of the Socket Mode WebSocket server."""
        assert self._ws is not None, "start() the emulator first"
        return int(self._ws.socket.getsockname()[1])

    # ---- test controls -----------------------------------------------------------------------

    def add_user(self, user_id: str, email: str) -> None:
        """Make ``users.info`` know ``user_id`` with ``email``."""
        with self._lock:
            self.users[user_id] = email

    def fail(
        self,
        method: str,
        status: int = 429,
        times: int = 1,
        retry_after: int = 1,
        error: str | None = None,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` with HTTP ``status``.

        429 carries ``Retry-After: retry_after`` (seconds) and ``{"ok": false, "error":
        "ratelimited"}`` as Slack's rate limiter does; 5xx carry a JSON error body; status 200
        answers ``{"ok": false, "error": error}``. Failed calls go to ``failed_calls`` only.
        """
        with self._lock:
            self._faults.setdefault(method, []).append(_Fault(status, times, retry_after, error))

    def pause(self) -> None:
        """Hold every request until ``resume()`` or ``stop()`` (Slack slow or down)."""
        self._unpaused.clear()

    def resume(self) -> None:
        """Answer the held requests and stop holding new ones."""
        self._unpaused.set()

    @property
    def held_requests(self) -> int:
        """Return how many requests ``pause()`` is holding now."""
        with self._lock:
            return self._held

    # ---- recordings --------------------------------------------------------------------------

    @property
    def calls(self) -> list[Call]:
        """Return a copy of the answered calls, ``(method, params)``, in arrival order."""
        with self._lock:
            return list(self._calls)

    @property
    def failed_calls(self) -> list[FailedCall]:
        """Return a copy of the calls answered by a fault, ``(method, params, status)``."""
        with self._lock:
            return list(self._failed_calls)

    @property
    def ephemerals(self) -> list[dict[str, Any]]:
        """Return the ``chat.postEphemeral`` messages: channel, user, text, blocks, message_ts."""
        with self._lock:
            return copy.deepcopy(self._ephemerals)

    @property
    def edits(self) -> list[dict[str, Any]]:
        """Return the ``chat.update`` edits: channel, ts, before and after (message dicts)."""
        with self._lock:
            return copy.deepcopy(self._edits)

    def calls_to(self, method: str) -> list[dict[str, Any]]:
        """Return the params of the answered calls of ``method``, in order."""
        return [call.params for call in self.calls if call.method == method]

    def messages(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Return stored messages (top-level and replies) oldest first, each with its channel."""
        with self._lock:
            channels = [channel] if channel is not None else list(self._messages)
            found = [
                {**copy.deepcopy(msg), "channel": name}
                for name in channels
                for msg in self._messages.get(name, [])
            ]
        return sorted(found, key=lambda msg: _ts_key(msg["ts"]))

    def root_messages(self, channel: str) -> list[dict[str, Any]]:
        """Return the channel's top-level messages, oldest first."""
        return [msg for msg in self.messages(channel) if self._is_top_level(msg)]

    def replies(self, channel: str, ts: str) -> list[dict[str, Any]]:
        """Return the replies in the thread of ``ts`` (parent excluded), oldest first."""
        return [
            msg for msg in self.messages(channel) if msg.get("thread_ts") == ts and msg["ts"] != ts
        ]

    def wait_for(
        self, predicate: Callable[[SlackEmulator], Any], timeout: float = 5.0, what: str = ""
    ) -> Any:
        """Poll until ``predicate(self)`` is truthy and return its value.

        Raises AssertionError after ``timeout`` seconds, naming ``what`` and the last calls.
        """
        deadline = time.monotonic() + timeout
        while True:
            value = predicate(self)
            if value:
                return value
            if time.monotonic() >= deadline:
                recent = [(call.method, call.params) for call in self.calls[-5:]]
                raise AssertionError(
                    f"Slack emulator: {what or getattr(predicate, '__name__', 'predicate')} not "
                    f"true after {timeout}s; last calls: {recent}; failed: {self.failed_calls}"
                )
            time.sleep(0.01)

    # ---- Socket Mode -------------------------------------------------------------------------

    @property
    def socket_connects(self) -> int:
        """Return how many Socket Mode connections got their ``hello``."""
        with self._lock:
            return self._socket_connects

    @property
    def socket_frames(self) -> list[dict[str, Any]]:
        """Return every JSON frame the Socket Mode clients sent (acks), in order."""
        with self._lock:
            return copy.deepcopy(self._frames)

    def wait_socket_connected(self, timeout: float = 5.0) -> None:
        """Wait until a Socket Mode client is connected and has been sent ``hello``."""
        self.wait_for(lambda emu: emu._open_sockets(), timeout, "a Socket Mode connection")

    def send_envelope(
        self, envelope_type: str, payload: dict[str, Any], *, accepts_response_payload: bool = False
    ) -> str:
        """Send a Socket Mode envelope (interactive, events_api, slash_commands); return its id."""
        sockets = self._open_sockets()
        if not sockets:
            raise AssertionError("Slack emulator: no Socket Mode client is connected")
        envelope_id = str(uuid.uuid4())
        envelope = {
            "envelope_id": envelope_id,
            "payload": payload,
            "type": envelope_type,
            "accepts_response_payload": accepts_response_payload,
            "retry_attempt": 0,
            "retry_reason": "",
        }
        sockets[-1].send(json.dumps(envelope))
        return envelope_id

    def send_interactive(self, payload: dict[str, Any]) -> str:
        """Deliver an interaction payload (e.g. ``block_actions``) over Socket Mode."""
        return self.send_envelope("interactive", payload)

    def send_disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask the connected clients to reconnect, as Slack does before rotating a connection."""
        frame = {"type": "disconnect", "reason": reason, "debug_info": {"host": "emulator"}}
        for connection in self._open_sockets():
            connection.send(json.dumps(frame))

    def wait_ack(self, envelope_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """Wait for the client's acknowledgement frame of ``envelope_id`` and return it."""

        def ack(emu: SlackEmulator) -> dict[str, Any] | None:
            for frame in emu.socket_frames:
                if frame.get("envelope_id") == envelope_id:
                    return frame
            return None

        return self.wait_for(ack, timeout, f"the ack of envelope {envelope_id}")

    def _open_sockets(self) -> list[ServerConnection]:
        with self._lock:
            return list(self._sockets)

    def _socket_session(self, connection: ServerConnection) -> None:
        """Serve one Socket Mode connection: check the ticket, say hello, record frames."""
        assert connection.request is not None
        ticket = parse_qs(urlsplit(connection.request.path).query).get("ticket", [""])[0]
        with self._lock:
            valid = ticket in self._tickets
            self._tickets.discard(ticket)
        if not valid:
            connection.close(code=1008, reason="invalid ticket")
            return
        hello = {
            "type": "hello",
            "num_connections": 1,
            "debug_info": {
                "host": "emulator",
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": APP_ID},
        }
        connection.send(json.dumps(hello))
        with self._lock:
            self._sockets.append(connection)
            self._socket_connects += 1
        try:
            for raw in connection:
                frame = json.loads(raw) if isinstance(raw, str) and raw.startswith("{") else {}
                with self._lock:
                    self._frames.append(frame)
        except ConnectionClosed:
            pass  # the builtin client closes its socket without a close frame
        finally:
            with self._lock:
                self._sockets.remove(connection)

    # ---- HTTP dispatch -----------------------------------------------------------------------

    def _hold(self) -> bool:
        """Block while paused; return False when the emulator stops meanwhile."""
        if not self._unpaused.is_set():
            with self._lock:
                self._held += 1
            self._unpaused.wait()
            with self._lock:
                self._held -= 1
        return not self._stopping

    def _answer(
        self, method: str, token: str | None, params: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Answer one Web API call: (HTTP status, JSON body, extra headers)."""
        if method not in self._methods:
            with self._lock:
                self._calls.append(Call(method, params))
            return 200, {"ok": False, "error": "unknown_method"}, {}
        with self._lock:
            faults = self._faults.get(method, [])
            if faults:
                fault = faults[0]
                fault.remaining -= 1
                if fault.remaining <= 0:
                    faults.pop(0)
                self._failed_calls.append(FailedCall(method, params, fault.status))
                headers = {"Retry-After": str(fault.retry_after_s)} if fault.status == 429 else {}
                return fault.status, {"ok": False, "error": fault.error}, headers
            self._calls.append(Call(method, params))
            error = self._auth_error(method, token)
            if error is not None:
                return 200, {"ok": False, "error": error}, {}
            try:
                return 200, {"ok": True, **self._methods[method](copy.deepcopy(params))}, {}
            except _ApiError as exc:
                return 200, {"ok": False, "error": str(exc)}, {}

    def _auth_error(self, method: str, token: str | None) -> str | None:
        expected = self.app_token if method in _APP_TOKEN_METHODS else self.bot_token
        if not token:
            return "not_authed"
        if token == expected:
            return None
        if token in (self.app_token, self.bot_token):
            return "not_allowed_token_type"
        return "invalid_auth"

    def _record_dropped(self, method: str, params: dict[str, Any]) -> None:
        with self._lock:
            self._failed_calls.append(FailedCall(method, params, 0))

    # ---- Web API methods (run under self._lock) ----------------------------------------------

    def _next_ts(self) -> str:
        self._last_ts_us = max(time.time_ns() // 1000, self._last_ts_us + 1)
        return f"{self._last_ts_us // 1_000_000}.{self._last_ts_us % 1_000_000:06d}"

    def _channel(self, params: dict[str, Any]) -> str:
        channel = params.get("channel")
        if not channel or (self.known_channels is not None and channel not in self.known_channels):
            raise _ApiError("channel_not_found")
        return str(channel)

    def _find(self, channel: str, ts: Any) -> dict[str, Any]:
        for msg in self._messages.get(channel, []):
            if msg["ts"] == str(ts):
                return msg
        raise _ApiError("message_not_found")

    @staticmethod
    def _is_top_level(msg: dict[str, Any]) -> bool:
        thread_ts = msg.get("thread_ts")
        return thread_ts in (None, msg["ts"]) or msg.get("subtype") == "thread_broadcast"

    def _public(self, channel: str, msg: dict[str, Any], with_metadata: bool) -> dict[str, Any]:
        """Shape a stored message as history/replies answer it (thread summary, metadata rule)."""
        shown = copy.deepcopy(msg)
        if not with_metadata:
            shown.pop("metadata", None)
        replies = [m for m in self._messages.get(channel, []) if m.get("thread_ts") == msg["ts"]]
        replies = [m for m in replies if m["ts"] != msg["ts"]]
        if replies:
            shown.update(
                thread_ts=msg["ts"],
                reply_count=len(replies),
                reply_users=sorted({m["user"] for m in replies}),
                reply_users_count=len({m["user"] for m in replies}),
                latest_reply=replies[-1]["ts"],
            )
        return shown

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": f"https://{TEAM_DOMAIN}.slack.com/",
            "team": "Emulated Team",
            "user": "detector",
            "team_id": TEAM_ID,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _chat_post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        if not (params.get("text") or params.get("blocks") or params.get("attachments")):
            raise _ApiError("no_text")
        ts = self._next_ts()
        msg: dict[str, Any] = {
            "type": "message",
            "user": BOT_USER_ID,
            "bot_id": BOT_ID,
            "app_id": APP_ID,
            "team": TEAM_ID,
            "text": params.get("text") or "",
            "ts": ts,
        }
        for key in ("blocks", "attachments"):
            if params.get(key) is not None:
                msg[key] = params[key]
        if params.get("metadata") is not None:
            msg["metadata"] = self._metadata(params["metadata"])
        if params.get("thread_ts"):
            parent = self._find_thread_root(channel, params["thread_ts"])
            msg.update(thread_ts=parent["ts"], parent_user_id=parent["user"])
            if _truthy(params.get("reply_broadcast")):
                msg["subtype"] = "thread_broadcast"
        self._messages.setdefault(channel, []).append(msg)
        return {"channel": channel, "ts": ts, "message": copy.deepcopy(msg)}

    @staticmethod
    def _metadata(metadata: Any) -> dict[str, Any]:
        if not isinstance(metadata, dict) or "event_type" not in metadata:
            raise _ApiError("invalid_metadata_format")
        return {
            "event_type": metadata["event_type"],
            "event_payload": metadata.get("event_payload", {}),
        }

    def _find_thread_root(self, channel: str, ts: Any) -> dict[str, Any]:
        try:
            msg = self._find(channel, ts)
        except _ApiError:
            raise _ApiError("thread_not_found") from None
        return self._find(channel, msg["thread_ts"]) if msg.get("thread_ts") else msg

    def _chat_update(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        msg = self._find(channel, params.get("ts"))
        if not any(params.get(key) for key in ("text", "blocks", "attachments")):
            raise _ApiError("no_text")
        before = copy.deepcopy(msg)
        for key in ("text", "blocks", "attachments"):
            if key in params and params[key] is not None:
                msg[key] = params[key]
        if params.get("metadata") is not None:
            msg["metadata"] = self._metadata(params["metadata"])
        msg["edited"] = {"user": BOT_USER_ID, "ts": self._next_ts()}
        after = copy.deepcopy(msg)
        self._edits.append({"channel": channel, "ts": msg["ts"], "before": before, "after": after})
        return {"channel": channel, "ts": msg["ts"], "text": msg["text"], "message": after}

    def _chat_post_ephemeral(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        if not params.get("user"):
            raise _ApiError("user_not_in_channel")
        if not (params.get("text") or params.get("blocks") or params.get("attachments")):
            raise _ApiError("no_text")
        message_ts = self._next_ts()
        self._ephemerals.append(
            {
                "channel": channel,
                "user": params["user"],
                "text": params.get("text") or "",
                "blocks": params.get("blocks"),
                "thread_ts": params.get("thread_ts"),
                "message_ts": message_ts,
            }
        )
        return {"message_ts": message_ts}

    @staticmethod
    def _page(items: list[dict[str, Any]], params: dict[str, Any], key: str) -> dict[str, Any]:
        """Cut one page of ``items`` by ``limit``/``cursor`` as Slack's cursor pagination does."""
        limit = min(max(int(params.get("limit") or 100), 1), 999)
        cursor = params.get("cursor") or ""
        try:
            start = int(base64.b64decode(cursor).decode().removeprefix("offset:")) if cursor else 0
        except ValueError:
            raise _ApiError("invalid_cursor") from None
        page, has_more = items[start : start + limit], start + limit < len(items)
        next_cursor = base64.b64encode(f"offset:{start + limit}".encode()).decode()
        return {
            key: page,
            "has_more": has_more,
            "response_metadata": {"next_cursor": next_cursor if has_more else ""},
        }

    def _conversations_history(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        inclusive = _truthy(params.get("inclusive"))
        oldest = _ts_key(str(params.get("oldest") or "0"))
        latest = _ts_key(str(params["latest"])) if params.get("latest") else None

        def in_range(ts: str) -> bool:
            key = _ts_key(ts)
            if key < oldest or (key == oldest and not inclusive):
                return False
            return latest is None or key < latest or (key == latest and inclusive)

        with_metadata = _truthy(params.get("include_all_metadata"))
        roots = [
            self._public(channel, msg, with_metadata)
            for msg in self._messages.get(channel, [])
            if self._is_top_level(msg) and in_range(msg["ts"])
        ]
        roots.sort(key=lambda msg: _ts_key(msg["ts"]), reverse=True)
        return {**self._page(roots, params, "messages"), "pin_count": 0}

    def _conversations_replies(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(params)
        root = self._find_thread_root(channel, params.get("ts"))
        with_metadata = _truthy(params.get("include_all_metadata"))
        thread = [
            self._public(channel, msg, with_metadata)
            for msg in self._messages.get(channel, [])
            if msg is root or msg.get("thread_ts") == root["ts"]
        ]
        thread.sort(key=lambda msg: _ts_key(msg["ts"]))
        return self._page(thread, params, "messages")

    def _users_info(self, params: dict[str, Any]) -> dict[str, Any]:
        user_id = params.get("user")
        email = self.users.get(str(user_id))
        if email is None:
            raise _ApiError("user_not_found")
        name = email.split("@", 1)[0]
        profile = {"email": email, "real_name": name.title(), "display_name": name}
        return {
            "user": {
                "id": user_id,
                "team_id": TEAM_ID,
                "name": name,
                "real_name": name.title(),
                "deleted": False,
                "is_bot": False,
                "profile": profile,
            }
        }

    def _apps_connections_open(self, params: dict[str, Any]) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        return {"url": f"ws://127.0.0.1:{self.ws_port}/link/?ticket={ticket}&app_id={APP_ID}"}


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    emulator: SlackEmulator


class _Handler(BaseHTTPRequestHandler):
    """Route ``/api/<method>`` to the emulator; answer 404 elsewhere."""

    server: _HttpServer
    timeout = 10

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("slack_emulator %s", format % args)

    def _handle(self) -> None:
        emulator = self.server.emulator
        url = urlsplit(self.path)
        params = self._params(url.query)
        auth = self.headers.get("Authorization", "")
        body_token = params.pop("token", None)  # legacy: the token as a parameter
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else body_token
        method = url.path.removeprefix("/api/")
        if not emulator._hold():
            emulator._record_dropped(method, params)
            self.close_connection = True
            return
        if url.path.startswith("/api/"):
            self._send(*emulator._answer(method, token, params))
        else:
            self._send(404, {"ok": False, "error": "not_found"}, {})

    def _params(self, query: str) -> dict[str, Any]:
        """Merge query string and body (form or JSON); decode JSON-string block fields."""
        params: dict[str, Any] = {k: v[-1] for k, v in parse_qs(query, True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        content_type = self.headers.get("Content-Type", "")
        if body and content_type.startswith("application/json"):
            params.update(json.loads(body))
        elif body:
            params.update({k: v[-1] for k, v in parse_qs(body.decode(), True).items()})
        for key in _JSON_FIELDS:
            value = params.get(key)
            if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
                # Not JSON: Slack would answer invalid_blocks; keep the raw string visible.
                with contextlib.suppress(json.JSONDecodeError):
                    params[key] = json.loads(value)
        return params

    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def block_actions_payload(
    *,
    user_id: str,
    action_id: str,
    value: str,
    channel: str,
    message_ts: str,
    block_id: str = "steps",
    user_name: str = "someone",
    team_id: str = TEAM_ID,
    message: dict[str, Any] | None = None,
    response_url: str | None = None,
    button_text: str = "Approve",
) -> dict[str, Any]:
    """Build a ``block_actions`` interaction payload for a button click on a message.

    Shape: https://docs.slack.dev/reference/interaction-payloads/block_actions-payload .
    ``message`` defaults to a bare message with ``message_ts``; pass a stored one for its blocks.
    """
    action_ts = f"{time.time():.6f}"
    shown = copy.deepcopy(message) if message is not None else {"text": "", "blocks": []}
    shown.pop("channel", None)
    shown.update(type="message", ts=message_ts)
    return {
        "type": "block_actions",
        "user": {"id": user_id, "username": user_name, "name": user_name, "team_id": team_id},
        "api_app_id": APP_ID,
        "token": "verification-token-unused",
        "container": {
            "type": "message",
            "message_ts": message_ts,
            "channel_id": channel,
            "is_ephemeral": False,
        },
        "trigger_id": f"{int(time.time())}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex}",
        "team": {"id": team_id, "domain": TEAM_DOMAIN},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel, "name": channel.lstrip("#")},
        "message": shown,
        "state": {"values": {}},
        "response_url": response_url
        or f"https://hooks.slack.com/actions/{team_id}/{uuid.uuid4().int % 10**12}/x",
        "actions": [
            {
                "action_id": action_id,
                "block_id": block_id,
                "text": {"type": "plain_text", "text": button_text, "emoji": True},
                "value": value,
                "type": "button",
                "action_ts": action_ts,
            }
        ],
    }


def signed_request(
    secret: str, payload: dict[str, Any], *, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """Sign an interaction POST as Slack does: ``(body, headers)``.

    ``X-Slack-Signature`` is ``v0=`` + hex HMAC-SHA256 of ``v0:{timestamp}:{body}`` keyed with
    the signing secret (https://docs.slack.dev/authentication/verifying-requests-from-slack/).
    """
    ts = int(time.time()) if timestamp is None else timestamp
    body = urlencode({"payload": json.dumps(payload)}).encode()
    base = b"v0:" + str(ts).encode() + b":" + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": str(ts),
        "X-Slack-Signature": f"v0={digest}",
    }
    return body, headers
