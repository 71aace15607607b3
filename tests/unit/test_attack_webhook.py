"""Hostile answers to the PagerDuty / Grafana sender (``detector.notify.webhook``).

A real HTTP server on loopback (the standard library's ``http.server``) plays a service that
answers with a body without end, echoes the credentials it was sent with control characters
around them, or is named by a URL that is no http(s) URL at all.
"""

from __future__ import annotations

import json
import threading
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from detector.notify import webhook

SECRET = "R0UTING-KEY-0123456789abcdef0123"
HUGE_MIB = 64


class Hostile(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        sent = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/huge":
            self.send_response(400)
            self.send_header("Content-Length", str(HUGE_MIB * 1024 * 1024))
            self.end_headers()
            try:
                for _ in range(HUGE_MIB):
                    self.wfile.write(b'{"message": "' + b"x" * (1024 * 1024))
            except OSError:
                pass  # the client stopped reading: what it should do
            return
        if self.path == "/echo":  # a proxy that echoes what it was sent, with escapes
            said = self.headers.get("Authorization", "") + " " + sent.decode()
            body = json.dumps(
                {
                    "message": "\x1b[2J\x1b]0;owned\x07bad: " + said,
                    "errors": ["\u202eevil", {"routing_key": SECRET}],
                }
            ).encode()
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


@pytest.fixture
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_body_without_end_is_not_held_in_memory(base: str) -> None:
    with httpx.Client(timeout=30) as client:
        tracemalloc.start()
        try:
            answer = webhook.send(client, base + "/huge", {"routing_key": SECRET})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert (answer.sent, answer.retry) == (False, False)
    assert answer.error.startswith("HTTP 400")
    assert peak < 8 * 1024 * 1024, f"held {peak / 2**20:.0f} MiB of a {HUGE_MIB} MiB answer"


def test_an_answer_read_past_its_time_is_cut(base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook, "MAX_ANSWER_S", -1.0)  # every chunk arrives past the time
    with httpx.Client(timeout=30) as client:
        answer = webhook.send(client, base + "/echo", {"routing_key": SECRET})
    assert answer.error == "HTTP 400: no JSON answer"


def test_credentials_echoed_by_the_server_never_reach_the_error(base: str) -> None:
    with httpx.Client(timeout=30) as client:
        answer = webhook.send(client, base + "/echo", {"routing_key": SECRET},
                              {"Authorization": "Bearer glsa_T0KEN"},
                              redact=[SECRET, "glsa_T0KEN"])  # fmt: skip
    assert answer.error.startswith("HTTP 400: ")
    assert SECRET not in answer.error and "glsa_T0KEN" not in answer.error
    assert "[redacted]" in answer.error
    assert not any(ord(c) < 0x20 or c == "\u202e" for c in answer.error), answer.error
    assert "\\x1b[2J" in answer.error
    assert len(answer.error) <= webhook.MAX_ERROR_CHARS


@pytest.mark.parametrize(
    "url",
    ["ftp://events.example/v2/enqueue", "file:///etc/passwd", "javascript:alert(1)", "",
     "events.pagerduty.com/v2/enqueue", "http://[::1", "http://host:99999999/x"],
)  # fmt: skip
def test_a_url_that_is_not_http_is_refused_without_a_retry(url: str) -> None:
    with httpx.Client(timeout=5) as client:
        answer = webhook.send(client, url, {"routing_key": SECRET})
    assert (answer.sent, answer.retry) == (False, False), answer
    assert "nothing sent" in answer.error
    assert SECRET not in answer.error


NOW = datetime(2026, 12, 8, 1, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("120", 120.0), ("-5", 0.0), ("1e400", 3600.0), ("inf", 3600.0), ("nan", None),
     ("soon", None), ("Tue, 08 Dec 2026 01:02:00 GMT", 120.0),
     ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("Fri, 31 Dec 9999 23:59:59 GMT", 3600.0),
     ("Mon, 99 Foo 2026 00:00:00 GMT", None), ("Tue, 08 Dec 2026 01:01:00 -0000", 60.0)],
)  # fmt: skip
def test_retry_after_in_both_forms_is_bounded(value: str, seconds: float | None) -> None:
    assert webhook.retry_after(value, NOW) == seconds
