"""Run the bundled cascade live through a local Kafka-protocol broker (``make live-demo``).

Writes the bundled cascade anew (``detector.lab.recording``: the same records as
``examples/cascade``, its clock starting ``AGO_S`` before now, so that the step waiting for a
person can still be approved when the demo ends), starts Tansu (memory-only, on a free
loopback port), ``detector run`` in the background (a SQLite store in a folder that is kept,
``/metrics`` on a free port, the approver ``demo``), then ``detector produce FOLDER --speed
N``; prints the incident each time ``detector incidents`` changes, then ``detector show`` of it,
compares its stage changes and steps with ``detector replay`` of the same files, and prints
the approve command to try. Stops the detector and the broker on exit, whatever happens.
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
from detector.lab.recording import write_recording

AGO_S = 300.0  # the recording's clock starts this long before now
APPROVER = "demo"
DETECTOR = [sys.executable, "-m", "detector"]
START_S = 60.0  # bound on the detector's start
DRAIN_S = 60.0  # bound on consuming what was produced


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return 0 when live equals replay."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=10.0, help="1 = as recorded (9 min)")
    args = parser.parse_args(argv)
    keep = Path(tempfile.mkdtemp(prefix="live-demo-"))
    cascade = keep / "cascade"
    write_recording("cascade", cascade, start=round(time.time() - AGO_S))
    broker, bootstrap = start_tansu()
    run: subprocess.Popen[bytes] | None = None
    produce: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="live-demo-") as tmp:
        port = _free_port()
        env = {**os.environ, "DETECTOR_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
               "DETECTOR_DATABASE__URL": f"sqlite:///{keep}/detector.db",
               "DETECTOR_CONTAINMENT__APPROVERS": f'["{APPROVER}"]',
               "DETECTOR_KAFKA__METRICS_PORT": str(port)}  # fmt: skip
        log = Path(tmp, "run.log")
        try:
            _say(f"broker: Tansu at {bootstrap}; store: {env['DETECTOR_DATABASE__URL']}")
            with log.open("wb") as out:
                run = subprocess.Popen([*DETECTOR, "run"], env=env, stdout=out, stderr=out)
            _wait_started(run, log)
            records = [line for f in cascade.iterdir() for line in f.read_bytes().splitlines()]
            total = sum(1 for record in records if record.strip())
            _say(f"detector produce {cascade} --speed {args.speed:g}")
            produce = subprocess.Popen([*DETECTOR, "produce", str(cascade), "--speed",
                                        str(args.speed)], env=env)  # fmt: skip
            running = produce
            shown = _watch(env, port, lambda: running.poll() is not None, "")
            _watch(env, port, lambda: _consumed(port) >= total, shown, DRAIN_S)
            if produce.returncode != 0:
                _say(f"produce failed (exit {produce.returncode})")
                return 1
            same = _compare(env, tmp, cascade)
            _next_action(env, keep)
            return same
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


def _next_action(env: dict[str, str], keep: Path) -> None:
    """Say where the store is kept and how to decide a step that waits for a person."""
    db = f"sqlite:///{keep}/detector.db"
    _say(f"the store is kept: --db {db} (detector show, postmortem, incidents)")
    listing = _cli(env, "incidents", "--db", db).stdout
    if "waiting:" not in listing:
        _say(
            "no step waits for a person now: to approve one from the CLI, run it as recorded "
            "(make live-demo SPEED=1) and approve step 4 while detector incidents lists it"
        )
        return
    sys.stdout.write(listing)
    _say(
        f"approve it with the command above: NAME = {APPROVER}, with "
        f"DETECTOR_CONTAINMENT__APPROVERS='[\"{APPROVER}\"]' (dry-run: nothing changes)"
    )


def _compare(env: dict[str, str], tmp: str, cascade: Path) -> int:
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
    replayed = json.loads(_cli(env, "replay", "--json", "--db", replay_db, str(cascade)).stdout)
    straight = [i for i in replayed["incidents"] if i["key"] == key]
    decided = any((t.get("detail") or {}).get("event") in ("approved", "denied")
                  for t in live["timeline"])  # fmt: skip
    if straight and decided:
        same = _core(live)["stages"][:2] == _core(straight[0])["stages"][:2]
        _say("a person decided a step during the demo: from there on the live incident differs "
             "from the replay by design; its first stage changes "
             + ("equal the replay's" if same else "differ from the replay's"))  # fmt: skip
        return 0 if same else 1
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
