"""A broker that lost its data mid-cascade (Tansu on memory, restarted on the same port):
topics, records and committed offsets are gone while the detector keeps running."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from kafka_helpers import (
    CASCADE,
    STREAMS,
    incidents_in,
    produce,
    start_detector,
    stop,
    unique_prefix,
    wait_committed,
    wait_consumed,
)

from detector.lab.broker import start_tansu
from detector.lab.recording import DEATHS

SECOND_DEATH_MS = int((1741943017 + DEATHS[1] - DEATHS[0]) * 1000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_cascade_across_a_broker_that_lost_its_data_stays_one_incident(
    sqlite_url: str, tmp_path: Path
) -> None:
    """It was split in two incidents, the first wrongly ``contained``."""
    port = free_port()
    broker, bootstrap = start_tansu(30.0, port=port)
    prefix, log = unique_prefix(), tmp_path / "run.log"
    metrics_port = free_port()
    first: dict[str, int] = {}
    proc = None
    try:
        for name, suffix in STREAMS.items():  # up to just after the second victim
            topic = f"{prefix}-{suffix}"
            first[topic] = produce(bootstrap, topic, CASCADE / name, before_ms=SECOND_DEATH_MS + 1)
        proc = start_detector(bootstrap, prefix, sqlite_url, log,
                              extra=("-v", "--metrics-port", str(metrics_port)))  # fmt: skip
        wait_committed(bootstrap, prefix, first, proc)
        broker.kill()
        broker.wait(timeout=10)
        broker, _ = start_tansu(30.0, port=port)  # empty: its storage was memory
        rest = {
            f"{prefix}-{suffix}": produce(bootstrap, f"{prefix}-{suffix}", CASCADE / name,
                                          skip=first[f"{prefix}-{suffix}"])
            for name, suffix in STREAMS.items()
        }  # fmt: skip
        # the detector's consumer may create the new topics first, with the broker's default
        # partition count: count the commits over every partition
        wait_consumed(bootstrap, prefix, rest, 4, [proc])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as answer:
            exposition = answer.read().decode()
    finally:
        if proc is not None:
            assert stop(proc) == 0, log.read_text()
        broker.kill()
        broker.wait(timeout=10)
    incidents = incidents_in(sqlite_url)
    assert [len(i["pods"]) for i in incidents] == [4], [(i["key"], i["stage"]) for i in incidents]
    assert "detector_offset_resets_total" in exposition
    assert "offsets went back" in log.read_text()
