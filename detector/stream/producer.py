"""A small adapter around kafka-python's KafkaProducer and topic creation; raises StreamError."""

from __future__ import annotations

import logging

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from detector.errors import StreamError
from detector.stream.bootstrap import client_options, connecting

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]


class KafkaSink:
    """Send records to Kafka; ``flush`` waits until every sent record is acknowledged."""

    def __init__(self, bootstrap_servers: str, *, bootstrap_timeout_ms: int | None = None) -> None:
        """Connect; raise StreamError when no broker answers within ``bootstrap_timeout_ms``.

        ``bootstrap_timeout_ms`` None: kafka-python's default (30 s).
        """
        options = client_options(bootstrap_servers, bootstrap_timeout_ms)
        with connecting(bootstrap_servers, "produce to", bootstrap_timeout_ms):
            self._producer = KafkaProducer(**options, acks="all", linger_ms=5)

    def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Queue one record; ``timestamp_ms`` (ms since the epoch) defaults to now."""
        try:
            self._producer.send(
                topic, value=value, key=key, headers=headers or [], timestamp_ms=timestamp_ms
            )
        except KafkaError as exc:
            raise StreamError(f"send to topic={topic} failed: {exc}") from exc

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued record is acknowledged (at most ``timeout_s`` seconds)."""
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError as exc:
            raise StreamError(f"flush failed: {exc}") from exc

    def close(self) -> None:
        """Flush and close the producer."""
        try:
            self._producer.close(timeout=10)
        except KafkaError as exc:
            log.warning("producer close failed error=%s", exc)


def ensure_topics(
    bootstrap_servers: str,
    topics: list[str],
    partitions: int = 1,
    *,
    like: list[str] | None = None,
    bootstrap_timeout_ms: int | None = None,
) -> int:
    """Create the topics that do not exist yet (replication factor 1); return their count.

    New topics get the partition count of the existing ``like`` topics (the largest, when they
    differ), so that keyed streams stay co-partitioned; ``partitions`` when none of them exists.
    Raises StreamError.
    """
    options = client_options(bootstrap_servers, bootstrap_timeout_ms)
    with connecting(bootstrap_servers, "create topics on", bootstrap_timeout_ms):
        admin = KafkaAdminClient(**options)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in topics if t not in existing]
        present = sorted({t for t in (like or []) + topics if t in existing})
        counts = _partition_counts(admin, present) if present else {}
        if len(set(counts.values())) > 1:
            log.warning("topics differ in partition count counts=%s", counts)
        count = max(counts.values(), default=partitions)
        if missing:
            try:
                admin.create_topics([NewTopic(t, count, 1) for t in missing])
                log.info("topics created topics=%s partitions=%d", missing, count)
            except TopicAlreadyExistsError:
                pass  # another client created it meanwhile
        return count
    except KafkaError as exc:
        raise StreamError(f"cannot create topics {topics}: {exc}") from exc
    finally:
        admin.close()


def _partition_counts(admin: KafkaAdminClient, topics: list[str]) -> dict[str, int]:
    """Return the partition count of each of ``topics`` (all exist)."""
    return {d["name"]: len(d["partitions"]) for d in admin.describe_topics(topics)}
