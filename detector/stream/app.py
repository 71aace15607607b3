"""Build and run the live loop; ship recorded files to Kafka keyed by workload."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from detector import db
from detector.config import Settings, load_workload_map
from detector.correlate.identity import WorkloadResolver
from detector.errors import ConfigError, ParseError
from detector.events.detect import parse_record
from detector.events.model import Signal, SourcePos
from detector.events.reader import iter_files, read_records
from detector.events.streams import Stream, file_stream
from detector.notify.senders import workers
from detector.notify.slack.notifier import Notifier
from detector.stream.consumer import KafkaSource, Partition
from detector.stream.loop import StreamLoop
from detector.stream.producer import KafkaSink, ensure_topics

log = logging.getLogger(__name__)


def run_stream(settings: Settings, stop: threading.Event) -> None:
    """Consume ``settings.kafka.topics`` until ``stop`` is set (see ``detector.stream.loop``).

    Raises StoreError (migrations), StreamError (broker unreachable), ConfigError/RunbookError.
    """
    kafka = settings.kafka
    db.upgrade(settings.database.url)
    engine = db.make_engine(settings.database.url)
    sink = KafkaSink(kafka.bootstrap_servers, bootstrap_timeout_ms=kafka.bootstrap_timeout_ms)
    make_session = db.session_factory(engine)
    notifier = Notifier(settings, make_session) if settings.slack.enabled else None
    events = workers(settings, make_session)  # PagerDuty, Grafana: when configured

    def on_commit() -> None:
        if notifier is not None:
            notifier.wake()
        for worker in events:
            worker.wake()

    try:
        ensure_topics(
            kafka.bootstrap_servers,
            [*kafka.topics, kafka.dead_letter_topic],
            kafka.partitions,
            like=kafka.topics,
            bootstrap_timeout_ms=kafka.bootstrap_timeout_ms,
        )
        _log_configuration(settings)  # once the store and the broker answered
        loop = StreamLoop(settings, make_session, sink, on_commit=on_commit)
        if notifier is not None:
            notifier.start()
            log.info("notifying slack channel=%s", settings.slack.channel or "per namespace")
        for worker in events:
            worker.start()
            log.info("sending outbox events worker=%s", worker.name)
        if kafka.metrics_port:
            loop.metrics.serve(kafka.metrics_port)
            log.info("serving /metrics port=%d", kafka.metrics_port)

        def on_assign(partitions: list[Partition]) -> None:
            log.info("partitions assigned partitions=%s", partitions)
            loop.on_assign(partitions)

        source = KafkaSource(kafka, on_assign)
        loop.attach(source)
        try:
            loop.run(stop)
        finally:
            source.close()
    finally:
        if notifier is not None:
            notifier.stop()
        for worker in events:
            worker.stop()
        sink.close()
        engine.dispose()


def _log_configuration(settings: Settings) -> None:
    """Log, in one line, what this ``detector run`` process is about to do."""
    kafka, slack = settings.kafka, settings.slack
    log.info(
        "starting broker=%s topics=%s group=%s dead_letter_topic=%s store=%s dry_run=%s "
        "armed=%s kill_switch=%s slack=%s metrics_port=%s",
        kafka.bootstrap_servers, ",".join(kafka.topics), kafka.group_id, kafka.dead_letter_topic,
        db.redact(settings.database.url), settings.dry_run,
        ",".join(settings.containment.armed_workloads) or "none",
        settings.containment.kill_switch,
        f"on channel={slack.channel or 'per namespace'}" if slack.enabled else "off",
        kafka.metrics_port or "off",
    )  # fmt: skip


def keyed_records(
    paths: list[Path], settings: Settings
) -> Iterator[tuple[bytes | None, bytes, int | None]]:
    """Yield ``(key, value, timestamp_ms)`` for every record of the files, in file order.

    The key is ``namespace/workload`` of the record's first attributable signal (None when it
    names no workload) and the timestamp its event time in ms. A record that yields no signal
    (most log lines) has no time of its own here: it takes the time of the file's timed record
    before it, or of the first timed record after it at the start of a file (None when the file
    has none), so that no record is stamped with the wall clock in the middle of event time.
    """
    resolver = WorkloadResolver(load_workload_map(settings.workloads_file), settings.cluster)
    for path in iter_files(paths):
        yield from _keyed_file(path, resolver)


def _keyed_file(
    path: Path, resolver: WorkloadResolver
) -> Iterator[tuple[bytes | None, bytes, int | None]]:
    """Yield one file's records as ``keyed_records`` does."""
    previous_ms: int | None = None
    untimed: list[tuple[bytes | None, bytes]] = []  # before the file's first timed record
    for source, raw in read_records([path]):
        key, timestamp_ms = _key_and_time(resolver, source, raw)
        if timestamp_ms is None and previous_ms is None:
            untimed.append((key, raw))
            continue
        previous_ms = timestamp_ms if timestamp_ms is not None else previous_ms
        for early_key, early_raw in untimed:
            yield early_key, early_raw, previous_ms
        untimed.clear()
        yield key, raw, previous_ms
    for early_key, early_raw in untimed:
        yield early_key, early_raw, None


def _key_and_time(
    resolver: WorkloadResolver, source: SourcePos, raw: bytes
) -> tuple[bytes | None, int | None]:
    try:
        signals = parse_record(raw, source)
    except ParseError:
        return None, None
    stamp = int(signals[0].time * 1000) if signals else None
    for signal in signals:
        ref = resolver.resolve(signal)
        if ref is not None:
            return f"{ref.namespace}/{ref.name}".encode(), stamp
    return None, stamp


CLASSIFY_RECORDS = 2000  # records of a file read to tell its stream


def file_topics(paths: list[Path], topics: list[str]) -> dict[Path, str]:
    """Return the topic of each file: ``topics`` (``kafka.topics``) at the file's stream.

    The stream is what most of the file's first ``CLASSIFY_RECORDS`` records are, as
    ``detector.events.streams.file_stream`` tells it from their parsed signals. Raises
    ConfigError naming the file and ``--topic`` when no record of a file gave a signal, or when
    ``topics`` is not the four streams; FileNotFoundError for a missing path.
    """
    placed: dict[Path, str] = {}
    for path in iter_files(paths):
        signals = (
            _signals(source, raw)
            for source, raw in itertools.islice(read_records([path]), CLASSIFY_RECORDS)
        )
        stream = file_stream(signals)
        if stream is None:
            raise ConfigError(
                f"cannot tell which topic {path} belongs to (none of its first "
                f"{CLASSIFY_RECORDS} records is in a known format with a signal): give --topic"
            )
        if len(topics) != len(Stream):
            raise ConfigError(
                f"{len(topics)} topics configured, not the four streams (logs, events, "
                f"load balancer, metrics): give --topic for {path}"
            )
        placed[path] = topics[stream]
    return placed


def _signals(source: SourcePos, raw: bytes) -> list[Signal]:
    try:
        return parse_record(raw, source)
    except ParseError:
        return []


def merged_records(
    files: dict[Path, str], settings: Settings
) -> Iterator[tuple[str, bytes | None, bytes, int | None]]:
    """Yield ``(topic, key, value, timestamp_ms)`` of every file merged by event time.

    Each file keeps its order (``keyed_records``); files are merged as ``replay`` merges them
    (ties in file order), and one workload resolver sees them in that order, as the live loop
    will. Records with no time at all come first.
    """
    resolver = WorkloadResolver(load_workload_map(settings.workloads_file), settings.cluster)
    streams = [_on_topic(topic, _keyed_file(path, resolver)) for path, topic in files.items()]
    return heapq.merge(*streams, key=_record_time)


def _on_topic(
    topic: str, records: Iterator[tuple[bytes | None, bytes, int | None]]
) -> Iterator[tuple[str, bytes | None, bytes, int | None]]:
    for key, value, timestamp_ms in records:
        yield topic, key, value, timestamp_ms


def _record_time(record: tuple[str, bytes | None, bytes, int | None]) -> int:
    return -1 if record[3] is None else record[3]


def produce_files(
    files: dict[Path, str],
    settings: Settings,
    *,
    rate_per_s: float | None = None,
    speed: float | None = None,
) -> dict[str, int]:
    """Ship recorded files to their topics, merged by event time; return records per topic.

    ``files`` maps each file to its topic (``file_topics``). Missing topics are created with
    the partition count of the existing stream topics (``kafka.partitions`` when none exists).
    ``rate_per_s`` paces the records by count, ``speed`` by their event time (1.0: as
    recorded; 10.0: ten times faster); neither: as fast as the broker takes them. Raises
    StreamError when the broker fails, FileNotFoundError for a missing path.
    """
    kafka = settings.kafka
    bootstrap, timeout_ms = kafka.bootstrap_servers, kafka.bootstrap_timeout_ms
    targets = list(dict.fromkeys(files.values()))
    ensure_topics(
        bootstrap, targets, kafka.partitions, like=kafka.topics, bootstrap_timeout_ms=timeout_ms
    )
    sink = KafkaSink(bootstrap, bootstrap_timeout_ms=timeout_ms)
    sent = dict.fromkeys(targets, 0)
    pace = _Pace(rate_per_s, speed)
    try:
        for topic, key, value, timestamp_ms in merged_records(files, settings):
            pace.wait(timestamp_ms)
            sink.send(topic, value, key=key, timestamp_ms=timestamp_ms)
            sent[topic] += 1
        sink.flush()
    finally:
        sink.close()
    log.info("produced records=%s", sent)
    return sent


class _Pace:
    """Sleep between records: by count (``rate_per_s``) or by event time (``speed``)."""

    def __init__(self, rate_per_s: float | None, speed: float | None) -> None:
        self._rate, self._speed = rate_per_s, speed
        self._started = time.monotonic()
        self._count = 0
        self._first_ms: int | None = None

    def wait(self, timestamp_ms: int | None) -> None:
        """Sleep until the next record is due."""
        if not (self._rate or self._speed):
            return
        due = self._started
        if self._rate:
            due += self._count / self._rate
        elif self._speed and timestamp_ms is not None:
            if self._first_ms is None:
                self._first_ms = timestamp_ms
            due += (timestamp_ms - self._first_ms) / 1000.0 / self._speed
        self._count += 1
        time.sleep(max(0.0, due - time.monotonic()))
