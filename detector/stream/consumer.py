"""A small adapter around kafka-python's KafkaConsumer: batches, commits, seeks, assignments.

Kafka types stay inside this module: partitions are ``(topic, partition)`` tuples and records
are ``Record``s. Every kafka error is translated to ``StreamError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from detector.config import KafkaSettings
from detector.errors import StreamError
from detector.stream.bootstrap import client_options, connecting

log = logging.getLogger(__name__)

Partition = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed record; ``timestamp_ms`` is the Kafka record time (ms since the epoch)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed position: the next offset to read and the metadata stored with it."""

    offset: int
    metadata: str


class _Listener(ConsumerRebalanceListener):
    """Note assignments; kafka-python runs this on its IO thread, where nothing may block."""

    def __init__(self) -> None:
        self.assigned: list[Partition] | None = None

    def on_partitions_revoked(self, revoked: Any) -> None:
        partitions = sorted((p.topic, p.partition) for p in revoked)
        log.info("partitions revoked partitions=%s", partitions)

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.assigned = sorted((p.topic, p.partition) for p in assigned)


class KafkaSource:
    """Consume ``topics`` in a consumer group without auto-commit; raises StreamError.

    The range assignor gives partition i of every topic to the same process, so a workload's
    records (keyed by workload, hence in the same partition number of every topic when the
    topics have the same partition count) are correlated in one process.
    ``on_assign`` runs on the polling thread, inside the ``poll`` that saw the assignment;
    that poll returns no records (they were not committed, so none is lost), which lets
    ``on_assign`` seek before anything of the new assignment is processed.
    """

    def __init__(
        self, settings: KafkaSettings, on_assign: Callable[[list[Partition]], None]
    ) -> None:
        servers, timeout_ms = settings.bootstrap_servers, settings.bootstrap_timeout_ms
        with connecting(servers, "consume from", timeout_ms):
            self._consumer = KafkaConsumer(
                **client_options(servers, timeout_ms),
                group_id=settings.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                fetch_max_wait_ms=settings.fetch_max_wait_ms,
                session_timeout_ms=settings.session_timeout_ms,
                heartbeat_interval_ms=max(100, settings.session_timeout_ms // 3),
                max_poll_interval_ms=settings.max_poll_interval_ms,
                max_poll_records=settings.max_poll_records,
                partition_assignment_strategy=(RangePartitionAssignor,),
            )
        self._listener = _Listener()
        self._on_assign = on_assign
        try:
            self._consumer.subscribe(settings.topics, listener=self._listener)
        except KafkaError as exc:
            raise StreamError(f"cannot consume {settings.topics}: {exc}") from exc

    def poll(self, timeout_ms: int) -> list[Record]:
        """Return the next batch (at most max_poll_records), oldest first per partition."""
        try:
            batches = self._consumer.poll(timeout_ms=timeout_ms)
        except KafkaError as exc:
            raise StreamError(f"poll failed: {exc}") from exc
        assigned, self._listener.assigned = self._listener.assigned, None
        if assigned is not None:
            self._on_assign(assigned)
            return []
        return [
            Record(tp.topic, tp.partition, r.offset, r.timestamp, r.key, r.value or b"")
            for tp, records in batches.items()
            for r in records
        ]

    def commit(self, offsets: dict[Partition, Committed]) -> None:
        """Commit the next offsets to read (with their metadata) synchronously."""
        data = {
            TopicPartition(t, p): OffsetAndMetadata(c.offset, c.metadata, -1)
            for (t, p), c in offsets.items()
        }
        try:
            self._consumer.commit(data)
        except KafkaError as exc:
            raise StreamError(f"commit of {sorted(offsets)} failed: {exc}") from exc

    def committed(self, partition: Partition) -> Committed | None:
        """Return the group's committed position of ``partition``, None when it has none."""
        try:
            found = self._consumer.committed(TopicPartition(*partition), metadata=True)
        except KafkaError as exc:
            raise StreamError(f"committed offset of {partition} unavailable: {exc}") from exc
        if found is None or found.offset is None or found.offset < 0:
            return None
        return Committed(found.offset, found.metadata or "")

    def offset_for_time(self, partition: Partition, timestamp_ms: int) -> int | None:
        """Return the first offset with a record time >= ``timestamp_ms``; None when none.

        Raises StreamError when the broker cannot answer (e.g. ListOffsets v1 unsupported).
        """
        tp = TopicPartition(*partition)
        try:
            found = self._consumer.offsets_for_times({tp: timestamp_ms})
        except KafkaError as exc:
            raise StreamError(f"offsets_for_times unsupported for {partition}: {exc}") from exc
        hit = found.get(tp)
        return None if hit is None else int(hit.offset)

    def beginning(self, partition: Partition) -> int:
        """Return the first offset still retained in ``partition``."""
        tp = TopicPartition(*partition)
        try:
            return int(self._consumer.beginning_offsets([tp])[tp])
        except KafkaError as exc:
            raise StreamError(f"beginning offset of {partition} unavailable: {exc}") from exc

    def seek(self, partition: Partition, offset: int) -> None:
        """Make the next poll of ``partition`` start at ``offset``."""
        try:
            self._consumer.seek(TopicPartition(*partition), offset)
        except (KafkaError, AssertionError, ValueError) as exc:
            raise StreamError(f"seek {partition} to {offset} failed: {exc}") from exc

    def assignment(self) -> list[Partition]:
        """Return the partitions this consumer owns now."""
        return sorted((tp.topic, tp.partition) for tp in self._consumer.assignment())

    def lag(self) -> dict[Partition, int]:
        """Return records behind the high watermark per assigned partition (known ones only)."""
        out: dict[Partition, int] = {}
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None:
                continue
            try:
                out[(tp.topic, tp.partition)] = max(0, high - self._consumer.position(tp))
            except (KafkaError, AssertionError) as exc:
                log.debug("position unknown topic=%s error=%s", tp.topic, exc)
        return out

    def close(self) -> None:
        """Leave the group and close the connections (without committing)."""
        try:
            self._consumer.close(autocommit=False)
        except KafkaError as exc:
            log.warning("consumer close failed error=%s", exc)
