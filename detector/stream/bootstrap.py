"""Connecting a kafka-python client: a bounded wait for the broker and one line when it fails.

kafka-python bootstraps in a client's constructor (it asks the broker its API versions, as
``api_version=None`` tells it to) and retries until ``bootstrap_timeout_ms``, logging every
refused connection: https://kafka-python.readthedocs.io/en/master/apidoc/KafkaProducer.html.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from detector.errors import StreamError

SERVERS_VAR = "DETECTOR_KAFKA__BOOTSTRAP_SERVERS"
TIMEOUT_VAR = "DETECTOR_KAFKA__BOOTSTRAP_TIMEOUT_MS"


def client_options(bootstrap_servers: str, bootstrap_timeout_ms: int | None) -> dict[str, Any]:
    """Return the options every client gets: the servers and, if given, the bootstrap wait."""
    options: dict[str, Any] = {"bootstrap_servers": bootstrap_servers.split(",")}
    if bootstrap_timeout_ms is not None:
        options["bootstrap_timeout_ms"] = bootstrap_timeout_ms
    return options


@contextmanager
def connecting(bootstrap_servers: str, what: str, timeout_ms: int | None) -> Iterator[None]:
    """Build a client inside: translate its KafkaError to one StreamError line.

    kafka-python's per-attempt connection warnings are held back meanwhile (unless the
    ``kafka`` logger is at INFO or below, as with ``--verbose``): the error says it all.
    ``what`` says what the client was for (``produce to``, ``consume``).
    """
    logger = logging.getLogger("kafka")
    quiet = logger.getEffectiveLevel() > logging.INFO
    level = logger.level
    if quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    except (KafkaTimeoutError, KafkaConnectionError) as exc:
        within = f" within {timeout_ms / 1000:g} s" if timeout_ms is not None else ""
        raise StreamError(
            f"cannot {what} Kafka: no broker answered at {bootstrap_servers}{within}: "
            f"check --bootstrap or {SERVERS_VAR} (wait longer: {TIMEOUT_VAR})"
        ) from exc
    except KafkaError as exc:
        raise StreamError(f"cannot {what} Kafka at {bootstrap_servers}: {exc}") from exc
    finally:
        if quiet:
            logger.setLevel(level)
