"""Serve the detector's web app with a real uvicorn on a free loopback port, for tests."""

from __future__ import annotations

import socket
import threading
import time
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
