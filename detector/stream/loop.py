"""The live loop: consume a batch, process it in one transaction, then commit its offsets.

Order per batch (at-least-once: offsets are committed only after the database transaction):
parse -> correlate -> the batch stages of ``pipeline.Processor`` (record incidents, contain)
or a dead letter -> flush dead-letter records -> database commit -> Kafka offset commit.
Polled records pass a reorder buffer first (``detector.stream.reorder``), so that partitions
are taken in event-time order while the consumer catches up. On an assignment the
correlator's state is rebuilt by re-reading the last ``correlate.window_s`` of each partition
before its committed offset; the writes are idempotent, so nothing duplicates.
A batch is cut after a record that opened an incident or changed its stage: what it processed
is committed at once (the on-call is waiting for that row and its Slack message) and the rest
is processed next, before the next poll. Within that record the stage is committed even
before containment plans its runbook (``Processor.checkpoint``): record and notify, database
commit, contain and notify, database commit, then the offsets; a crash between the two
commits re-processes the record, whose writes are idempotent.
A batch that failed is retried with each of its records in a savepoint of its own: a record
that fails while the store answers is dead-lettered as ``processing_failed`` with its error
(``StreamLoop._process_alone``), so no record stalls the stream; a store outage dead-letters
nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.orm import Session

from detector import db
from detector.config import Settings
from detector.correlate.coverage import SignalCoverage
from detector.correlate.identity import WorkloadRef
from detector.errors import ParseError, StoreError, StreamError
from detector.events.model import SourcePos
from detector.pipeline import Parsed, Processor, parse_checked
from detector.stream.consumer import Committed, Partition, Record
from detector.stream.health import PROBE_EVERY_S, probe
from detector.stream.keycheck import SAMPLE_MASK, KeyCheck
from detector.stream.metrics import LoopMetrics
from detector.stream.producer import Headers
from detector.stream.reorder import ReorderBuffer
from detector.textsafe import printable

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.1
PROCESSING_FAILED = "processing_failed"  # the dead-letter reason of a record that broke a batch
MAX_FUTURE_S = 86400.0  # event times further ahead of the wall clock are broken clocks
# a dead letter larger than this goes as its metadata (``dead_letter_summary``): kafka-python's
# producer refuses requests over 1 MiB (``max_request_size``) and brokers records over about
# 1 MiB (``message.max.bytes``), and a record that cannot be dead-lettered would stall the
# stream, its batch failing again and again
DEAD_LETTER_MAX_BYTES = 512 * 1024
COVERAGE_EVERY_S = 15.0  # a busy loop exports the signal coverage this often (wall clock)
SUMMARY_HEAD_BYTES = 4096  # the first bytes a summary keeps, as text


RecordId = tuple[str, int, int]  # topic, partition, offset


class Isolated(Exception):
    """A record's own processing failed while the store answered: it is dead-lettered."""


def _record_id(record: Record) -> RecordId:
    return record.topic, record.partition, record.offset


class Source(Protocol):
    """What the loop needs from a consumer (``KafkaSource`` or a fake)."""

    def poll(self, timeout_ms: int) -> list[Record]: ...
    def commit(self, offsets: dict[Partition, Committed]) -> None: ...
    def committed(self, partition: Partition) -> Committed | None: ...
    def offset_for_time(self, partition: Partition, timestamp_ms: int) -> int | None: ...
    def beginning(self, partition: Partition) -> int: ...
    def seek(self, partition: Partition, offset: int) -> None: ...
    def assignment(self) -> list[Partition]: ...
    def lag(self) -> dict[Partition, int]: ...


class Sink(Protocol):
    """What the loop needs from a producer (``KafkaSink`` or a fake)."""

    def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
    ) -> None: ...
    def flush(self, timeout_s: float = 30.0) -> None: ...


class StreamLoop:
    """Run the pipeline on a consumer's batches; ``attach`` a source before ``run``."""

    def __init__(
        self,
        settings: Settings,
        make_session: Callable[[], Session],
        sink: Sink,
        metrics: LoopMetrics | None = None,
        on_commit: Callable[[], None] = lambda: None,
    ) -> None:
        self._settings = settings
        self.metrics = metrics or LoopMetrics()
        self._make_session = make_session
        self._sink = sink
        self._on_commit = on_commit  # e.g. wake the Slack sender: the outbox has news
        self._session = make_session()
        self.processor = self._new_processor()
        self._source: Source | None = None
        kafka = settings.kafka
        self._held = ReorderBuffer(kafka.reorder_max_records, kafka.reorder_max_hold_s)
        self._rebuild_until: dict[Partition, int] = {}
        self._done: dict[Partition, Record] = {}  # the processed record of highest offset
        self._backoff_s = 0.0
        self._dirty = False  # incidents changed since their questions were last answered
        self._unkeyed: set[str] = set()  # topics with signals in unkeyed records
        self._keys = KeyCheck()  # sampled: do keys name the workload of their records?
        # records of the last batch that failed: retried one by one until it passes
        self._suspects: set[RecordId] = set()
        # records whose own processing failed: dead-lettered with the error, never re-processed
        self._isolated: dict[RecordId, str] = {}
        self._committed: dict[Partition, int] = {}  # what this process committed last
        # released records not processed yet: a batch is cut after a record that opened an
        # incident or changed its stage, so that row is committed without waiting for the rest
        self._pending: list[Record] = []
        self._coverage_due = 0.0  # monotonic time of the next export of the signal coverage
        self._health_due = 0.0  # monotonic time of the next probe of the store's health
        self._unflushed = False  # dead letters sent since the sink was last flushed

    def _new_processor(self) -> Processor:
        """Build a fresh processor that commits a stage before containment (``_checkpoint``)."""
        processor = Processor.from_settings(self._settings)
        processor.checkpoint = self._checkpoint
        return processor

    def _checkpoint(self) -> None:
        """Commit what the batch processed so far: a stage was just recorded.

        The dead letters sent before it are flushed first (a dead letter's row must not be
        committed before its record is in the dead-letter topic: a re-delivery finds the row
        and sends nothing). Inside the savepoint of a record retried alone nothing is
        committed: the retry keeps one transaction. Offsets are committed by ``step`` only.
        """
        if self._session.in_nested_transaction():
            return
        if self._unflushed:
            self._sink.flush()
            self._unflushed = False
        self._session.commit()
        self._on_commit()

    def attach(self, source: Source) -> None:
        """Use ``source`` for the next batches."""
        self._source = source

    @property
    def source(self) -> Source:
        """Return the attached source; raises StreamError when none is attached."""
        if self._source is None:
            raise StreamError("no source attached to the stream loop")
        return self._source

    def run(self, stop: threading.Event) -> None:
        """Process batches until ``stop`` is set; the batch in hand is finished first."""
        while not stop.is_set():
            self._probe_health()
            try:
                if self.step() == 0 and self._dirty:
                    self._answer_questions()
            except Isolated as exc:
                log.warning("record isolated from its batch, dead-lettering it %s", exc)
                self.metrics.batch_failures.labels("isolated").inc()
                self._recover(stop)
            except (StoreError, StreamError) as exc:
                log.warning("batch failed, retrying error=%s backoff_s=%.1f", exc, self._backoff_s)
                cause = "store" if isinstance(exc, StoreError) else "stream"
                self.metrics.batch_failures.labels(cause).inc()
                self._recover(stop)
            except Exception:  # the loop boundary: log the context, keep the stream going
                log.exception("batch failed unexpectedly assignment=%s", self._assignment())
                self.metrics.batch_failures.labels("unexpected").inc()
                self._recover(stop)
        if self._dirty:
            self._answer_questions()
        self._session.close()

    def step(self) -> int:
        """Poll, process and commit one batch; return how many records were polled (or taken
        from the rest of a batch cut short: ``_process``).

        The polled records pass the reorder buffer (``detector.stream.reorder``) first; what
        it releases is processed in event-time order, and only offsets below every held record
        are committed. Raises StoreError/StreamError.
        """
        source = self.source
        if self._pending:  # the rest of a batch cut short by a stage change: no poll yet
            polled, records, self._pending = [], self._pending, []
            lag = source.lag()
        else:
            polled = source.poll(self._settings.kafka.poll_timeout_ms)
            if polled and self._committed:
                self._went_back(polled)
            self._held.add(polled)
            lag = source.lag()
            # A partition not fetched yet has no known lag: it may hold the oldest records.
            behind = [p for p in source.assignment() if lag.get(p, 1) > 0]
            records = self._held.release(behind)
            if not records:
                return len(polled)
        started = time.perf_counter()
        try:
            with db.write_turn(self._session, after_others=True):
                offsets = self._process(records)
                self._session.commit()
        except Exception:
            # the retry takes these one by one, to find a record that fails on its own
            self._suspects = {_record_id(r) for r in records} - self._isolated.keys()
            self._pending = []
            raise
        records = records[: len(records) - len(self._pending)]
        polled = polled or records  # pending records count as polled: the loop is not idle
        # only what was committed passed: a retry cut short at a stage change (the rebuild
        # re-decides it) keeps the rest of the failed batch suspect, to be taken one by one
        self._suspects.difference_update(_record_id(r) for r in records)
        self._on_commit()
        self._backoff_s = 0.0  # the database took a batch: back to normal
        self._dirty = True
        self._observe(records, time.perf_counter() - started, lag)
        if offsets:
            try:
                source.commit(offsets)
            except StreamError as exc:  # the rows are stored: a re-delivery is idempotent
                log.warning("offset commit failed offsets=%s error=%s", sorted(offsets), exc)
            else:
                self._committed.update((p, c.offset) for p, c in offsets.items())
        return len(polled)

    def _went_back(self, polled: list[Record]) -> None:
        """Tell records polled below what this process committed, outside a re-read of its
        own: the topic was deleted and created again (the consumer reset to its start)."""
        firsts: dict[Partition, int] = {}
        for record in polled:
            firsts.setdefault((record.topic, record.partition), record.offset)
        back = [
            p
            for p, first in firsts.items()
            if p not in self._rebuild_until and first < self._committed.get(p, 0)
        ]
        if back:
            self._offsets_reset(back, "the topic was created again")

    def _offsets_reset(self, partitions: list[Partition], why: str) -> None:
        """Log and count a broker that lost records or commits; the correlator keeps its
        state (the broker's log no longer holds the window to rebuild it from), so a cascade
        seen again after the reset goes on in its incident."""
        log.warning(
            "offsets went back: %s; correlation state kept, reading the new log from its "
            "start partitions=%s committed_before=%s",
            why, partitions, {p: self._committed.get(p) for p in partitions},
        )  # fmt: skip
        for partition in partitions:
            self.metrics.offset_resets.labels(partition[0]).inc()
            self._committed.pop(partition, None)
            self._done.pop(partition, None)

    def _observe(self, records: list[Record], seconds: float, lag: dict[Partition, int]) -> None:
        """Update the loop's metrics after a committed batch."""
        m = self.metrics
        m.batch_seconds.observe(seconds)
        m.last_record.set_to_current_time()
        for topic, count in Counter(record.topic for record in records).items():
            m.consumed.labels(topic).inc(count)
        m.open_incidents.set(self.processor.correlator.open_incidents)
        if time.monotonic() >= self._coverage_due:  # also after each ``finish``
            self._export_coverage(self.processor.workload_coverage())
        m.held.set(len(self._held))
        m.set_lag(lag)

    def on_assign(self, partitions: list[Partition]) -> None:
        """Rebuild the correlator state of the assigned partitions (see module docstring).

        When the broker holds no commit, or an older one, for a partition this process
        committed, it lost its data (a broker without its disks, a group or topic deleted):
        the state is kept and each partition read from its commit, or its start."""
        source = self.source
        commits = {p: source.committed(p) for p in partitions}
        lost = [
            p
            for p, done in self._committed.items()
            if p in commits and (commits[p] or Committed(-1, "")).offset < done
        ]
        self._rebuild_until.clear()
        self._held.clear()
        self._pending = []
        self._done.clear()
        _warn_unless_copartitioned(partitions)
        if lost:
            self._offsets_reset(lost, "the broker lost its commits")
            self.processor.forget_rows()  # cached from the session a failure may have closed
            for partition, commit in commits.items():
                source.seek(
                    partition, source.beginning(partition) if commit is None else commit.offset
                )
            return
        log.debug("rebuilding state partitions=%s", partitions)
        self.processor = self._new_processor()
        for partition in partitions:
            self._rebuild(partition, commits[partition])

    def _process(self, records: list[Record]) -> dict[Partition, Committed]:
        """Process ``records`` up to the first one that opened an incident or changed its
        stage (the rest go to ``_pending``); return the offsets to commit."""
        max_time = time.time() + MAX_FUTURE_S
        self._unflushed = False
        touched: set[Partition] = set()
        self.processor.staged = False
        for index, record in enumerate(records):  # in event-time order, as released
            if self._suspects and _record_id(record) in self._suspects:
                parsed, new = self._process_alone(record, max_time)
            else:
                parsed = self._parsed(record, max_time)
                new = self.processor.process(parsed, self._session) is not None
            if new:
                self._dead_letter(record, parsed)
                self._unflushed = True
            # after processing: the resolver then knows what the correlator learnt
            if record.key is None and record.topic not in self._unkeyed and self._names(parsed):
                self._unkeyed.add(record.topic)
                log.warning(
                    "records without a key topic=%s: correlation is right within this process, "
                    "but scaling out needs records keyed by workload (see detector produce)",
                    record.topic,
                )
            elif (  # keycheck.sampled, inlined: this runs per record
                record.key is not None
                and parsed.signals
                and (not record.offset & SAMPLE_MASK or record.topic not in self._keys.checked)
            ):
                self._check_key(record.topic, record.key, parsed)
            key = (record.topic, record.partition)
            touched.add(key)
            done = self._done.get(key)
            if done is None or record.offset > done.offset:
                self._done[key] = record
            if self.processor.staged:
                self._pending = records[index + 1 :]
                break
        if self._unflushed:
            self._sink.flush()
            self._unflushed = False
        return self._offsets(touched)

    def _parsed(self, record: Record, max_time: float) -> Parsed:
        """Parse ``record``; an isolated one becomes its ``processing_failed`` rejection."""
        why = self._isolated.get(_record_id(record)) if self._isolated else None
        if why is None:
            return _parse(record, max_time)
        source = SourcePos(record.topic, record.offset, record.partition)
        error = ParseError(PROCESSING_FAILED, why)
        return Parsed(max(record.timestamp_ms, 0) / 1000.0, source, record.value, [], error)

    def _process_alone(self, record: Record, max_time: float) -> tuple[Parsed, bool]:
        """Process a record of a batch that failed inside a savepoint of its own.

        When it fails while the store still answers (``SELECT 1``), the record is at fault:
        it is isolated (``_isolated``) and ``Isolated`` raised, so the batch is rolled back,
        the correlator rebuilt without it, and the retry dead-letters it with the error. A
        failing store raises as before: the batch is retried whole and nothing is dead-lettered.
        Returns the parsed record and whether it made a new dead letter.
        """
        savepoint = self._session.begin_nested()
        try:
            parsed = self._parsed(record, max_time)
            new = self.processor.process(parsed, self._session) is not None
        except Exception as exc:
            savepoint.rollback()
            self._session.execute(text("SELECT 1"))  # raises when the store is down
            why = printable(f"{type(exc).__name__}: {str(exc)[:200]}", one_line=True)
            self._isolated[_record_id(record)] = why
            raise Isolated(
                f"topic={record.topic} partition={record.partition} offset={record.offset} "
                f"error={why}"
            ) from exc
        savepoint.commit()
        return parsed, new

    def _check_key(self, topic: str, key: bytes, parsed: Parsed) -> None:
        """Count a sampled keyed record whose key is not its workload (``stream.keycheck``)."""
        resolve = self.processor.correlator.resolver.resolve
        if self._keys.check(topic, key, map(resolve, parsed.signals)):
            self.metrics.key_mismatch.labels(topic).inc()

    def _names(self, parsed: Parsed) -> bool:
        """Tell whether a record names a workload (one of its signals resolves to one)."""
        resolver = self.processor.correlator.resolver
        return any(resolver.resolve(signal) is not None for signal in parsed.signals)

    def _offsets(self, touched: set[Partition]) -> dict[Partition, Committed]:
        """Return the positions to commit: past what was processed, below every held or pending
        record (records leave the buffer in time order, not offset order), never back into a
        rebuild."""
        held = self._held.first_held(self._pending)
        offsets: dict[Partition, Committed] = {}
        for partition in touched:
            record = self._done[partition]
            position, ts_ms = record.offset + 1, record.timestamp_ms
            first = held.get(partition)
            if first is not None and first.offset < position:
                position, ts_ms = first.offset, min(ts_ms, first.timestamp_ms)
            until = self._rebuild_until.get(partition)
            if until is not None and position <= until:
                continue
            self._rebuild_until.pop(partition, None)
            offsets[partition] = Committed(position, f"ts={ts_ms}")
        return offsets

    def _dead_letter(self, record: Record, parsed: Parsed) -> None:
        reason = parsed.error.reason if parsed.error else "unknown"
        headers = [
            ("reason", reason.encode()),
            ("topic", record.topic.encode()),
            ("partition", str(record.partition).encode()),
            ("offset", str(record.offset).encode()),
        ]
        value = record.value
        if len(value) > DEAD_LETTER_MAX_BYTES:
            value, headers = dead_letter_summary(record), [*headers, ("truncated", b"true")]
        self._sink.send(self._settings.kafka.dead_letter_topic, value, headers=headers)
        self.metrics.rejected.labels(record.topic, reason).inc()
        log.info(
            "dead letter topic=%s partition=%d offset=%d reason=%s",
            record.topic, record.partition, record.offset, reason,
        )  # fmt: skip

    def _answer_questions(self) -> None:
        with db.write_turn(self._session, after_others=True):
            self.processor.finish(self._session)
            self._session.commit()
        self._on_commit()
        self._dirty = False
        self._export_coverage(self.processor.coverage)

    def _export_coverage(self, coverage: dict[WorkloadRef, list[SignalCoverage]]) -> None:
        """Export the workloads' signal coverage to ``/metrics`` (open incidents' first)."""
        workloads = self.processor.correlator.workloads
        first = [ref for ref, ws in workloads.items() if ws.incident is not None]
        self.metrics.set_coverage(coverage, first)
        self._coverage_due = time.monotonic() + COVERAGE_EVERY_S

    def _rebuild(self, partition: Partition, committed: Committed | None) -> None:
        if committed is None:  # like auto_offset_reset=earliest
            log.info("no committed offset, reading from start topic=%s partition=%d", *partition)
            self.source.seek(partition, self.source.beginning(partition))
            return
        start = self._rebuild_start(partition, committed)
        self._rebuild_until[partition] = committed.offset
        self.source.seek(partition, start)
        log.info(
            "rebuilding correlator state topic=%s partition=%d from_offset=%d committed=%d",
            *partition, start, committed.offset,
        )  # fmt: skip

    def _rebuild_start(self, partition: Partition, committed: Committed) -> int:
        """Return the offset ``correlate.window_s`` before the committed record's time."""
        kafka = self._settings.kafka
        ts_ms = _metadata_time_ms(committed.metadata)
        found: int | None = None
        if ts_ms is not None:
            target_ms = ts_ms - int(self._settings.correlate.window_s * 1000)
            try:
                found = self.source.offset_for_time(partition, target_ms)
            except StreamError as exc:
                log.warning("offsets_for_times failed topic=%s error=%s", partition[0], exc)
        if found is not None and found <= committed.offset:
            return found
        log.warning(
            "time lookup unusable, re-reading at most %d records of the retained log "
            "topic=%s partition=%d committed=%d",
            kafka.rebuild_max_records, *partition, committed.offset,
        )  # fmt: skip
        return max(self.source.beginning(partition), committed.offset - kafka.rebuild_max_records)

    def _probe_health(self) -> None:
        """Export the store's health (``stream.health``) when due, in a session of its own."""
        if time.monotonic() < self._health_due:
            return
        self._health_due = time.monotonic() + PROBE_EVERY_S
        try:
            with self._make_session() as session:
                self.metrics.set_health(probe(session, datetime.now(UTC)))
        except Exception as exc:  # the loop boundary: any failure means the store is down
            log.warning("store health probe failed error=%s", exc)
            self.metrics.set_health(None)

    def _recover(self, stop: threading.Event) -> None:
        """Roll back, wait (exponential back-off, capped), then re-read from the commits."""
        try:
            self._session.rollback()
            self._session.close()
        except Exception:  # the loop boundary: a dead connection may fail to roll back
            log.exception("rollback failed")
        self._backoff_s = min(
            max(self._backoff_s * 2, BACKOFF_FIRST_S), self._settings.kafka.backoff_max_s
        )
        stop.wait(self._backoff_s)
        self._session = self._make_session()
        try:
            self.on_assign(self._assignment())
        except StreamError as exc:
            log.warning("re-reading after a failure failed error=%s", exc)

    def _assignment(self) -> list[Partition]:
        return [] if self._source is None else self._source.assignment()


def dead_letter_summary(record: Record) -> bytes:
    """Return the dead letter of a record too large to send whole: JSON with its source
    (topic, partition, offset), ``size_bytes``, ``sha256`` (of the whole value, to find it in
    the source topic) and ``first_bytes`` (the first ``SUMMARY_HEAD_BYTES``, decoded as UTF-8
    with replacement characters)."""
    value = record.value
    summary = {
        "dead_letter": "metadata only: the record is too large for the dead-letter topic",
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "size_bytes": len(value),
        "sha256": hashlib.sha256(value).hexdigest(),
        "first_bytes": value[:SUMMARY_HEAD_BYTES].decode("utf-8", "replace"),
    }
    return json.dumps(summary, ensure_ascii=True).encode()


def _warn_unless_copartitioned(partitions: list[Partition]) -> None:
    """Warn when this process owns partition i of one topic but not of another.

    Records are keyed by workload, so a workload's records sit in the same partition number of
    every topic only when the topics have the same partition count; the range assignor then
    gives that number of every topic to one process.
    """
    by_topic: dict[str, set[int]] = {}
    for topic, number in partitions:
        by_topic.setdefault(topic, set()).add(number)
    if len({frozenset(numbers) for numbers in by_topic.values()}) > 1:
        log.warning(
            "topics are not co-partitioned in this process (give every topic the same "
            "partition count): a workload's streams may be split between processes "
            "assignment=%s",
            partitions,
        )


def _parse(record: Record, max_time: float) -> Parsed:
    """Parse one consumed record, timed by its Kafka timestamp when it carries no time."""
    source = SourcePos(record.topic, record.offset, record.partition)
    default_time = record.timestamp_ms / 1000.0 if record.timestamp_ms >= 0 else None
    try:
        signals = parse_checked(record.value, source, default_time=default_time, max_time=max_time)
    except ParseError as exc:
        return Parsed(default_time or 0.0, source, record.value, [], exc)
    return Parsed(signals[0].time if signals else 0.0, source, record.value, signals)


def _metadata_time_ms(metadata: str) -> int | None:
    """Return the record time stored in a commit's metadata (``ts=<ms>``), None if absent."""
    if not metadata.startswith("ts="):
        return None
    try:
        return int(metadata[3:])
    except ValueError:
        return None
