"""A local PagerDuty Events API v2 for tests: ``POST /v2/enqueue`` that checks each event.

The checks follow PagerDuty's reference (https://developer.pagerduty.com/docs/events-API-v2/
trigger-events/, ``acknowledge-events/``, ``resolve-events/``; answers and retries:
https://developer.pagerduty.com/docs/events-API-v2/overview/#response-codes--retry-logic):
``routing_key`` (a 32-character integration key), ``event_action`` trigger/acknowledge/resolve,
``dedup_key`` (at most 255 characters; required to acknowledge or resolve), and for a trigger a
``payload`` with ``summary`` (1-1024 characters), ``source`` and ``severity``
(critical/error/warning/info), an optional ISO 8601 ``timestamp`` and object
``custom_details``; ``links`` entries need ``href``. A valid event is answered 202 with its
``dedup_key``, an invalid one 400 with the errors. ``fail(status, retry_after_s)`` answers the
next events with a fault (429, 500, ...), with a ``Retry-After`` header when given; ``pause()``
holds every request unanswered until ``resume()``. ``alerts()`` folds the accepted events as
PagerDuty does: one alert per ``dedup_key``, a trigger on an open alert only adds to its log.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

ACTIONS = frozenset({"trigger", "acknowledge", "resolve"})
SEVERITIES = frozenset({"critical", "error", "warning", "info"})
TOP_LEVEL = frozenset(
    {"routing_key", "event_action", "dedup_key", "payload", "images", "links", "client",
     "client_url"}
)  # fmt: skip
PAYLOAD_FIELDS = frozenset(
    {"summary", "source", "severity", "timestamp", "component", "group", "class",
     "custom_details"}
)  # fmt: skip


class Fault(NamedTuple):
    """An injected answer: its status and ``Retry-After`` seconds (None: no header)."""

    status: int
    retry_after_s: float | None


def problems(event: Any) -> list[str]:
    """Return what is wrong with ``event`` as PagerDuty checks it ([] when valid)."""
    if not isinstance(event, dict):
        return ["the event is not a JSON object"]
    errors = [f"unknown field {k!r}" for k in event if k not in TOP_LEVEL]
    key = event.get("routing_key")
    if not (isinstance(key, str) and len(key) == 32):
        errors.append("routing_key must be a 32-character integration key")
    action = event.get("event_action")
    if action not in ACTIONS:
        errors.append("event_action must be trigger, acknowledge or resolve")
    dedup = event.get("dedup_key")
    if dedup is not None and not (isinstance(dedup, str) and 0 < len(dedup) <= 255):
        errors.append("dedup_key must be a string of 1-255 characters")
    if action in ("acknowledge", "resolve") and dedup is None:
        errors.append(f"dedup_key is required to {action}")
    if action == "trigger":
        errors += _payload_problems(event.get("payload"))
    for link in event.get("links") or []:
        if not (isinstance(link, dict) and isinstance(link.get("href"), str)):
            errors.append("each link needs an href")
    return errors


def _payload_problems(payload: Any) -> list[str]:
    if not isinstance(payload, dict):
        return ["payload is required to trigger"]
    errors = [f"unknown payload field {k!r}" for k in payload if k not in PAYLOAD_FIELDS]
    summary = payload.get("summary")
    if not (isinstance(summary, str) and 0 < len(summary) <= 1024):
        errors.append("payload.summary must be 1-1024 characters")
    if not (isinstance(payload.get("source"), str) and payload["source"]):
        errors.append("payload.source is required")
    if payload.get("severity") not in SEVERITIES:
        errors.append("payload.severity must be critical, error, warning or info")
    stamp = payload.get("timestamp")
    if stamp is not None:
        try:
            datetime.fromisoformat(str(stamp))
        except ValueError:
            errors.append("payload.timestamp must be ISO 8601")
    details = payload.get("custom_details")
    if details is not None and not isinstance(details, dict):
        errors.append("payload.custom_details must be an object")
    return errors


class PagerDutyEmulator:
    """Serve ``/v2/enqueue`` on a free loopback port; ``events`` holds the accepted events."""

    routing_key = "0123456789abcdef0123456789abcdef"  # 32 characters, as PagerDuty issues

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.refused: list[tuple[int, Any]] = []  # (status, body) of invalid or faulted events
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._unpaused = threading.Event()
        self._unpaused.set()
        self.held = 0  # requests held by ``pause()`` now
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Return the events URL (``DETECTOR_PAGERDUTY__EVENTS_URL``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v2/enqueue"

    def fail(self, status: int, retry_after_s: float | None = None, times: int = 1) -> None:
        """Answer the next ``times`` events with ``status`` (and ``Retry-After``)."""
        with self._lock:
            self._faults += [Fault(status, retry_after_s)] * times

    def pause(self) -> None:
        """Hold every request until ``resume()``."""
        self._unpaused.clear()

    def resume(self) -> None:
        """Answer the held requests and stop holding new ones."""
        self._unpaused.set()

    def alerts(self) -> dict[str, list[str]]:
        """Return each alert (by ``dedup_key``) with its states in order: a trigger opens one
        (or adds to the open one's log), acknowledge and resolve change it."""
        found: dict[str, list[str]] = {}
        for action, key in self.actions():
            states = found.setdefault(key, [])
            state = {"trigger": "triggered", "acknowledge": "acknowledged"}.get(action, "resolved")
            if action == "trigger" and states and states[-1] != "resolved":
                continue  # deduplicated into the open alert
            states.append(state)
        return found

    def actions(self) -> list[tuple[str, str]]:
        """Return (event_action, dedup_key) of the accepted events, in order."""
        with self._lock:
            return [(e["event_action"], e.get("dedup_key", "")) for e in self.events]

    def answer(self, body: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Return (status, JSON answer, headers) for one request body."""
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
        try:
            event = json.loads(body)
        except ValueError:
            event = None
        if fault is not None:
            headers = (
                {} if fault.retry_after_s is None else {"Retry-After": str(fault.retry_after_s)}
            )
            with self._lock:
                self.refused.append((fault.status, event))
            return fault.status, {"status": "error", "message": "injected fault"}, headers
        errors = problems(event)
        if errors:
            with self._lock:
                self.refused.append((400, event))
            return 400, {"status": "invalid event", "message": "Event object is invalid",
                         "errors": errors}, {}  # fmt: skip
        dedup = event.get("dedup_key") or uuid.uuid4().hex
        with self._lock:
            self.events.append(event)
        return 202, {"status": "success", "message": "Event processed", "dedup_key": dedup}, {}

    def __enter__(self) -> PagerDutyEmulator:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._unpaused.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    def __init__(self, emulator: PagerDutyEmulator, *args: Any) -> None:
        self.emulator = emulator
        super().__init__(*args)

    def do_POST(self) -> None:
        if self.path != "/v2/enqueue":
            self._send(404, {"status": "error", "message": "not found"}, {})
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        emulator = self.emulator
        with emulator._lock:
            emulator.held += 1
        emulator._unpaused.wait(60)
        with emulator._lock:
            emulator.held -= 1
        self._send(*emulator.answer(body))

    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass
