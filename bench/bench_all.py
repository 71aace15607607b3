"""Run the benchmarks one after the other; write bench/RESULTS.md and the README's table.

Run: ``make bench-all`` or ``.venv/bin/python bench/bench_all.py [--records N]
[--storm-records N] [--runs N] [--only NAME ...]``. Not a test: it measures, compares each
figure with its target and exits non-zero only when a benchmark failed to run (a missed target
is a figure, not a failure). bench/README.md ("bench-all, RESULTS.md and reading a
regression") explains the output.

Each benchmark (``bench_replay``, ``bench_kafka``, ``bench_storm``, ``bench_slack`` with
``--store sqlite`` and with a PostgreSQL admin URL, skipped with a note when the server cannot
be reached) runs as a child process with ``--json`` into a temporary folder, its output
streamed to the terminal. Then ``bench/RESULTS.md`` gets a header (UTC date, commit, machine,
Python, sizes), one table of figure, measured value, baseline in the same run, ratio, target
and whether it is met, and the raw printed tables; the same header line and table replace what
stands between the ``bench-results`` markers of README.md's "Performance" section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "RESULTS.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- bench-results:begin -->", "<!-- bench-results:end -->"
POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
NAMES = ("replay", "kafka", "storm", "slack-sqlite", "slack-postgresql")
ALIASES = {"slack": ("slack-sqlite", "slack-postgresql")}


@dataclass
class Run:
    """One benchmark child: its command line, printed output, exit status and JSON figures."""

    name: str
    cmd: list[str]
    output: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""

    @property
    def shown(self) -> str:
        """The command line as a person would type it (relative paths, no ``--json``)."""
        args = self.cmd[1:]
        if "--json" in args:
            i = args.index("--json")
            args = args[:i] + args[i + 2 :]
        args[0] = os.path.relpath(args[0], ROOT)  # the script
        return " ".join([".venv/bin/python", *args])

    @property
    def problem(self) -> str:
        """Why this run gave no figures ('' when it gave them)."""
        if self.skipped:
            return f"not run: {self.skipped}"
        if self.returncode is None:
            return "not run (--only)"
        if self.returncode != 0:
            return f"failed (exit status {self.returncode})"
        return "" if self.figures else "failed (no JSON figures written)"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, write RESULTS.md and the README's table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, help="records for bench_replay and bench_kafka")
    parser.add_argument("--storm-records", type=int, default=1_000_000, help="bench_storm")
    parser.add_argument("--runs", type=int, help="latency runs of bench_kafka and bench_slack")
    parser.add_argument(
        "--only", nargs="+", choices=(*NAMES, *ALIASES), metavar="NAME",
        help=f"run only these: {', '.join(NAMES)} (slack: both stores)",
    )  # fmt: skip
    parser.add_argument("--postgres", default=POSTGRES, help="admin URL for bench_slack")
    args = parser.parse_args(argv)
    only = {n for name in args.only or NAMES for n in ALIASES.get(name, (name,))}
    meta = _meta(args)  # before the runs: the commit and tree that are measured
    with tempfile.TemporaryDirectory(prefix="bench-all-") as tmp:
        runs = [_plan(name, args, Path(tmp)) for name in NAMES]
        for run in runs:
            if run.name not in only:
                continue
            if run.name == "slack-postgresql" and (why := _postgres_unreachable(args.postgres)):
                run.skipped = f"PostgreSQL at {_hide(args.postgres)} unreachable ({why})"
                print(f"\n=== {run.name}: skipped, {run.skipped}", flush=True)
                continue
            _execute(run, Path(tmp) / f"{run.name}.json")
    by_name = {run.name: run for run in runs}
    block = _block(meta, _rows(by_name))
    RESULTS.write_text(_results_md(block, runs))
    readme = _update_readme(block)
    print(f"\nwrote {RESULTS.relative_to(ROOT)}; {readme}\n\n{block}")
    failed = [run.name for run in runs if run.returncode is not None and run.problem]
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


# --- running ---------------------------------------------------------------------------------


def _plan(name: str, args: argparse.Namespace, folder: Path) -> Run:
    """Return the child's command line for benchmark ``name``."""
    script = {"replay": "bench_replay.py", "kafka": "bench_kafka.py", "storm": "bench_storm.py"}
    cmd = [sys.executable, str(BENCH / script.get(name, "bench_slack.py"))]
    if name in ("replay", "kafka") and args.records:
        cmd += ["--records", str(args.records)]
    if name == "storm":
        cmd += ["--records", str(args.storm_records)]
    if name.startswith("slack-"):
        cmd += ["--store", "sqlite" if name == "slack-sqlite" else args.postgres]
    if (name == "kafka" or name.startswith("slack-")) and args.runs:
        cmd += ["--runs", str(args.runs)]
    return Run(name, [*cmd, "--json", str(folder / f"{name}.json")])


def _execute(run: Run, json_path: Path) -> None:
    """Run the child, streaming its stdout to the terminal and keeping a copy; read its JSON."""
    print(f"\n=== {run.name}: {run.shown}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(run.cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    run.returncode = proc.wait()
    run.seconds = time.perf_counter() - start
    run.output = "".join(lines).rstrip("\n")
    if json_path.exists():
        run.figures = json.loads(json_path.read_text())
    print(f"=== {run.name}: exit status {run.returncode} in {run.seconds:.0f} s", flush=True)


def _postgres_unreachable(url: str) -> str:
    """Return why PostgreSQL at ``url`` cannot be reached ('' when it answers)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        engine = create_engine(url, connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except (SQLAlchemyError, ImportError, OSError) as exc:
        lines = str(exc).strip().splitlines()
        return lines[0] if lines else type(exc).__name__
    return ""


def _hide(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# --- the header ------------------------------------------------------------------------------


def _meta(args: argparse.Namespace) -> str:
    """Return the header line: UTC date, commit, machine, Python and the sizes asked for."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = _git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = (
        " + uncommitted changes" if _git("status", "--porcelain", "--untracked-files=no") else ""
    )
    sizes = [
        f"replay/kafka {args.records:,} records" if args.records else "replay/kafka defaults",
        f"storm {args.storm_records:,} records",
        f"{args.runs} latency runs" if args.runs else "default latency runs",
    ]
    return (
        f"Measured {now} on commit `{commit}`{dirty}; {_cpu()}, {os.cpu_count()} cores"
        f"{_memory()}; Python {platform.python_version()}; {', '.join(sizes)}."
    )


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.strip()


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f", {int(line.split()[1]) / 1024**2:.0f} GiB"
    except OSError:
        pass
    return ""


# --- the table -------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table; ``met`` is None where there is no target or no figure."""

    figure: str
    measured: str
    baseline: str = "-"
    ratio: str = "-"
    target: str = "-"
    met: bool | None = None


def _rows(runs: dict[str, Run]) -> list[Row]:
    """Return the table's rows: the figures held against targets, in a fixed order."""
    replay, kafka, storm = (runs[n] for n in ("replay", "kafka", "storm"))
    rows = [
        _throughput(kafka, "Live loop throughput (`bench_kafka` product)", "bare `poll()`", 0.8),
        _live_rss(kafka),
        _latency(kafka),
        _throughput(replay, "Replay throughput (`bench_replay` product)", "read + `json.loads`"),
        _core_own_work(replay),
        _storm_flat(storm),
    ]
    for store, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        run = runs[f"slack-{store}"]
        rows.append(
            _slack(run, "cascading", f"Record -> Slack message telling CASCADING, p99, {label}")
        )
    for store, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        run = runs[f"slack-{store}"]
        rows.append(_slack(run, "root", f"Record -> Slack root message, p99, {label}"))
    return rows


def _missing(run: Run, figure: str, target: str) -> Row | None:
    return Row(figure, run.problem, target=target) if run.problem else None


def _phase(run: Run, phase: str) -> dict[str, Any]:
    return dict(run.figures.get("phases", {}).get(phase, {"error": "no such phase"}))


def _throughput(run: Run, figure: str, base_name: str, target: float | None = None) -> Row:
    shown = f">= {target:.2f}x" if target else "-"
    if missing := _missing(run, figure, shown):
        return missing
    product, base = _phase(run, "product"), _phase(run, "baseline")
    if "error" in product or "error" in base:
        return Row(figure, f"failed: {product.get('error') or base.get('error')}", target=shown)
    ratio = product["x_baseline"]
    if ratio is None:
        return Row(figure, "failed: no time span measured", target=shown)
    return Row(
        figure,
        f"{product['records_per_s']:,.0f} records/s",
        f"{base['records_per_s']:,.0f} records/s ({base_name})",
        f"{ratio:.2f}x",
        shown,
        ratio >= target if target else None,
    )


def _live_rss(run: Run) -> Row:
    figure, target = "Live loop peak RSS (`bench_kafka` product)", "<= 150 MiB"
    if missing := _missing(run, figure, target):
        return missing
    product, base = _phase(run, "product"), _phase(run, "baseline")
    if "error" in product:
        return Row(figure, f"failed: {product['error']}", target=target)
    rss = product["peak_rss_mib"]
    base_rss = base.get("peak_rss_mib")
    return Row(
        figure,
        f"{rss:.0f} MiB",
        f"{base_rss:.0f} MiB (bare `poll()`)" if base_rss else "-",
        f"{rss / base_rss:.2f}x" if base_rss else "-",
        target,
        rss <= 150.0,
    )


def _latency(run: Run) -> Row:
    figure, target = (
        "Record -> incident stored `cascading`, p99 (`bench_kafka` latency)",
        "<= 250 ms",
    )
    if missing := _missing(run, figure, target):
        return missing
    lat = run.figures.get("latency", {})
    if "p99_ms" not in lat:
        why = lat.get("error") or "; ".join(lat.get("failures", [])) or "no run"
        return Row(figure, f"failed: {why}", target=target, met=False)
    runs = lat["n"] + len(lat["failures"])
    measured = f"{lat['p99_ms']:.0f} ms (p50 {lat['p50_ms']:.0f}, n={lat['n']} of {runs})"
    return Row(figure, measured, target=target, met=lat["p99_ms"] <= 250.0 and not lat["failures"])


def _core_own_work(run: Run) -> Row:
    figure = "Core own work per record (`bench_replay` core us/record minus baseline's)"
    target = "<= 3 us"
    if missing := _missing(run, figure, target):
        return missing
    core, base = _phase(run, "core"), _phase(run, "baseline")
    if "error" in core or "error" in base:
        return Row(figure, f"failed: {core.get('error') or base.get('error')}", target=target)
    own, base_us = core["us_per_record"] - base["us_per_record"], base["us_per_record"]
    return Row(
        figure,
        f"{own:.2f} us ({core['us_per_record']:.2f} - {base_us:.2f})",
        f"{base_us:.2f} us/record (read + `json.loads`)",
        f"{own / base_us:.2f}x",
        target,
        own <= 3.0,
    )


def _storm_flat(run: Run) -> Row:
    figure = "`detector run` RSS through the storm, 100 % / 10 % (`bench_storm` product)"
    target = "<= 1.10x"
    if missing := _missing(run, figure, target):
        return missing
    product = _phase(run, "product")
    shares = [str(q) for q in run.figures.get("shares", [])]
    at = product.get("rss_at_mib", {})
    if "error" in product or product.get("last_first") is None or not shares:
        return Row(figure, f"failed: {product.get('error', 'no RSS samples')}", target=target)
    if product.get("first_share", 0.0) > float(shares[0]):
        seen = f"{product['first_share']:.0%} ({product.get('samples')} sample(s))"
        return Row(figure, f"not measured: first offset commit seen at {seen}", target=target)
    ratio = product["last_first"]
    return Row(
        figure,
        f"{at[shares[-1]]:.0f} MiB at 100 % (peak {product['peak_rss_mib']:.0f})",
        f"{at[shares[0]]:.0f} MiB at 10 %",
        f"{ratio:.2f}x",
        target,
        ratio <= 1.1,
    )


def _slack(run: Run, kind: str, figure: str) -> Row:
    target = "<= 1000 ms"
    if missing := _missing(run, figure, target):
        return missing
    lat = run.figures.get("latency", {}).get(kind, {})
    if "p99_ms" not in lat:
        return Row(figure, "failed: no such message in any run", target=target, met=False)
    runs = run.figures["runs"]
    measured = f"{lat['p99_ms']:.0f} ms (p50 {lat['p50_ms']:.0f}, n={lat['n']} of {runs})"
    return Row(figure, measured, target=target, met=lat["p99_ms"] <= 1000.0 and lat["n"] == runs)


# --- the files -------------------------------------------------------------------------------


def _block(meta: str, rows: list[Row]) -> str:
    """Return the header line and the table (what RESULTS.md and README.md both carry)."""
    met = {True: "yes", False: "**no**", None: "-"}
    lines = [
        meta,
        "",
        "| figure | measured | baseline (same run) | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.figure} | {r.measured} | {r.baseline} | {r.ratio} | {r.target} | {met[r.met]} |"
        for r in rows
    ]
    return "\n".join(lines)


def _results_md(block: str, runs: list[Run]) -> str:
    """Return bench/RESULTS.md: the block, how to read it, and each benchmark's raw output."""
    parts = [
        "# Benchmark results",
        "",
        "Generated by `make bench-all` (`bench/bench_all.py`); do not edit by hand. Every ratio\n"
        "is against a baseline measured in the same run on the same machine; compare figures\n"
        'only between runs on the same machine class (`bench/README.md`, "bench-all,\n'
        'RESULTS.md and reading a regression").',
        "",
        block,
        "",
        "## Raw output",
    ]
    for run in runs:
        parts += ["", f"### {run.name}", ""]
        if run.returncode is None:
            parts.append(run.problem.capitalize() + ".")
            continue
        parts += [
            f"`{run.shown}`: exit status {run.returncode}, {run.seconds:.0f} s.",
            "",
            "```text",
            run.output,
            "```",
        ]
    return "\n".join(parts) + "\n"


def _update_readme(block: str) -> str:
    """Replace what stands between the README's markers with ``block``; say what was done."""
    text = README.read_text()
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        return f"README.md left alone: no {BEGIN} ... {END} markers"
    new = f"{text[: begin + len(BEGIN)]}\n\n{block}\n\n{text[end:]}"
    if new == text:
        return "README.md unchanged"
    README.write_text(new)
    return "README.md's performance table replaced"


if __name__ == "__main__":
    raise SystemExit(main())
