"""Run the bundled cascade live through a local Kafka-protocol broker (``make live-demo``).

Starts Tansu (memory-only, on a free loopback port), ``detector run`` in the background
(SQLite store in a temporary folder, ``/metrics`` on a free port), then ``detector produce
examples/cascade --speed N``; prints the incident each time ``detector incidents`` changes,
then ``detector show`` of it, and compares its stage changes and steps with ``detector
replay`` of the same files. Stops the detector and the broker on exit, whatever happens.
Exit status: 0 when the live incident equals the replay's, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from detector.lab.broker import start_tansu

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
DETECTOR = [sys.executable, "-m", "detector"]
START_S = 60.0  # bound on the detector's start
DRAIN_S = 60.0  # bound on consuming what was produced


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return 0 when live equals replay."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=10.0, help="1 = as recorded (9 min)")
    args = parser.parse_args(argv)
    broker, bootstrap = start_tansu()
    run: subprocess.Popen[bytes] | None = None
    produce: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="live-demo-") as tmp:
        port = _free_port()
        env = {**os.environ, "DETECTOR_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
               "DETECTOR_DATABASE__URL": f"sqlite:///{tmp}/detector.db",
               "DETECTOR_KAFKA__METRICS_PORT": str(port)}  # fmt: skip
        log = Path(tmp, "run.log")
        try:
            _say(f"broker: Tansu at {bootstrap}; store: {env['DETECTOR_DATABASE__URL']}")
            with log.open("wb") as out:
                run = subprocess.Popen([*DETECTOR, "run"], env=env, stdout=out, stderr=out)
            _wait_started(run, log)
            records = [line for f in CASCADE.iterdir() for line in f.read_bytes().splitlines()]
            total = sum(1 for record in records if record.strip())
            _say(f"detector produce {os.path.relpath(CASCADE)} --speed {args.speed:g}")
            produce = subprocess.Popen([*DETECTOR, "produce", str(CASCADE), "--speed",
                                        str(args.speed)], env=env)  # fmt: skip
            running = produce
            shown = _watch(env, port, lambda: running.poll() is not None, "")
            _watch(env, port, lambda: _consumed(port) >= total, shown, DRAIN_S)
            if produce.returncode != 0:
                _say(f"produce failed (exit {produce.returncode})")
                return 1
            return _compare(env, tmp)
        finally:
            _stop(produce)
            if run is not None:
                _stop(run)
                lines = log.read_text(errors="replace").splitlines()
                warned = [line for line in lines if " WARNING " in line or " ERROR " in line]
                _say(
                    f"detector run stopped (exit {run.returncode}), "
                    f"{len(warned)} warnings or errors in its log{':' if warned else ''}"
                )
                for line in warned:
                    print(line)
            broker.kill()
            broker.wait(timeout=10)
            _say("broker stopped")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a child with SIGTERM, then SIGKILL after 30 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_started(run: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until ``detector run`` logs its assignment; raise SystemExit if it exits."""
    deadline = time.monotonic() + START_S
    while b"partitions assigned" not in log.read_bytes():
        if run.poll() is not None or time.monotonic() > deadline:
            sys.stdout.write(log.read_text(errors="replace"))
            raise SystemExit(f"detector run did not start (exit {run.poll()})")
        time.sleep(0.2)
    for line in log.read_text(errors="replace").splitlines():
        _say(f"detector run: {line.split(' ', 4)[-1]}")


def _watch(
    env: dict[str, str],
    port: int,
    done: Callable[[], bool],
    shown: str,
    timeout_s: float = 3600.0,
) -> str:
    """Print ``detector incidents`` whenever it differs from ``shown``, until ``done()`` or
    the timeout; return what it printed last."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        finished = done()
        now = _cli(env, "incidents").stdout
        if now != shown:
            shown = now
            _say(f"consumed {_consumed(port)} records; detector incidents:")
            sys.stdout.write(now)
        if finished:
            break
        time.sleep(1.0)
    return shown


def _consumed(port: int) -> int:
    """Return ``detector_records_consumed_total`` summed over topics, from ``/metrics``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return 0
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("detector_records_consumed_total{")))  # fmt: skip


def _compare(env: dict[str, str], tmp: str) -> int:
    """Print the live incident and compare it with a replay; 0 when they agree."""
    incidents = json.loads(_cli(env, "incidents", "--json").stdout)
    if len(incidents) != 1:
        _say(f"expected one incident, found {len(incidents)}")
        return 1
    key = incidents[0]["key"]
    _say(f"detector show {key}")
    sys.stdout.write(_cli(env, "show", key).stdout)
    live = json.loads(_cli(env, "show", key, "--json").stdout)
    replay_db = f"sqlite:///{tmp}/replay.db"
    replayed = json.loads(_cli(env, "replay", "--json", "--db", replay_db, str(CASCADE)).stdout)
    straight = [i for i in replayed["incidents"] if i["key"] == key]
    if not straight or _core(live) != _core(straight[0]):
        _say(f"live differs from replay: {_core(live)} != {straight and _core(straight[0])}")
        return 1
    core = _core(live)
    _say(f"live equals replay: {len(core['stages'])} stage changes, {len(core['steps'])} steps "
         f"and {len(core['step_entries'])} step entries with their times")  # fmt: skip
    return 0


def _core(doc: dict[str, Any]) -> dict[str, Any]:
    """Return the stage changes, steps and step entries of an incident document."""

    def entries(kind: str) -> list[tuple[str, str]]:
        return sorted((t["time"], t["message"]) for t in doc["timeline"] if t["kind"] == kind)

    steps = [(s["position"], s["action"], s["status"]) for s in doc["steps"]]
    return {"stages": entries("stage"), "steps": steps, "step_entries": entries("step")}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**env, "DETECTOR_KAFKA__METRICS_PORT": "0", "COLUMNS": "120"}
    return subprocess.run([*DETECTOR, *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
