"""Measure what containment changes: the cascade simulator's outcome per scenario and mode.

Run: ``.venv/bin/python bench/bench_outcome.py [--seeds 7 11 13] [--scenarios ...] [--json]``.
Not a test: it prints a table and asserts nothing. Each shipped scenario runs in the closed
loop (``detector.sim.loop.simulate``: the model, the real detector and its real actuators
against the Kubernetes API stand-in) with containment off, on and predictive, each with the
same seeds, so the rows of one scenario differ only in what the detector was allowed to do.
The baseline of each scenario is its ``off`` row, measured in the same run.

Columns: pods lost (of the replicas), failed requests (5xx) and shed requests (429) summed
over the seeds, failed as a fraction of the ``off`` row's, the median time from the first GPU
OOM to ``cascading`` (detect), to the first action applied (contain) and until every replica
served again (recover; ``-`` when it never did within the scenario). The targets
(bench/README.md): with containment, at most one pod lost and failed requests at most half
of ``off``; nothing shed where there was no cascade.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from detector.config import Settings  # noqa: E402
from detector.sim.loop import Containment, SimOutcome, simulate  # noqa: E402
from detector.sim.scenario import load_scenario, scenario_names  # noqa: E402


def run(scenarios: list[str], seeds: list[int]) -> list[dict[str, Any]]:
    """Return one row per scenario and mode, summed or medianed over ``seeds``."""
    rows: list[dict[str, Any]] = []
    settings = Settings()
    for name in scenarios:
        scenario = load_scenario(name)
        baseline: int | None = None
        for mode in Containment:
            runs = [simulate(scenario, settings, mode=mode, seed=s) for s in seeds]
            row = _row(name, mode, runs)
            baseline = row["failed"] if mode is Containment.OFF else baseline
            row["failed_x_off"] = round(row["failed"] / baseline, 2) if baseline else None
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)
    return rows


def _row(name: str, mode: Containment, runs: list[SimOutcome]) -> dict[str, Any]:
    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return round(statistics.median(known), 1) if len(known) == len(values) else None

    return {
        "scenario": name,
        "containment": mode.value,
        "seeds": [r.seed for r in runs],
        "pods_total": runs[0].pods_total,
        "pods_lost": [r.pods_lost for r in runs],
        "requests": sum(r.requests for r in runs),
        "failed": sum(r.failed_requests for r in runs),
        "shed": sum(r.shed_requests for r in runs),
        "detect_s": median([r.detect_s for r in runs]),
        "contain_s": median([r.contain_s for r in runs]),
        "recover_s": median([r.recover_s for r in runs]),
    }


def _line(row: dict[str, Any]) -> str:
    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    lost = "/".join(str(n) for n in row["pods_lost"])
    ratio = "-" if row["failed_x_off"] is None else f"{row['failed_x_off']:.2f}"
    return (
        f"| {row['scenario']} | {row['containment']} | {lost} of {row['pods_total']} "
        f"| {row['requests']:,} | {row['failed']:,} | {ratio} | {row['shed']:,} "
        f"| {secs(row['detect_s'])} | {secs(row['contain_s'])} | {secs(row['recover_s'])} |"
    )


HEADER = (
    "| scenario | containment | pods lost (per seed) | requests | failed 5xx | x off | shed 429 "
    "| detect s | contain s | recover s |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    """Parse the options, run every scenario and mode, print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=scenario_names())
    parser.add_argument("--seeds", nargs="+", type=int, default=[7, 11, 13])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = run(args.scenarios, args.seeds)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(HEADER)
    for row in rows:
        print(_line(row))


if __name__ == "__main__":
    main()
