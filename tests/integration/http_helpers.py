"""Serve the detector's web app with a real uvicorn on a free loopback port, for tests."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from detector.config import Settings
from detector.web.app import create_app, server_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(settings: Settings) -> Iterator[str]:
    """Serve the app for ``settings`` with uvicorn as ``detector serve`` configures it, on a free
    loopback port; yield its base URL."""
    port = _free_port()
    uv = uvicorn.Server(server_config(create_app(settings), "127.0.0.1", port, "error"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(timeout=10)


def announce_oversized(url: str, headers: dict[str, str], length: int) -> int:
    """POST to ``url`` headers announcing a ``length``-byte body and only its first KiB; return
    the status. The server answers on the header alone and closes: a client still sending the
    whole body then fails with a broken pipe or a reset before it reads the answer (seen under
    load)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.putrequest("POST", parts.path)
        for name, value in {**headers, "Content-Length": str(length)}.items():
            conn.putheader(name, value)
        conn.endheaders(b"x" * 1024)
        return conn.getresponse().status
    finally:
        conn.close()
