"""Benchmark the replay pipeline against a raw read-and-decode baseline, on this machine.

Run: ``.venv/bin/python bench/bench_replay.py [--records 200000] [--json PATH]``. Not a test:
it prints numbers and asserts nothing (bench/README.md gives the targets and explains the
output); ``--json`` also writes the printed figures as one JSON object. Each phase (and the
generator) runs in its own process: Linux keeps ``ru_maxrss`` across fork and exec, so a child
of a big parent would report the parent's peak.

Phases, all over the same files (a cascade recording from ``detector.lab.recording``, scaled
to at least ``--records`` records):
- baseline: read every file line by line and ``json.loads`` each record;
- product:  ``detector.pipeline.replay`` (merge, parse, correlate, incident store in SQLite);
- core:     ``detector.events.detect.parse_record`` on every record, then
            ``Correlator(settings.correlate).observe(signal)`` for each signal, the records
            already in memory (the pure core, no I/O, no database).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from phases import (  # noqa: E402
    child,
    count_records,
    phase_figures,
    print_table,
    spawn,
    write_cascade,
    write_json,
)

PHASES = ("baseline", "product", "core")
SCRIPT = str(Path(__file__).resolve())


def main(argv: list[str] | None = None) -> int:
    """Generate the recording, run each phase in a child process, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="at least this many")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--phase", choices=(*PHASES, "generate"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase == "generate":  # child process: write the recording, print its summary
        _generate(args.dir / "cascade", args.records, args.seed)
        return 0
    if args.phase:  # child process: measure one phase, print one JSON line
        print(json.dumps(_run_phase(args.phase, args.dir)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        folder = Path(tmp)
        extra = ["--records", str(args.records), "--seed", str(args.seed)]
        done = spawn(SCRIPT, "generate", folder, extra)
        print(done.stdout.strip() or done.stderr.strip())
        if done.returncode != 0:
            return 1
        results = {phase: child(SCRIPT, phase, folder) for phase in PHASES}
    print_table(results)
    figures = {"bench": "replay", "records_asked": args.records, "seed": args.seed}
    write_json(args.json, {**figures, "recording": done.stdout.strip(), **_figures(results)})
    return 0


def _figures(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The table's figures, and the core's own work: its us/record beyond the baseline's."""
    phases = phase_figures(results)
    core, base = phases.get("core", {}), phases.get("baseline", {})
    own = (
        core["us_per_record"] - base["us_per_record"]
        if "error" not in core and "error" not in base
        else None
    )
    return {"phases": phases, "core_own_us_per_record": own}


def _generate(outdir: Path, target: int, seed: int) -> None:
    """Write a cascade recording of at least ``target`` records into ``outdir``."""
    start = time.perf_counter()
    paths, scale = write_cascade(outdir, target, seed)
    size = sum(p.stat().st_size for p in paths)
    print(
        f"recording: {count_records(paths):,} records in {len(paths)} files, "
        f"{size / 1e6:.1f} MB, scale {scale}, seed {seed}, "
        f"generated in {time.perf_counter() - start:.1f} s"
    )


def _run_phase(phase: str, folder: Path) -> dict[str, Any]:
    """Measure one phase in this process: records, seconds, peak RSS and what it found."""
    paths = sorted(folder.glob("*/*.jsonl"))
    runner = {"baseline": _baseline, "product": _product, "core": _core}[phase]
    measured = runner(paths, folder)
    measured["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return measured


def _baseline(paths: list[Path], _folder: Path) -> dict[str, Any]:
    """Read each file line by line and decode every record with ``json.loads``."""
    start = time.perf_counter()
    records = 0
    for path in paths:
        with path.open("rb") as fh:
            for line in fh:
                json.loads(line)
                records += 1
    return {"records": records, "seconds": time.perf_counter() - start}


def _product(paths: list[Path], folder: Path) -> dict[str, Any]:
    """Run ``detector.pipeline.replay`` with default settings and a fresh SQLite file."""
    from detector.config import DatabaseSettings, Settings
    from detector.pipeline import replay

    settings = Settings(database=DatabaseSettings(url=f"sqlite:///{folder / 'bench.db'}"))
    start = time.perf_counter()
    result = replay(paths, settings)
    seconds = time.perf_counter() - start
    events = result.events
    found = (
        f"{len(result.incidents)} incident(s), {len(getattr(result, 'verdicts', []))} verdict(s)"
    )
    return {
        "records": events.read,
        "seconds": seconds,
        "note": f"parsed {events.parsed:,}, rejected {events.rejected:,}; {found}",
    }


def _core(paths: list[Path], _folder: Path) -> dict[str, Any]:
    """Parse every record and correlate every signal, the records already in memory."""
    from detector.config import Settings
    from detector.correlate.correlator import Correlator
    from detector.errors import ParseError
    from detector.events.detect import parse_record
    from detector.events.model import SourcePos

    records = [
        (SourcePos(path.name, i), line)
        for path in paths
        for i, line in enumerate(path.read_bytes().splitlines(), 1)
    ]
    correlator = Correlator(Settings().correlate)
    signals = decisions = rejected = 0
    start = time.perf_counter()
    for source, raw in records:
        try:
            parsed = parse_record(raw, source)
        except ParseError:
            rejected += 1
            continue
        for signal in parsed:
            signals += 1
            decisions += len(correlator.observe(signal))
    seconds = time.perf_counter() - start
    note = f"{signals:,} signals, {decisions:,} decisions, rejected {rejected:,}"
    return {"records": len(records), "seconds": seconds, "note": note}


if __name__ == "__main__":
    raise SystemExit(main())
