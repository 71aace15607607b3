"""The live loop with a fake consumer and producer: order, offsets, dead letters, failures."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from sqlalchemy import select
from sqlalchemy.orm import Session

from detector import db
from detector.config import Settings
from detector.correlate.state import IncidentOpened, StageChanged
from detector.errors import StoreError
from detector.incidents import service
from detector.pipeline import Batch, Parsed, Processor
from detector.stream.consumer import Committed, Partition, Record
from detector.stream.loop import StreamLoop
from detector.stream.metrics import LoopMetrics
from detector.stream.producer import Headers

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"


class FakeSource:
    """Hands out prepared batches and records what the loop commits."""

    def __init__(
        self, batches: list[list[Record]], lags: list[dict[Partition, int]] | None = None
    ) -> None:
        self.batches = batches
        self.lags = lags or []  # the lag reported after each poll (default: caught up)
        self.commits: list[dict[Partition, Committed]] = []

    def poll(self, timeout_ms: int) -> list[Record]:
        caught_up = dict.fromkeys(self.assignment(), 0)
        self.lag_now = caught_up | (self.lags.pop(0) if self.lags else {})
        return self.batches.pop(0) if self.batches else []

    def commit(self, offsets: dict[Partition, Committed]) -> None:
        self.commits.append(offsets)

    def committed(self, partition: Partition) -> Committed | None:
        return None

    def offset_for_time(self, partition: Partition, timestamp_ms: int) -> int | None:
        return None

    def beginning(self, partition: Partition) -> int:
        return 0

    def seek(self, partition: Partition, offset: int) -> None:
        pass

    def assignment(self) -> list[Partition]:
        return [("logs", 0), ("logs", 3), ("lb", 0)]

    def lag(self) -> dict[Partition, int]:
        return self.lag_now


class FakeSink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, Headers | None]] = []

    def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.sent.append((topic, value, headers))

    def flush(self, timeout_s: float = 30.0) -> None:
        pass


def records(topic: str, path: Path, limit: int) -> list[Record]:
    out = []
    for offset, line in enumerate(path.read_bytes().splitlines()[:limit]):
        ts = int(json.loads(line).get("@timestamp", 0) * 1000)
        out.append(Record(topic, 0, offset, ts, None, line))
    return out


def _dead_letters(url: str) -> list[Any]:
    """Return the dead letters stored at ``url``."""
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            return list(service.list_dead_letters(session=session))
    finally:
        engine.dispose()


@pytest.fixture
def loop_parts(sqlite_url: str) -> Iterator[tuple[Settings, StreamLoop, FakeSink]]:
    db.upgrade(sqlite_url)
    settings = Settings()
    settings.database.url = sqlite_url
    engine = db.make_engine(sqlite_url)
    sink = FakeSink()
    yield settings, StreamLoop(settings, db.session_factory(engine), sink), sink
    engine.dispose()


def test_a_batch_is_committed_per_partition_after_the_database(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
) -> None:
    _, loop, sink = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 300)
    lb = records("lb", CASCADE / "lb-access.jsonl", 300)
    poison = Record("logs", 0, 300, logs[-1].timestamp_ms, None, b'{"log": "cut')
    source = FakeSource([[*reversed(lb), *logs, poison]])
    loop.attach(source)
    assert loop.step() == 601
    assert source.commits == [
        {
            ("lb", 0): Committed(300, f"ts={lb[-1].timestamp_ms}"),
            ("logs", 0): Committed(301, f"ts={poison.timestamp_ms}"),
        }
    ]
    (topic, value, headers) = sink.sent[0]
    assert topic == "detector-dead-letters"
    assert value == poison.value and dict(headers or [])["reason"] == b"malformed_json"


def test_a_batch_is_committed_at_once_after_a_record_that_opens_an_incident(
    loop_parts: tuple[Settings, StreamLoop, FakeSink], sqlite_url: str
) -> None:
    _, loop, _ = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 700)
    opening = next(i for i, r in enumerate(logs) if b"CUDA out of memory" in r.value)
    source = FakeSource([logs])
    loop.attach(source)
    assert loop.step() == 700
    # the incident's row is committed with the records up to the one that opened it ...
    first = Committed(opening + 1, f"ts={logs[opening].timestamp_ms}")
    assert source.commits == [{("logs", 0): first}]
    engine = db.make_engine(sqlite_url)
    with db.session_factory(engine)() as session:
        assert [i.stage for i in service.list_incidents(session=session)] == ["suspected"]
    engine.dispose()
    # ... and the rest of the batch goes next without a poll (the source has no batch left),
    # cut again at the next stage change, until all of it is committed
    taken = [loop.step() for _ in range(5)]
    assert sum(taken) == 700 - opening - 1 and taken[-1] == 0
    positions = [c[("logs", 0)].offset for c in source.commits]
    assert positions == sorted(positions) and positions[-1] == 700


def test_a_database_failure_commits_no_offsets(
    loop_parts: tuple[Settings, StreamLoop, FakeSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, loop, _ = loop_parts
    source = FakeSource([records("logs", CASCADE / "container-logs.jsonl", 50)])
    loop.attach(source)

    def fail(self: Session) -> None:
        raise StoreError("database down")

    monkeypatch.setattr(Session, "commit", fail)
    with pytest.raises(StoreError):
        loop.step()
    assert source.commits == []


def test_dead_letters_are_stored_with_their_kafka_position(
    loop_parts: tuple[Settings, StreamLoop, FakeSink], sqlite_url: str
) -> None:
    _, loop, _ = loop_parts
    loop.attach(FakeSource([[Record("logs", 3, 41, 1741942800000, None, b"\xff\xfe")]]))
    loop.step()
    (row,) = _dead_letters(sqlite_url)
    assert (row.source_origin, row.source_partition, row.source_position) == ("logs", 3, 41)
    assert row.reason == "not_utf8"


def test_metrics_count_what_the_loop_did(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
) -> None:
    _, loop, _ = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 40)
    poison = Record("logs", 0, 40, logs[-1].timestamp_ms, None, b"{")
    loop.attach(FakeSource([[*logs, poison]], [{("logs", 0): 7}]))
    loop.step()
    exposition = generate_latest(loop.metrics.registry).decode()
    assert 'detector_records_consumed_total{topic="logs"} 41.0' in exposition
    assert 'detector_records_rejected_total{reason="malformed_json",topic="logs"} 1.0' in exposition
    assert 'detector_consumer_lag{partition="0",topic="logs"} 7.0' in exposition
    assert "detector_batch_seconds_count 1.0" in exposition


def test_metrics_are_served_over_http() -> None:
    metrics = LoopMetrics()
    metrics.open_incidents.set(2)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics.serve(port, addr="127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert "detector_open_incidents 2.0" in response.read().decode()


def test_a_partition_behind_holds_later_records_until_it_catches_up(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
) -> None:
    _, loop, _ = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 300)
    lb = records("lb", CASCADE / "lb-access.jsonl", 300)
    source = FakeSource([[*lb, *logs[:150]], logs[150:]], [{("logs", 0): 150}, {}])
    loop.attach(source)
    assert loop.step() == 450
    mark = logs[149].timestamp_ms
    released = [r for r in lb if r.timestamp_ms <= mark]
    first_held = next(r for r in lb if r.timestamp_ms > mark)
    assert 0 < len(released) < len(lb)
    assert source.commits[0][("lb", 0)].offset == first_held.offset  # nothing held committed
    assert source.commits[0][("logs", 0)].offset == 150
    assert loop.step() == 150
    assert source.commits[1] == {
        ("lb", 0): Committed(300, f"ts={lb[-1].timestamp_ms}"),
        ("logs", 0): Committed(300, f"ts={logs[-1].timestamp_ms}"),
    }


def test_commits_follow_the_highest_processed_offset_not_the_last_released(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
) -> None:
    _, loop, _ = loop_parts
    a, b = records("logs", CASCADE / "container-logs.jsonl", 2)
    late_first = Record("logs", 0, 0, b.timestamp_ms + 5000, None, a.value)  # offset 0, newer
    early_second = Record("logs", 0, 1, b.timestamp_ms, None, b.value)
    other = Record("lb", 0, 0, b.timestamp_ms + 1000, None, b"{")
    source = FakeSource([[late_first, early_second, other], []], [{("lb", 0): 3}, {}])
    loop.attach(source)
    loop.step()  # lb is behind at +1 s: offset 1 goes through, offset 0 waits
    assert source.commits[0][("logs", 0)].offset == 0
    loop.step()  # everything caught up: offset 0 goes through last, yet both are done
    assert source.commits[1][("logs", 0)].offset == 2


def test_unkeyed_records_warn_only_when_they_name_a_workload(
    loop_parts: tuple[Settings, StreamLoop, FakeSink], caplog: pytest.LogCaptureFixture
) -> None:
    _, loop, _ = loop_parts
    lines = (CASCADE / "container-logs.jsonl").read_bytes().splitlines()
    web = next(line for line in lines if b'"pod_name":"web-frontend' in line)  # names none
    oom = next(line for line in lines if b"OutOfMemoryError" in line)  # names llm/vllm-llama
    ts = 1741943017000
    batches = [[Record("logs", 0, 0, ts, None, web)], [Record("logs", 0, 1, ts, None, oom)]]
    loop.attach(FakeSource(batches))
    loop.step()
    assert "records without a key" not in caplog.text  # what detector produce leaves unkeyed
    loop.step()
    assert "records without a key topic=logs" in caplog.text


def _run_until(loop: StreamLoop, source: FakeSource, done: Callable[[], bool]) -> None:
    """Run the loop in a thread until ``done()`` or 20 s, then stop it."""
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    thread.join(10)
    assert done(), (source.commits, source.batches)


def test_a_record_that_breaks_its_batch_is_isolated_and_dead_lettered(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record whose processing raised (a bug) failed its batch for good: the stream stalled."""
    _, loop, sink = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 120)
    bad = logs[60]
    real = Processor.process

    def process(self: Processor, parsed: Parsed, session: Session) -> object:
        if parsed.raw == bad.value and parsed.error is None:
            raise KeyError("a parser bug")
        return real(self, parsed, session)

    monkeypatch.setattr(Processor, "process", process)
    # read, then re-read after the failure and after the isolation (FakeSource.seek is a no-op)
    source = FakeSource([list(logs) for _ in range(3)])
    loop.attach(source)
    _run_until(loop, source, lambda: bool(source.commits))
    assert source.commits[0] == {("logs", 0): Committed(120, f"ts={logs[-1].timestamp_ms}")}
    [(topic, value, headers)] = sink.sent
    assert (topic, value, dict(headers or [])["reason"]) == (
        "detector-dead-letters",
        bad.value,
        b"processing_failed",
    )
    (row,) = _dead_letters(sqlite_url)
    assert (row.source_position, row.reason) == (60, "processing_failed")
    assert "KeyError" in row.detail
    counts = loop.processor.counts  # the other 119 records were processed
    assert (counts.read, counts.rejected, counts.parsed) == (120, 1, 119)


def test_a_store_outage_dead_letters_nothing(
    loop_parts: tuple[Settings, StreamLoop, FakeSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the store is down every record fails, and none of them is the record's fault."""
    _, loop, sink = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 80)
    outage = {"left": 3}  # failing calls before the store is back
    real_commit, real_execute = Session.commit, Session.execute

    def down() -> None:
        if outage["left"] > 0:
            outage["left"] -= 1
            raise StoreError("database down")

    def commit(self: Session) -> None:
        down()
        real_commit(self)

    def execute(self: Session, *args: Any, **kwargs: Any) -> Any:
        down()
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(Session, "commit", commit)
    monkeypatch.setattr(Session, "execute", execute)
    source = FakeSource([list(logs) for _ in range(6)])
    loop.attach(source)
    _run_until(loop, source, lambda: bool(source.commits))
    assert sink.sent == [] and outage["left"] == 0
    assert source.commits[0] == {("logs", 0): Committed(80, f"ts={logs[-1].timestamp_ms}")}


def test_offsets_that_go_back_are_counted_and_the_state_kept(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
) -> None:
    """A topic created again under a running consumer: kafka-python resets to its start."""
    _, loop, _ = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 200)
    again = [dataclasses.replace(r, offset=r.offset - 150) for r in logs[150:]]  # new: 0..49
    source = FakeSource([logs[:150], again])
    loop.attach(source)
    loop.step()
    processor = loop.processor
    loop.step()
    assert loop.processor is processor  # the correlator kept what it knew
    assert source.commits[-1] == {("logs", 0): Committed(50, f"ts={logs[-1].timestamp_ms}")}
    exposition = generate_latest(loop.metrics.registry).decode()
    assert 'detector_offset_resets_total{topic="logs"} 1.0' in exposition


def test_metrics_export_each_workloads_signal_coverage(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
) -> None:
    """The first batch exports the coverage at once; later ones at most every few seconds."""
    _, loop, _ = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 400)
    lb = records("lb", CASCADE / "lb-access.jsonl", 300)
    loop.attach(FakeSource([sorted([*logs, *lb], key=lambda r: r.timestamp_ms)]))
    loop.step()
    exposition = generate_latest(loop.metrics.registry).decode()
    seen = 'detector_workload_signal_seen{signal="%s",workload="llm/vllm-llama"} %s'
    assert seen % ("gpu_oom", "1.0") in exposition
    assert seen % ("lb_errors", "1.0") in exposition
    assert seen % ("crash_loop", "0.0") in exposition
    missing = (
        'detector_workload_signal_missing{reason="no lines",signal="crash_loop",'
        'workload="llm/vllm-llama"} 1.0'
    )
    assert missing in exposition


class RememberingSource(FakeSource):
    """A source whose group remembers the loop's commits, as a broker does."""

    def committed(self, partition: Partition) -> Committed | None:
        return next((c[partition] for c in reversed(self.commits) if partition in c), None)


class Crash(BaseException):
    """A process killed mid-batch: no ``except Exception`` at the loop boundary catches it."""


def _staged(batch: Batch) -> bool:
    return any(isinstance(d, IncidentOpened | StageChanged) for d in batch.decisions)


def _drain(loop: StreamLoop) -> None:
    """Step until the source has nothing left and no batch is pending."""
    for _ in range(100):
        if loop.step() == 0:
            return
    raise AssertionError("the loop did not drain its source")


def _store(url: str) -> dict[str, Any]:
    """Return every row of the store but its ids, table by table, in id order."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table.name: [
                    {k: v for k, v in row._mapping.items() if k != "id" and not k.endswith("_id")}
                    for row in conn.execute(select(table).order_by(*table.primary_key.columns))
                ]
                for table in db.Base.metadata.sorted_tables
            }
    finally:
        engine.dispose()


def test_a_stage_is_committed_before_containment_plans_for_it(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The on-call waits for the stage; containment (planning, sizing, rendering) held it back."""
    _, loop, _ = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 700)
    engine = db.make_engine(sqlite_url)
    stored: list[tuple[str, list[str]]] = []  # (stage decided, stages another session reads)
    real = Processor.contain

    def contain(self: Processor, batch: Batch, session: Session) -> None:
        if _staged(batch):
            stage = [d.stage.value for d in batch.decisions if isinstance(d, StageChanged)]
            with db.session_factory(engine)() as other:  # sees committed rows only
                seen = [i.stage for i in service.list_incidents(session=other)]
            stored.append(((stage or ["suspected"])[-1], seen))
        real(self, batch, session)

    monkeypatch.setattr(Processor, "contain", contain)
    source = FakeSource([logs])
    loop.attach(source)
    _drain(loop)
    engine.dispose()
    assert [decided for decided, _ in stored][:2] == ["suspected", "cascading"]
    assert all(seen == [decided] for decided, seen in stored), stored
    # the offsets still follow the second commit: one Kafka commit per cut batch
    positions = [c[("logs", 0)].offset for c in source.commits]
    assert positions == sorted(positions) and positions[-1] == 700


def test_a_crash_between_the_stage_and_containment_commits_reprocesses_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage is stored, the runbook is not, no offset covers the record: the restart
    processes it again and the store ends as if there had been no crash."""
    logs = records("logs", CASCADE / "container-logs.jsonl", 700)
    urls = {name: f"sqlite:///{tmp_path / name}.db" for name in ("straight", "crashed")}
    for url in urls.values():
        db.upgrade(url)

    def run(url: str) -> tuple[StreamLoop, FakeSource]:
        settings = Settings()
        settings.database.url = url
        loop = StreamLoop(settings, db.session_factory(db.make_engine(url)), FakeSink())
        source = FakeSource([list(logs)])
        loop.attach(source)
        return loop, source

    loop, _ = run(urls["straight"])
    _drain(loop)
    real = Processor.contain
    crashed: list[int] = []

    def contain(self: Processor, batch: Batch, session: Session) -> None:
        cascading = any(
            isinstance(d, StageChanged) and d.stage.value == "cascading" for d in batch.decisions
        )
        if cascading and not crashed:
            crashed.append(self.counts.read)
            raise Crash
        real(self, batch, session)

    monkeypatch.setattr(Processor, "contain", contain)
    loop, source = run(urls["crashed"])
    with pytest.raises(Crash):
        _drain(loop)
    trigger = crashed[0] - 1  # the offset of the record that made the incident cascading
    assert [c[("logs", 0)].offset <= trigger for c in source.commits] == [True] * len(
        source.commits
    )
    at_crash = _store(urls["crashed"])
    assert [i["stage"] for i in at_crash["incidents"]] == ["cascading"]
    assert at_crash["runbook_steps"] == []
    loop, _ = run(urls["crashed"])  # the restart: nothing committed past the record
    _drain(loop)
    assert _store(urls["crashed"]) == _store(urls["straight"])


def test_containment_that_fails_on_a_record_keeps_its_committed_stage(
    loop_parts: tuple[Settings, StreamLoop, FakeSink],
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record whose containment raises (a bug) is isolated as before; the stage it made was
    committed first and stays. The retry, cut short again at the incident's opening (the
    rebuild re-decides it), still takes the rest of the failed batch one by one: it stalled."""
    _, loop, sink = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 700)
    real_process, real_contain = Processor.process, Processor.contain
    now: list[bytes] = []
    bad: list[bytes] = []

    def process(self: Processor, parsed: Parsed, session: Session) -> object:
        now[:] = [parsed.raw]
        return real_process(self, parsed, session)

    def contain(self: Processor, batch: Batch, session: Session) -> None:
        cascading = any(
            isinstance(d, StageChanged) and d.stage.value == "cascading" for d in batch.decisions
        )
        if (cascading and not bad) or now == bad:
            bad[:] = now
            raise KeyError("a containment bug")
        real_contain(self, batch, session)

    monkeypatch.setattr(Processor, "process", process)
    monkeypatch.setattr(Processor, "contain", contain)
    source = RememberingSource([list(logs) for _ in range(6)])
    loop.attach(source)
    _run_until(loop, source, lambda: any(c[("logs", 0)].offset == 700 for c in source.commits))
    (row,) = _dead_letters(sqlite_url)
    assert row.reason == "processing_failed" and "a containment bug" in row.detail
    assert logs[row.source_position].value == bad[0]
    [(_, value, headers)] = sink.sent
    assert (value, dict(headers or [])["reason"]) == (bad[0], b"processing_failed")
    store = _store(sqlite_url)
    assert [i["stage"] for i in store["incidents"]] == ["cascading"]
    stages = [t for t in store["timeline_entries"] if t["message"].startswith("stage -> cascading")]
    evidence = {e["source_position"]: e["time"] for e in store["evidence"]}
    assert [t["time"] for t in stages] == [evidence[row.source_position]]  # the isolated record's
    # the rebuilt correlator, without that record, meets the pod's next OOM line: it decides
    # cascading again (the stage and its note are there already) and containment plans then
    assert store["runbook_steps"] and evidence[row.source_position] < min(
        t["time"] for t in store["timeline_entries"] if t["kind"] == "step"
    )


class AmnesicSource(FakeSource):
    """A broker that lost the group's commits: every partition reads as never committed."""


def test_a_failed_batch_on_a_broker_that_lost_its_commits_goes_on_in_the_new_session(
    loop_parts: tuple[Settings, StreamLoop, FakeSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state is kept (the broker no longer holds the window to rebuild it), but the rows
    the processor cached belonged to the session the failure closed: every retry failed with
    "not persistent within this Session" and the stream stalled."""
    _, loop, _ = loop_parts
    logs = records("logs", CASCADE / "container-logs.jsonl", 700)
    opening = next(i for i, r in enumerate(logs) if b"CUDA out of memory" in r.value)
    source = AmnesicSource([logs[: opening + 1], logs[opening + 1 :], logs[opening + 1 :]])
    loop.attach(source)
    loop.step()  # the incident opened: its row is cached by the processor
    assert loop.processor.recorder.incidents
    processor = loop.processor
    real_commit, failed = Session.commit, {"left": 1}

    def commit(self: Session) -> None:
        if failed["left"]:
            failed["left"] -= 1
            raise StoreError("database down")
        real_commit(self)

    monkeypatch.setattr(Session, "commit", commit)
    _run_until(loop, source, lambda: len(source.commits) > 1 and not source.batches)
    assert loop.processor.correlator is processor.correlator  # the state was kept
    assert source.commits[-1][("logs", 0)].offset == 700
