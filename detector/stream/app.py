"""Build and run the live loop; ship recorded files to Kafka keyed by workload."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from detector import db
from detector.config import Settings, load_workload_map
from detector.correlate import forecast
from detector.correlate.identity import WorkloadResolver
from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import SourcePos
from detector.events.reader import iter_files, read_records
from detector.notify.slack.notifier import Notifier
from detector.stream.consumer import KafkaSource
from detector.stream.loop import StreamLoop
from detector.stream.producer import KafkaSink, ensure_topics

log = logging.getLogger(__name__)


def run_stream(settings: Settings, stop: threading.Event) -> None:
    """Consume ``settings.kafka.topics`` until ``stop`` is set (see ``detector.stream.loop``).

    Raises StoreError (migrations), StreamError (broker unreachable), ConfigError/RunbookError.
    """
    kafka = settings.kafka
    db.upgrade(settings.database.url)
    forecast.preload()  # not on the first incident's forecast: a second of imports
    engine = db.make_engine(settings.database.url)
    sink = KafkaSink(kafka.bootstrap_servers, bootstrap_timeout_ms=kafka.bootstrap_timeout_ms)
    make_session = db.session_factory(engine)
    notifier = Notifier(settings, make_session) if settings.slack.enabled else None
    try:
        ensure_topics(
            kafka.bootstrap_servers,
            [kafka.dead_letter_topic],
            bootstrap_timeout_ms=kafka.bootstrap_timeout_ms,
        )
        loop = StreamLoop(settings, make_session, sink,
                          on_commit=notifier.wake if notifier else lambda: None)  # fmt: skip
        if notifier is not None:
            notifier.start()
            log.info("notifying slack channel=%s", settings.slack.channel or "per namespace")
        if kafka.metrics_port:
            loop.metrics.serve(kafka.metrics_port)
            log.info("serving /metrics port=%d", kafka.metrics_port)
        source = KafkaSource(kafka, loop.on_assign)
        loop.attach(source)
        log.info("consuming topics=%s group=%s", kafka.topics, kafka.group_id)
        try:
            loop.run(stop)
        finally:
            source.close()
    finally:
        if notifier is not None:
            notifier.stop()
        sink.close()
        engine.dispose()


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


def produce_files(
    paths: list[Path], topic: str, settings: Settings, *, rate_per_s: float | None = None
) -> int:
    """Ship recorded files to ``topic`` record by record; return how many were sent.

    ``rate_per_s`` paces the records (None: as fast as the broker takes them). Raises
    StreamError when the broker fails, FileNotFoundError for a missing path.
    """
    bootstrap, timeout_ms = settings.kafka.bootstrap_servers, settings.kafka.bootstrap_timeout_ms
    ensure_topics(bootstrap, [topic], bootstrap_timeout_ms=timeout_ms)
    sink = KafkaSink(bootstrap, bootstrap_timeout_ms=timeout_ms)
    sent = 0
    started = time.monotonic()
    try:
        for key, value, timestamp_ms in keyed_records(paths, settings):
            sink.send(topic, value, key=key, timestamp_ms=timestamp_ms)
            sent += 1
            if rate_per_s:
                time.sleep(max(0.0, started + sent / rate_per_s - time.monotonic()))
        sink.flush()
    finally:
        sink.close()
    log.info("produced topic=%s records=%d", topic, sent)
    return sent
