"""The live loop tells when a topic's keys are not the workload its records name.

Keys as ``detector produce`` writes them (``stream.app.keyed_records``: ``namespace/workload``)
match; kubernetes-event-exporter's Kafka sink keys each Event by its uid
(https://github.com/resmoio/kubernetes-event-exporter/blob/master/pkg/sinks/kafka.go,
``Key: sarama.StringEncoder(string(ev.UID))``), which splits a workload between consumers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from test_stream_loop import FakeSink, FakeSource

from detector import db
from detector.config import Settings
from detector.correlate.identity import WorkloadRef
from detector.stream.app import keyed_records
from detector.stream.consumer import Record
from detector.stream.keycheck import SAMPLE_EVERY, KeyCheck
from detector.stream.loop import StreamLoop

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
VLLM = WorkloadRef("llm", "vllm-llama")


@pytest.fixture
def loop(sqlite_url: str) -> Iterator[StreamLoop]:
    db.upgrade(sqlite_url)
    settings = Settings()
    settings.database.url = sqlite_url
    engine = db.make_engine(sqlite_url)
    yield StreamLoop(settings, db.session_factory(engine), FakeSink())
    engine.dispose()


def _events(keyed_by_uid: bool, copies: int = 1) -> list[Record]:
    """The bundled cascade's Events that name a workload, ``copies`` times, on topic
    ``events`` at offsets 0, 1, ..., keyed as ``detector produce`` or the exporter key them."""
    named = [
        (key, value, ts or 0)
        for key, value, ts in keyed_records([CASCADE / "k8s-events.jsonl"], Settings())
        if key is not None
    ]
    out = []
    for offset, (key, value, ts) in enumerate(named * copies):
        if keyed_by_uid:
            key = json.loads(value)["metadata"]["uid"].encode()
        out.append(Record("events", 0, offset, ts, key, value))
    return out


def _mismatches(loop: StreamLoop) -> str:
    exposition = generate_latest(loop.metrics.registry).decode()
    return "\n".join(
        x for x in exposition.splitlines() if x.startswith("detector_key_mismatch_total")
    )


def test_keys_written_by_workload_raise_nothing(
    loop: StreamLoop, caplog: pytest.LogCaptureFixture
) -> None:
    records = _events(keyed_by_uid=False)
    assert {r.key for r in records} >= {b"llm/vllm-llama"}
    loop.attach(FakeSource([records]))
    loop.step()
    assert _mismatches(loop) == ""
    assert "record key does not name its workload" not in caplog.text


def test_keys_by_event_uid_are_counted_and_logged_once(
    loop: StreamLoop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    records = _events(keyed_by_uid=True, copies=10)
    assert len(records) > 3 * SAMPLE_EVERY
    loop.attach(FakeSource([records]))
    loop.step()
    # every record names a workload: the sample is each offset that is a multiple of 64
    expected = len([r for r in records if r.offset % SAMPLE_EVERY == 0])
    assert _mismatches(loop) == f'detector_key_mismatch_total{{topic="events"}} {expected}.0'
    assert caplog.text.count("record key does not name its workload topic=events") == 1


def test_a_topic_is_checked_record_by_record_until_one_names_a_workload() -> None:
    check = KeyCheck()
    assert not check.check("logs", b"x", [None]) and "logs" not in check.checked
    assert check.check("logs", b"other/one", [VLLM]) and check.checked == {"logs"}


def test_a_key_matching_any_workload_of_a_record_is_no_mismatch() -> None:
    check = KeyCheck()
    other = WorkloadRef("default", "web-frontend")
    assert not check.check("lb", b"llm/vllm-llama", [other, None, VLLM])
    assert check.check("lb", b"llm/vllm-llama-8000", [VLLM])


def test_the_logged_key_is_escaped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert KeyCheck().check("t", b"\x1b[31mred", [VLLM])
    assert "\x1b" not in caplog.text and "red" in caplog.text
