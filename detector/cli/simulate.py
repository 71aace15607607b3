"""``detector simulate``: run a cascade scenario in a closed loop with the detector.

The model of an LLM serving endpoint (``detector.sim``) writes the four streams, the real
detector reads them and contains through its real actuators against a local Kubernetes API
stand-in, and the outcome is printed per client request (a request and its retries): failed,
shed, goodput and latency; then pods lost, time to detect, to contain and to recover. Exit
codes: 0 done; 2 error (unknown scenario, bad settings), said in one line on stderr.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from detector.cli.exits import fail, interruptible
from detector.cli.settings import cli_settings
from detector.errors import DetectorError
from detector.sim.loop import STORE, Containment, SimOutcome, simulate
from detector.sim.scenario import load_scenario, scenario_names
from detector.textsafe import printable


@interruptible
def simulate_cmd(
    scenario: Annotated[
        str,
        typer.Argument(
            help=f"a shipped scenario ({', '.join(scenario_names())}) or a scenario YAML file"
        ),
    ] = "default",
    containment: Annotated[
        Containment,
        typer.Option(help="off: watch only; on: the runbook acts; predictive: on + early 429"),
    ] = Containment.ON,
    seed: Annotated[int | None, typer.Option(help="random seed (default: the scenario's)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the outcome as JSON")] = False,
    record: Annotated[
        Path | None, typer.Option(help="write the streams here, as files `detector replay` reads")
    ] = None,
    keep: Annotated[
        Path | None,
        typer.Option(
            help="keep the store in a folder that holds none yet "
            "(detector incidents --db sqlite:///DIR/sim.db, then show KEY --db ...)"
        ),
    ] = None,
) -> None:
    """Simulate a GPU OOM cascade in a closed loop and print what containment changed.

    The detector's own warnings are not shown (its store, kept with --keep, has them all).
    """
    logging.basicConfig(level=logging.ERROR)
    try:
        spec = load_scenario(scenario)
        settings = cli_settings(None, None)
        outcome = simulate(spec, settings, mode=containment, seed=seed, record=record, workdir=keep)
    except DetectorError as exc:
        fail(str(exc))
    except OSError as exc:  # --record or --keep: a folder that cannot be written
        fail(f"cannot write {exc.filename or record or keep}: {exc.strerror or exc}")
    if as_json:
        typer.echo(outcome_json(outcome))
        return
    typer.echo(printable(outcome_text(outcome)))
    if keep is not None:
        typer.echo(f"store: sqlite:///{keep.resolve() / STORE}", err=True)


def outcome_json(outcome: SimOutcome) -> str:
    """Return the outcome as one JSON object."""
    return json.dumps(outcome.as_dict(), indent=2)


def _span(span: dict[str, Any] | None) -> str:
    """Return the answers logged in the postmortem's span, as its impact counts them."""
    if span is None:
        return "-"
    when = f"{span['start'][11:19]} to {span['end'][11:19]} UTC"
    return (
        f"{when}: {span['responses']:,} responses, {span['answers_5xx']:,} 5xx, "
        f"{span['shed']:,} shed (429 and 413)"
    )


def outcome_text(o: SimOutcome) -> str:
    """Return the outcome as a few aligned lines."""

    def since(value: float | None, never: str) -> str:
        return never if value is None else f"{value:.0f} s after the first GPU OOM"

    def share(n: int) -> str:
        return f"{n:,} ({100 * n / max(1, o.client_requests):.1f}%)"

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:g} s"

    victims = f": {', '.join(o.victims)}" if o.victims else ""
    causes = f" ({', '.join(sorted(set(o.oom_causes)))})" if o.oom_causes else ""
    unfinished = share(o.client_unfinished)
    lost = f"{o.pods_lost} of {o.pods_total} replicas, {len(o.oom_causes)} deaths"
    rows = [
        ("scenario", f"{o.scenario} (seed {o.seed}), containment {o.containment}"),
        ("client requests", f"{o.client_requests:,}; unfinished at the end {unfinished}"),
        ("failed in the end", share(o.client_failed) + ", shed ones included"),
        ("shed at the gateway", share(o.shed_requests)),
        ("goodput", f"{o.goodput_tokens_per_s:,.0f} output tokens/s"),
        ("latency p50 / p99", f"{secs(o.latency_p50_s)} / {secs(o.latency_p99_s)} (successes)"),
        (
            "attempts (retries too)",
            f"{o.attempts:,}: {o.attempts_5xx:,} 5xx, {o.attempts_429:,} 429, "
            f"{o.attempts_413:,} 413",
        ),
        ("answered in the postmortem's span", _span(o.answered_in_span)),
        ("pods lost to GPU OOM", f"{lost}{causes}{victims}"),
        ("other deaths, preemptions", f"{o.non_oom_deaths}, {o.preemptions:,}"),
        ("cascading", since(o.detect_s, "never")),
        ("first containment action", since(o.contain_s, "none")),
        (
            "every pod serving again",
            since(o.recover_s, "-" if o.pods_lost == 0 else "not by the end"),
        ),
        ("incidents", f"{o.incidents}: {o.incident} ({o.stage})" if o.incident else "none"),
        ("verdict", o.verdict or "none"),
        ("actions", "; ".join(o.actions) or "none"),
        ("still in force at the end", "; ".join(o.left_in_force) or "nothing"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
