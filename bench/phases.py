"""What the benchmarks share: the scaled recording, phases in child processes, the table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


def vm_mib(field: str = "VmRSS", pid: int | str = "self") -> float | None:
    """Return ``field`` (VmRSS, VmHWM ...) of ``/proc/<pid>/status`` in MiB; None once gone.

    VmHWM, unlike ``ru_maxrss``, starts afresh at exec: a child never reports its parent's
    peak. https://man7.org/linux/man-pages/man5/proc_pid_status.5.html
    """
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return None


def print_rss_profile(results: dict[str, dict[str, Any]], shares: tuple[float, ...]) -> None:
    """Print each phase's peak RSS, its RSS at ``shares`` of the records and last / first."""
    base = results["baseline"].get("peak_rss_mib")
    heads = "".join(f"{f'at {q:.0%}':>9}" for q in shares)
    last_first = f"{f'{shares[-1]:.0%}/{shares[0]:.0%}':>9}"
    print(f"{'phase':<9} {'peak RSS':>10}{heads}{last_first} {'peak x baseline':>15}")
    for phase, r in results.items():
        if "error" in r:
            print(f"{phase:<9} failed: {r['error']}")
            continue
        at = r.get("rss_at", {})
        cells = "".join(f"{at[str(q)]:>5.0f} MiB" if str(q) in at else f"{'-':>9}" for q in shares)
        first, last = at.get(str(shares[0])), at.get(str(shares[-1]))
        ratio = f"{last / first:>8.2f}x" if first and last else f"{'-':>9}"
        times = f"{r['peak_rss_mib'] / base:>14.2f}x" if base else f"{'-':>15}"
        print(f"{phase:<9} {r['peak_rss_mib']:>6.0f} MiB{cells}{ratio} {times}")


@contextmanager
def tansu_folder(prefix: str, timeout_s: float = 30.0) -> Iterator[tuple[str, Path]]:
    """Start a memory-only Tansu broker and a temporary folder; yield ``(host:port, folder)``.

    The broker is killed and the folder removed on the way out. Raises StreamError when the
    broker does not start within ``timeout_s`` seconds (``detector.lab.broker.start_tansu``).
    """
    from detector.lab.broker import start_tansu

    proc, bootstrap = start_tansu(timeout_s)
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield bootstrap, Path(tmp)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def prepared_phases(
    script: str, folder: Path, common: list[str], extra: list[str], phases: tuple[str, ...]
) -> dict[str, dict[str, Any]] | None:
    """Run ``script``'s ``prepare`` phase, print its note, then each of ``phases`` (children).

    ``common`` goes to every phase, ``extra`` to ``prepare`` alone. Returns None (and says why)
    when ``prepare`` failed.
    """
    prepared = child(script, "prepare", folder, common + extra)
    if "error" in prepared:
        print(f"prepare failed: {prepared['error']}")
        return None
    print(prepared["note"])
    return {phase: child(script, phase, folder, common) for phase in phases}
