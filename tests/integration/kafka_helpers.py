"""Helpers of the Kafka tests: produce the recordings, run the detector, wait for commits."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from detector.config import Settings
from detector.stream.app import keyed_records
from detector.stream.producer import KafkaSink, ensure_topics

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
STREAMS = {  # recorded file -> topic suffix
    "container-logs.jsonl": "k8s-logs",
    "k8s-events.jsonl": "k8s-events",
    "lb-access.jsonl": "lb-logs",
    "gpu-metrics.jsonl": "gpu-metrics",
}
WAIT_S = 60.0  # bound on every wait, so that no test hangs


def unique_prefix() -> str:
    """Return a fresh topic and group prefix for one test."""
    return f"t{uuid.uuid4().hex[:10]}"


def topics_of(prefix: str) -> list[str]:
    """Return the four stream topics of a test."""
    return [f"{prefix}-{suffix}" for suffix in STREAMS.values()]


def produce(
    bootstrap: str, topic: str, path: Path, *, before_ms: int | None = None, skip: int = 0
) -> int:
    """Produce the records of ``path`` (from number ``skip``; before ``before_ms``); count."""
    ensure_topics(bootstrap, [topic])
    sink = KafkaSink(bootstrap)
    sent = 0
    try:
        for i, (key, value, ts) in enumerate(keyed_records([path], Settings())):
            if i < skip:
                continue
            if before_ms is not None and ts is not None and ts >= before_ms:
                break
            sink.send(topic, value, key=key, timestamp_ms=ts)
            sent += 1
        sink.flush()
    finally:
        sink.close()
    return sent


def start_detector(
    bootstrap: str, prefix: str, db_url: str, log_path: Path, topics: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``detector run`` as a subprocess on the test's topics and group."""
    args = [
        sys.executable, "-m", "detector", "run", "-v",
        "--db", db_url,
        "--bootstrap", bootstrap,
        "--topics", ",".join(topics or topics_of(prefix)),
        "--group", f"{prefix}-group",
        "--dead-letter-topic", f"{prefix}-dead-letters",
        "--fetch-max-wait-ms", "20",
        "--session-timeout-ms", "6000",
        "--max-poll-interval-ms", "10000",
        "--max-poll-records", "100",
    ]  # fmt: skip
    with log_path.open("ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def committed(bootstrap: str, group: str, partitions: list[TopicPartition]) -> dict[str, int]:
    """Return the group's committed offsets by topic (-1 when none)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {tp.topic: consumer.committed(tp) or -1 for tp in partitions}
    finally:
        consumer.close()


def wait_committed(
    bootstrap: str,
    prefix: str,
    expected: dict[str, int],
    proc: subprocess.Popen[bytes],
    *,
    at_least_one: bool = False,
) -> dict[str, int]:
    """Wait until the group committed ``expected`` offsets (or any offset); return them.

    Raises AssertionError when the detector exits or ``WAIT_S`` passes first.
    """
    partitions = [TopicPartition(t, 0) for t in expected]
    deadline = time.monotonic() + WAIT_S
    while True:
        assert proc.poll() is None, f"detector exited with {proc.returncode}"
        got = committed(bootstrap, f"{prefix}-group", partitions)
        if at_least_one and any(v > 0 for v in got.values()):
            return got
        if not at_least_one and all(got[t] >= n for t, n in expected.items()):
            return got
        assert time.monotonic() < deadline, f"offsets {got}, expected {expected}"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> int:
    """Stop the detector with SIGTERM and return its exit status."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
