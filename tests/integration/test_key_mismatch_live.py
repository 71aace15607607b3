"""``detector run`` on the real broker tells which topic's keys are not its workloads.

The bundled cascade's four streams are produced as ``detector produce`` keys them
(``namespace/workload``), except the Events, keyed by their uid as kubernetes-event-exporter's
Kafka sink keys them
(https://github.com/resmoio/kubernetes-event-exporter/blob/master/pkg/sinks/kafka.go). The
detector's ``/metrics`` must count mismatches on the Events topic only, and its log say so once.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

from kafka_helpers import (
    CASCADE,
    STREAMS,
    produce,
    start_detector,
    stop,
    unique_prefix,
    wait_committed,
)

from detector.config import Settings
from detector.stream.app import keyed_records
from detector.stream.producer import KafkaSink, ensure_topics


def _produce_keyed_by_uid(bootstrap: str, topic: str, path: Path) -> int:
    ensure_topics(bootstrap, [topic])
    sink = KafkaSink(bootstrap)
    try:
        sent = 0
        for _, value, ts in keyed_records([path], Settings()):
            uid = json.loads(value)["metadata"]["uid"].encode()
            sink.send(topic, value, key=uid, timestamp_ms=ts)
            sent += 1
        sink.flush()
    finally:
        sink.close()
    return sent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_topic_keyed_by_event_uid_is_counted_on_metrics(
    kafka_bootstrap: str, sqlite_url: str, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    expected = {}
    for name, suffix in STREAMS.items():
        topic = f"{prefix}-{suffix}"
        if suffix == "k8s-events":
            expected[topic] = _produce_keyed_by_uid(kafka_bootstrap, topic, CASCADE / name)
        else:
            expected[topic] = produce(kafka_bootstrap, topic, CASCADE / name)
    port = _free_port()
    log = tmp_path / "run.log"
    proc = start_detector(
        kafka_bootstrap, prefix, sqlite_url, log, extra=("-v", "--metrics-port", str(port))
    )
    try:
        wait_committed(kafka_bootstrap, prefix, expected, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            exposition = response.read().decode()
    finally:
        status = stop(proc)
    assert status == 0, log.read_text()
    counted = dict(re.findall(r'detector_key_mismatch_total\{topic="([^"]+)"\} (\S+)', exposition))
    assert set(counted) == {f"{prefix}-k8s-events"}, counted
    assert float(counted[f"{prefix}-k8s-events"]) >= 1
    text = log.read_text()
    assert text.count(f"record key does not name its workload topic={prefix}-k8s-events") == 1
