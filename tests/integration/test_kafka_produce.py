"""`detector produce` of a recorded folder (Tansu broker): each file on its stream's topic, keyed
by workload, merged in event time, so that a live `detector run` stores what a replay stores.

Issue 16, item 1: produced file by file to topics of different partition counts, the live
incident differed from the replay and `run` warned about its own producer's records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition
from kafka_helpers import (
    CASCADE,
    STREAMS,
    WAIT_S,
    core_of,
    incidents_in,
    start_detector,
    stop,
    topics_of,
    unique_prefix,
    wait_assigned,
    wait_consumed,
)

from detector.config import Settings
from detector.pipeline import replay
from detector.report.document import to_document

PARTITIONS = 2
WORKLOAD = b"llm/vllm-llama"


def _lines(path: Path) -> list[bytes]:
    return sorted(line for line in path.read_bytes().splitlines() if line.strip())


def _read_topic(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes | None, bytes]]:
    """Return ``(partition, key, value)`` of the first ``count`` records of every partition."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        out: list[tuple[int, bytes | None, bytes]] = []
        deadline = time.monotonic() + WAIT_S
        while len(out) < count and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                out.extend((tp.partition, r.key, r.value) for r in records)
        return out
    finally:
        consumer.close()


def test_produce_places_each_file_keyed_and_live_equals_replay(
    kafka_bootstrap: str, sqlite_url: str, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    topics = topics_of(prefix)  # the order of DETECTOR_KAFKA__TOPICS: logs, events, lb, metrics
    log = tmp_path / "run.log"
    # default log level: the configuration and the assignment are logged without -v
    proc = start_detector(
        kafka_bootstrap, prefix, sqlite_url, log, extra=("--partitions", str(PARTITIONS))
    )
    try:
        wait_assigned([log], len(topics) * PARTITIONS, [proc])  # run created the four topics
        # live, as the README's walkthrough: paced in event time (20x: 27 s), 3 partitions
        # asked but the topics run created have 2, which win
        produced = subprocess.run(
            [sys.executable, "-m", "detector", "produce", str(CASCADE),
             "--bootstrap", kafka_bootstrap, "--partitions", "3", "--speed", "20"],
            env={**os.environ, "DETECTOR_KAFKA__TOPICS": json.dumps(topics)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stderr
        expected = {f"{prefix}-{suffix}": len(_lines(CASCADE / n)) for n, suffix in STREAMS.items()}
        assert sorted(produced.stdout.splitlines()) == sorted(
            f"produced {n} records to {topic}" for topic, n in expected.items()
        )
        wait_consumed(kafka_bootstrap, prefix, expected, PARTITIONS, [proc])
    finally:
        status = stop(proc)
    text = log.read_text()
    assert status == 0, text
    assert f"starting broker={kafka_bootstrap} topics={','.join(topics)}" in text
    assert f"group={prefix}-group" in text and "store=sqlite:///" in text
    assert "dry_run=True" in text and "slack=off" in text and "metrics_port=off" in text
    assert "partitions assigned partitions=" in text
    assert "records without a key" not in text and "not co-partitioned" not in text, text

    workload_partitions = set()
    for name, suffix in STREAMS.items():
        topic = f"{prefix}-{suffix}"
        records = _read_topic(kafka_bootstrap, topic, expected[topic])
        assert sorted(value for _, _, value in records) == _lines(CASCADE / name), topic
        assert {p for p, _, _ in records} <= set(range(PARTITIONS))
        workload_partitions |= {p for p, key, _ in records if key == WORKLOAD}
    assert len(workload_partitions) == 1  # one workload: one partition number on every topic

    settings = Settings()
    settings.database.url = f"sqlite:///{tmp_path / 'replay.db'}"
    straight = to_document(replay([CASCADE], settings))["incidents"]
    live = incidents_in(sqlite_url)
    assert [core_of(i) for i in live] == [core_of(i) for i in straight]
    assert [s["params"] for s in live[0]["steps"]] == [s["params"] for s in straight[0]["steps"]]
