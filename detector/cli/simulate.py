"""``detector simulate``: run a cascade scenario in a closed loop with the detector.

The model of an LLM serving endpoint (``detector.sim``) writes the four streams, the real
detector reads them and contains through its real actuators against a local Kubernetes API
stand-in, and the outcome is printed: pods lost, failed (5xx) and shed (429) requests, time
to detect, to contain and to recover. Exit codes: 0 done; 2 error (unknown scenario, bad
settings), said in one line on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from detector.cli.exits import fail, interruptible
from detector.cli.settings import cli_settings
from detector.errors import DetectorError
from detector.sim.loop import Containment, SimOutcome, simulate
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
        Path | None, typer.Option(help="keep the store here (`detector show --db ...` reads it)")
    ] = None,
) -> None:
    """Simulate a GPU OOM cascade in a closed loop and print what containment changed."""
    try:
        spec = load_scenario(scenario)
        settings = cli_settings(None, None)
        outcome = simulate(spec, settings, mode=containment, seed=seed, record=record, workdir=keep)
    except DetectorError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(outcome_json(outcome))
        return
    typer.echo(printable(outcome_text(outcome)))
    if keep is not None:
        typer.echo(f"store: sqlite:///{keep / 'sim.db'}", err=True)


def outcome_json(outcome: SimOutcome) -> str:
    """Return the outcome as one JSON object."""
    return json.dumps(outcome.as_dict(), indent=2)


def outcome_text(o: SimOutcome) -> str:
    """Return the outcome as a few aligned lines."""

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f} s"

    rows = [
        ("scenario", f"{o.scenario} (seed {o.seed}), containment {o.containment}"),
        ("pods lost", f"{o.pods_lost} of {o.pods_total}: {', '.join(o.victims) or 'none'}"),
        ("requests", f"{o.requests:,}"),
        ("failed (5xx)", f"{o.failed_requests:,}"),
        ("shed (429)", f"{o.shed_requests:,}"),
        ("detected (cascading)", secs(o.detect_s) + " after the first GPU OOM"),
        ("contained (first action)", secs(o.contain_s) + " after the first GPU OOM"),
        ("every pod serving again", secs(o.recover_s) + " after the first GPU OOM"),
        ("incident", f"{o.incident or 'none'} ({o.stage or '-'})"),
        ("actions", "; ".join(o.actions) or "none"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
