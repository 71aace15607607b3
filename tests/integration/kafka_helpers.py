"""Helpers of the Kafka tests: produce the recordings, run the detector, wait for commits."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from detector.config import Settings
from detector.incidents import service
from detector.report.document import incident_document
from detector.report.schemas import IncidentOut
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
    bootstrap: str,
    prefix: str,
    db_url: str,
    log_path: Path,
    topics: list[str] | None = None,
    *,
    extra: tuple[str, ...] = ("-v",),
) -> subprocess.Popen[bytes]:
    """Start ``detector run`` as a subprocess on the test's topics and group (``extra``: more
    options; ``-v`` by default)."""
    args = [
        sys.executable, "-m", "detector", "run", *extra,
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


def last_assignment(log_path: Path) -> list[tuple[str, int]]:
    """Return the partitions of the last ``partitions assigned`` line of a detector's log."""
    found: list[tuple[str, int]] = []
    for line in log_path.read_text(errors="replace").splitlines():
        if "partitions assigned partitions=" in line:
            found = ast.literal_eval(line.split("partitions assigned partitions=", 1)[1])
    return found


def wait_assigned(logs: list[Path], partitions: int, procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait until the detectors' last assignments split ``partitions`` among all of them."""
    deadline = time.monotonic() + WAIT_S
    while True:
        assert all(p.poll() is None for p in procs), "a detector exited"
        owned = [last_assignment(log) for log in logs]
        everything = [p for parts in owned for p in parts]
        if all(owned) and len(everything) == len(set(everything)) == partitions:
            return
        assert time.monotonic() < deadline, f"assignments {owned}"
        time.sleep(0.2)


def committed_sums(
    bootstrap: str, prefix: str, topics: list[str], partitions: int
) -> dict[str, int]:
    """Return the group's committed offsets summed over ``partitions`` per topic."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=f"{prefix}-group", enable_auto_commit=False
    )
    try:
        return {
            t: sum(max(0, consumer.committed(TopicPartition(t, p)) or 0) for p in range(partitions))
            for t in topics
        }
    finally:
        consumer.close()


def wait_consumed(
    bootstrap: str,
    prefix: str,
    expected: dict[str, int],
    partitions: int,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """Wait until the group's commits over all ``partitions`` of each topic sum to ``expected``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        assert any(p.poll() is None for p in procs), "every detector exited"
        got = committed_sums(bootstrap, prefix, list(expected), partitions)
        if all(got[t] >= n for t, n in expected.items()):
            return
        assert time.monotonic() < deadline, f"committed {got}, expected {expected}"
        time.sleep(0.2)


def incidents_in(db_url: str) -> list[dict[str, Any]]:
    """Return the stored incidents as ``replay --json`` documents."""
    engine = create_engine(db_url)
    try:
        with Session(engine) as session:
            return [
                incident_document(IncidentOut.model_validate(i).model_dump(mode="json"))
                for i in service.list_incidents(session=session)
            ]
    finally:
        engine.dispose()


FORECAST_NOTE = "next victim at risk: "


def core_of(doc: dict[str, Any], *, after_cascade: bool = True) -> dict[str, Any]:
    """Return what a live run must share with a straight replay: every stage change, note, step
    and victim with its time, the pods and the planned steps.

    The evidence kept per signal kind is left out: after a restart or a takeover, the rebuilt
    state keeps its own first-of-a-kind samples (idempotent, but not the same rows). So are the
    next-victim forecast's notes: a forecast is fitted on the pressure samples that had arrived
    when event time passed its 5 s mark, and live topics arrive interleaved differently from a
    replay's merge (the forecast is advice; no step depends on it unless predictive
    containment is on, which these runs leave off). With
    ``after_cascade=False`` the stage changes after ``cascading`` are left out too: when a
    process dies mid-stream and another takes its partitions over, when the quiet-time stages
    (``contained``) fire depends on how far the survivor's other partitions had run ahead.
    """
    late = ("stage -> contained", "stage -> resolved")
    timeline = sorted(
        (t["time"], t["kind"], t["message"])
        for t in doc["timeline"]
        if (t["kind"] != "signal" or t["message"].startswith("victim"))
        and (after_cascade or not t["message"].startswith(late))
        and not t["message"].startswith(FORECAST_NOTE)
    )
    steps = [(s["position"], s["action"], s["status"]) for s in doc["steps"]]
    return {"key": doc["key"], "pods": doc["pods"], "steps": steps, "timeline": timeline}
