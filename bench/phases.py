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
    base_rate = _rate(results["baseline"])
    print(
        f"{'phase':<9} {'records':>9} {'seconds':>8} {unit + 's/s':>11} {'us/' + unit:>9} "
        f"{'peak RSS':>10} {'x baseline':>10}"
    )
    for phase, r in results.items():
        if "error" in r:
            print(f"{phase:<9} failed: {r['error']}")
            continue
        rate = _rate(r)
        ratio = f"{rate / base_rate:.2f}" if rate and base_rate else "-"
        rate_us = f"{rate:>11,.0f} {1e6 / rate:>9.2f}" if rate else f"{'-':>11} {'-':>9}"
        print(
            f"{phase:<9} {r['records']:>9,} {r['seconds']:>8.2f} {rate_us} "
            f"{r['peak_rss_mib']:>7.0f} MiB {ratio:>10}"
        )
        if r.get("note"):
            print(f"{'':<9} {r['note']}")


def _rate(r: dict[str, Any]) -> float | None:
    """Return records per second of a phase (None when it failed or timed no span)."""
    if "error" in r or r["records"] <= 0 or r["seconds"] <= 0:
        return None
    return float(r["records"] / r["seconds"])


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


# --- figures as JSON (``--json PATH``; bench_all.py reads them) ------------------------------


def nearest_rank(values: list[float], q: float) -> float:
    """Return the ``q`` quantile of sorted ``values`` by nearest rank (as the tables print it)."""
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def spread(values: list[float]) -> dict[str, float]:
    """Return p50/p99 (nearest rank), min and max of sorted latencies in ms; {} for none."""
    if not values:
        return {}
    return {
        "p50_ms": nearest_rank(values, 0.5),
        "p99_ms": nearest_rank(values, 0.99),
        "min_ms": values[0],
        "max_ms": values[-1],
    }


def phase_figures(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return the figures ``print_table`` prints, per phase: rate, us/record, RSS, x baseline."""
    base_rate = _rate(results["baseline"])
    out: dict[str, dict[str, Any]] = {}
    for phase, r in results.items():
        if "error" in r:
            out[phase] = {"error": r["error"]}
            continue
        rate = _rate(r)
        out[phase] = {
            "records": r["records"],
            "seconds": r["seconds"],
            "records_per_s": rate,
            "us_per_record": 1e6 / rate if rate else None,
            "peak_rss_mib": r["peak_rss_mib"],
            "x_baseline": rate / base_rate if rate and base_rate else None,
        }
        if r.get("note"):
            out[phase]["note"] = r["note"]
    return out


def rss_figures(
    results: dict[str, dict[str, Any]], shares: tuple[float, ...]
) -> dict[str, dict[str, Any]]:
    """Return the figures ``print_rss_profile`` prints, per phase: peak, RSS at each share,
    last / first and the peak over the baseline's."""
    base = results["baseline"].get("peak_rss_mib")
    out: dict[str, dict[str, Any]] = {}
    for phase, r in results.items():
        if "error" in r:
            out[phase] = {"error": r["error"]}
            continue
        at = {q: r.get("rss_at", {}).get(str(q)) for q in map(str, shares)}
        first, last = at.get(str(shares[0])), at.get(str(shares[-1]))
        out[phase] = {
            "peak_rss_mib": r["peak_rss_mib"],
            "rss_at_mib": {k: v for k, v in at.items() if v is not None},
            "last_first": last / first if first and last else None,
            "peak_x_baseline": r["peak_rss_mib"] / base if base else None,
        }
    return out


def write_json(path: Path | None, figures: dict[str, Any]) -> None:
    """Write ``figures`` as one JSON object to ``path`` (nothing when ``path`` is None)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n")
