"""Measure what containment changes, per client request: each scenario, mode and seed.

Run: ``.venv/bin/python bench/bench_outcome.py [--seeds 10] [--scenarios ...] [--jobs 2]
[--json]``. Not a test: it prints a table and asserts nothing. Each shipped scenario runs in the
closed loop (``detector.sim.loop.simulate``: the model, the real detector and its real
actuators against the Kubernetes API stand-in) with containment off, on and predictive, on the
same seeds; the model draws its arrivals from a generator of their own, so the three modes of
a seed see the same clients at the same moments and differ only in what the detector did. The
baseline of each row is the ``off`` row of its scenario, measured in the same run.

Columns (``detector simulate --json`` keys): ``client_failed`` as a share of
``client_requests`` (the last attempt failed, shed ones included), ``client_unfinished`` share
(still in flight or waiting to retry at the end: neither failed nor served), ``shed_requests``
share, ``goodput_tokens_per_s``, ``latency_p99_s`` (successful requests), ``pods_lost``,
``recover_s``, ``incidents``, ``actions`` (applied writes) and the runs that left something in
force; each the median over the seeds with the lowest and highest value in brackets, and
``failed x off`` the median of the per-seed ratio to the ``off`` run of the same seed. The
targets (the design card's, ``shared/DESIGN.md`` section 7): with containment at most one pod
lost, failed client requests at most half of ``off``, goodput not lower, and nothing at all on
``busy-no-trigger``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from detector.config import Settings  # noqa: E402
from detector.sim.loop import Containment, simulate  # noqa: E402
from detector.sim.scenario import load_scenario, scenario_names  # noqa: E402

FIRST_SEED = 7


def one(job: tuple[str, str, int]) -> dict[str, Any]:
    """Run one scenario, mode and seed; return its outcome as a dict."""
    name, mode, seed = job
    return simulate(load_scenario(name), Settings(), mode=Containment(mode), seed=seed).as_dict()


def _spread(values: list[float | None], digits: int = 1) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    med = statistics.median(known)
    missing = f", {len(values) - len(known)} none" if len(known) < len(values) else ""
    return f"{med:.{digits}f} [{min(known):.{digits}f}-{max(known):.{digits}f}{missing}]"


def row(name: str, mode: str, runs: list[dict[str, Any]], off: list[dict[str, Any]]) -> dict:
    """Summarize the runs of one scenario and mode (paired by seed with ``off``)."""

    def pct(key: str) -> list[float | None]:
        return [100 * r[key] / max(1, r["client_requests"]) for r in runs]

    ratios = [
        r["client_failed"] / o["client_failed"] if o["client_failed"] else None
        for r, o in zip(runs, off, strict=True)
    ]
    return {
        "scenario": name,
        "containment": mode,
        "seeds": [r["seed"] for r in runs],
        "client_failed_pct": _spread(pct("client_failed")),
        "unfinished_pct": _spread(pct("client_unfinished")),
        "failed_x_off": _spread(ratios, 2),
        "shed_pct": _spread(pct("shed_requests")),
        "goodput_tokens_per_s": _spread([r["goodput_tokens_per_s"] for r in runs], 0),
        "latency_p99_s": _spread([r["latency_p99_s"] for r in runs]),
        "pods_lost": _spread([r["pods_lost"] for r in runs], 0) + f" of {runs[0]['pods_total']}",
        "recover_s": _spread([r["recover_s"] for r in runs], 0),
        "incidents": _spread([r["incidents"] for r in runs], 0),
        "actions": _spread([len(r["actions"]) for r in runs], 0),
        "left_in_force": sum(1 for r in runs if r["left_in_force"]),
    }


COLUMNS = (
    "scenario", "containment", "client_failed_pct", "failed_x_off", "unfinished_pct", "shed_pct",
    "goodput_tokens_per_s", "latency_p99_s", "pods_lost", "recover_s", "incidents", "actions",
    "left_in_force",
)  # fmt: skip


def main() -> None:
    """Parse the options, run every scenario, mode and seed, print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=scenario_names())
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds, from 7 up")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (processes)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.seeds))
    modes = [m.value for m in Containment]
    jobs = [(n, m, s) for n in args.scenarios for m in modes for s in seeds]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(zip(jobs, pool.map(one, jobs), strict=True))
    rows = []
    for name in args.scenarios:
        off = [results[(name, "off", s)] for s in seeds]
        for mode in modes:
            rows.append(row(name, mode, [results[(name, mode, s)] for s in seeds], off))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"seeds {seeds[0]}-{seeds[-1]}: median [min-max] over the seeds")
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |")


if __name__ == "__main__":
    main()
