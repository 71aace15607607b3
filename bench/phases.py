"""What the benchmarks share: the scaled recording, phases in child processes, the table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def count_records(paths: list[Path]) -> int:
    """Return the number of lines (records) in ``paths``."""
    return sum(len(p.read_bytes().splitlines()) for p in paths)


def write_cascade(outdir: Path, target: int, seed: int) -> tuple[list[Path], int]:
    """Write a cascade recording of at least ``target`` records; return its files and scale."""
    from detector.lab.recording import write_recording

    one = count_records(write_recording("cascade", outdir, seed=seed, scale=1))
    two = count_records(write_recording("cascade", outdir, seed=seed, scale=2))
    scale = max(1, 2 + math.ceil((target - two) / max(1, two - one)))
    paths = write_recording("cascade", outdir, seed=seed, scale=scale)
    while count_records(paths) < target:
        scale += max(1, scale // 20)
        paths = write_recording("cascade", outdir, seed=seed, scale=scale)
    return paths, scale


def spawn(
    script: str, phase: str, folder: Path, extra: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` for one phase in a fresh interpreter (its own peak RSS)."""
    cmd = [sys.executable, script, "--phase", phase, "--dir", str(folder), *(extra or [])]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)


def child(script: str, phase: str, folder: Path, extra: list[str] | None = None) -> dict[str, Any]:
    """Run one phase in a child process; return its last JSON line (or its error)."""
    done = spawn(script, phase, folder, extra)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        err = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        return {"error": err[-1]}
    return dict(json.loads(lines[-1]))


def print_table(results: dict[str, dict[str, Any]], unit: str = "event") -> None:
    """Print ``unit``s/s, microseconds per ``unit``, peak RSS and the ratio to the baseline."""
    base = results["baseline"]
    base_rate = base["records"] / base["seconds"] if "error" not in base else None
    print(
        f"{'phase':<9} {'records':>9} {'seconds':>8} {unit + 's/s':>11} {'us/' + unit:>9} "
        f"{'peak RSS':>10} {'x baseline':>10}"
    )
    for phase, r in results.items():
        if "error" in r:
            print(f"{phase:<9} failed: {r['error']}")
            continue
        rate = r["records"] / r["seconds"]
        ratio = f"{rate / base_rate:.2f}" if base_rate else "-"
        print(
            f"{phase:<9} {r['records']:>9,} {r['seconds']:>8.2f} {rate:>11,.0f} "
            f"{1e6 / rate:>9.2f} {r['peak_rss_mib']:>7.0f} MiB {ratio:>10}"
        )
        if r.get("note"):
            print(f"{'':<9} {r['note']}")
