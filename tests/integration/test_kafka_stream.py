"""Live detection from Kafka (Tansu broker): detection, kill -9 and restart, dead letters."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka_helpers import (
    CASCADE,
    STREAMS,
    WAIT_S,
    core_of,
    incidents_in,
    produce,
    start_detector,
    stop,
    unique_prefix,
    wait_committed,
)
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from detector.config import Settings
from detector.incidents import service
from detector.incidents.models import TimelineEntry
from detector.pipeline import replay
from detector.report.document import to_document
from detector.stream.producer import ensure_topics

FIRST_OOM_MS = 1741943017_000  # the cascade's first GPU OOM (its incident key's time)


def _produce_all(bootstrap: str, prefix: str) -> dict[str, int]:
    return {
        f"{prefix}-{suffix}": produce(bootstrap, f"{prefix}-{suffix}", CASCADE / name)
        for name, suffix in STREAMS.items()
    }


def test_live_run_opens_one_incident_with_four_victims(
    kafka_bootstrap: str, sqlite_url: str, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    expected = _produce_all(kafka_bootstrap, prefix)
    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, tmp_path / "run.log")
    try:
        wait_committed(kafka_bootstrap, prefix, expected, proc)
    finally:
        status = stop(proc)
    assert status == 0, (tmp_path / "run.log").read_text()
    incidents = incidents_in(sqlite_url)
    assert len(incidents) == 1
    assert len(incidents[0]["pods"]) == 4
    assert incidents[0]["stage"] in ("cascading", "contained", "resolved")


def test_kill_9_and_restart_lose_nothing_and_duplicate_nothing(
    kafka_bootstrap: str, sqlite_url: str, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    log = tmp_path / "run.log"
    first: dict[str, int] = {}
    for name, suffix in STREAMS.items():  # up to just after the first victim
        topic = f"{prefix}-{suffix}"
        first[topic] = produce(kafka_bootstrap, topic, CASCADE / name, before_ms=FIRST_OOM_MS + 1)
    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, log)
    try:
        wait_committed(kafka_bootstrap, prefix, first, proc, at_least_one=True)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=WAIT_S)
    total = {
        f"{prefix}-{suffix}": first[f"{prefix}-{suffix}"]
        + produce(kafka_bootstrap, f"{prefix}-{suffix}", CASCADE / name,
                  skip=first[f"{prefix}-{suffix}"])
        for name, suffix in STREAMS.items()
    }  # fmt: skip
    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, log)
    try:
        wait_committed(kafka_bootstrap, prefix, total, proc)
    finally:
        assert stop(proc) == 0, log.read_text()
    live = incidents_in(sqlite_url)
    settings = Settings()
    settings.database.url = f"sqlite:///{tmp_path / 'replay.db'}"
    straight = to_document(replay([CASCADE], settings))["incidents"]
    assert len(live) == 1, [i["key"] for i in live]
    assert core_of(live[0]) == core_of(straight[0])
    entries = [(t["time"], t["kind"], t["message"]) for t in live[0]["timeline"]]
    assert len(entries) == len(set(entries))
    engine = create_engine(sqlite_url)
    with Session(engine) as session:  # one row per dedupe key, however often re-processed
        rows = session.scalar(select(func.count()).select_from(TimelineEntry))
    engine.dispose()
    assert rows == len(live[0]["timeline"])


def test_poisoned_record_lands_in_dead_letter_topic_and_table(
    kafka_bootstrap: str, sqlite_url: str, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    topic = f"{prefix}-k8s-logs"
    poisoned = tmp_path / "poisoned.jsonl"
    good = (CASCADE / "container-logs.jsonl").read_bytes().splitlines()[:3]
    deep = b"[" * 100_000 + b"]" * 100_000  # past the JSON decoder's recursion limit
    bad = [b'{"log": "CUDA out of mem', b'{"log": "\xff\xfe CUDA out of memory"}', deep]
    poisoned.write_bytes(b"\n".join([good[0], *bad, good[1]]) + b"\n")
    sent = produce(kafka_bootstrap, topic, poisoned)
    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, tmp_path / "run.log", [topic])
    try:
        wait_committed(kafka_bootstrap, prefix, {topic: sent}, proc)
    finally:
        assert stop(proc) == 0
    engine = create_engine(sqlite_url)
    with Session(engine) as session:
        letters = service.list_dead_letters(session=session)
        rows = sorted(
            (d.source_origin, d.source_partition, d.source_position, d.reason) for d in letters
        )
    engine.dispose()
    assert rows == [
        (topic, 0, 1, "malformed_json"),
        (topic, 0, 2, "not_utf8"),
        (topic, 0, 3, "malformed_json"),
    ]
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000
    )
    dlt = TopicPartition(f"{prefix}-dead-letters", 0)
    consumer.assign([dlt])
    consumer.seek_to_beginning(dlt)
    record = next(iter(consumer))
    consumer.close()
    headers = {k: v.decode() for k, v in record.headers}
    assert record.value == b'{"log": "CUDA out of mem'
    assert headers == {"reason": "malformed_json", "topic": topic, "partition": "0", "offset": "1"}


def test_records_of_10_mib_are_dead_lettered_as_metadata_and_the_stream_goes_on(
    kafka_bootstrap: str, sqlite_url: str, tmp_path: Path
) -> None:
    """Two 10 MiB records between good ones: each is dead-lettered (too_large), the topic
    gets its metadata (they are over the producer's and the broker's 1 MiB), nothing stalls."""
    prefix = unique_prefix()
    topic = f"{prefix}-k8s-logs"
    ensure_topics(kafka_bootstrap, [topic])
    good = (CASCADE / "container-logs.jsonl").read_bytes().splitlines()[:3]
    huge = b'{"log": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=32 * 1024**2)
    for value in (good[0], huge, good[1], huge, good[2]):
        producer.send(topic, value)
    producer.flush()
    producer.close()
    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, tmp_path / "run.log", [topic])
    try:
        wait_committed(kafka_bootstrap, prefix, {topic: 5}, proc)
    finally:
        assert stop(proc) == 0, (tmp_path / "run.log").read_text()[-3000:]
    engine = create_engine(sqlite_url)
    with Session(engine) as session:
        letters = service.list_dead_letters(session=session)
        rows = sorted((d.source_position, d.reason) for d in letters)
    engine.dispose()
    assert rows == [(1, "too_large"), (3, "too_large")]
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000
    )
    dlt = TopicPartition(f"{prefix}-dead-letters", 0)
    consumer.assign([dlt])
    consumer.seek_to_beginning(dlt)
    sent = list(consumer)
    consumer.close()
    assert len(sent) == 2
    for record, offset in zip(sent, (1, 3), strict=True):
        summary = json.loads(record.value)
        assert summary["size_bytes"] == len(huge) and summary["offset"] == offset
        assert summary["sha256"] == hashlib.sha256(huge).hexdigest()
        assert summary["first_bytes"].startswith('{"log": "xxx')
        assert dict(record.headers)["truncated"] == b"true"
