"""The live commands: ``detector run``, ``detector produce`` and ``detector incidents``."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from detector import db
from detector.cli.exits import INTERRUPTED, fail, interruptible
from detector.cli.settings import cli_settings
from detector.config import KafkaSettings, check_topic, load_workload_map
from detector.errors import ConfigError, DetectorError
from detector.report.document import incident_document, past_expiry
from detector.report.read import load_incidents
from detector.stream.app import produce_files, run_stream
from detector.textsafe import printable

DbOption = Annotated[
    str | None, typer.Option("--db", help="SQLAlchemy URL (default: DETECTOR_DATABASE__URL)")
]
BootstrapOption = Annotated[
    str | None,
    typer.Option("--bootstrap", help="host:port,... (default: DETECTOR_KAFKA__BOOTSTRAP_SERVERS)"),
]


@interruptible
def run_cmd(
    database_url: DbOption = None,
    bootstrap: BootstrapOption = None,
    topics: Annotated[
        str | None, typer.Option(help="comma-separated topics (default: the four streams)")
    ] = None,
    group: Annotated[str | None, typer.Option(help="consumer group id")] = None,
    dead_letter_topic: Annotated[str | None, typer.Option(help="dead-letter topic")] = None,
    fetch_max_wait_ms: Annotated[int | None, typer.Option(help="broker fetch wait, ms")] = None,
    session_timeout_ms: Annotated[int | None, typer.Option(help="group session, ms")] = None,
    max_poll_interval_ms: Annotated[int | None, typer.Option(help="max poll gap, ms")] = None,
    max_poll_records: Annotated[int | None, typer.Option(help="records per batch")] = None,
    workloads: Annotated[Path | None, typer.Option(help="YAML upstream mapping")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Detect GPU OOM cascades live from Kafka until SIGTERM or SIGINT (at-least-once).

    SIGTERM stops it after the batch in hand (exit 0); Ctrl-C (SIGINT) too, then says
    ``interrupted`` (exit 130).
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    stop = threading.Event()
    received: list[int] = []  # the signals that stopped it
    try:
        settings = cli_settings(database_url, workloads)
        options = {
            "bootstrap_servers": bootstrap,
            "topics": topics.split(",") if topics else None,
            "group_id": group,
            "dead_letter_topic": dead_letter_topic,
            "fetch_max_wait_ms": fetch_max_wait_ms,
            "session_timeout_ms": session_timeout_ms,
            "max_poll_interval_ms": max_poll_interval_ms,
            "max_poll_records": max_poll_records,
        }
        updates = {k: v for k, v in options.items() if v is not None}
        settings.kafka = _kafka_with(settings.kafka, updates)
        load_workload_map(settings.workloads_file)  # checked before anything connects
        received = _stop_on_signals(stop)
        run_stream(settings, stop)
    except DetectorError as exc:
        if signal.SIGINT not in received:
            fail(str(exc))
    if signal.SIGINT in received:
        typer.echo("interrupted: stopped cleanly, what was processed is committed", err=True)
        raise typer.Exit(INTERRUPTED)


def _stop_on_signals(stop: threading.Event) -> list[int]:
    """Set ``stop`` on SIGTERM and SIGINT; return the list the signals received go into."""
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("stopping signal=%d", signum)
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return received


@interruptible
def produce_cmd(
    paths: Annotated[list[Path], typer.Argument(help="recorded stream files or folders")],
    topic: Annotated[str, typer.Option(help="topic to ship the records to")],
    bootstrap: BootstrapOption = None,
    rate: Annotated[
        float | None, typer.Option(help="records per second, over 0 (default: max)")
    ] = None,
    workloads: Annotated[Path | None, typer.Option(help="YAML upstream mapping")] = None,
) -> None:
    """Ship recorded files to a topic record by record, keyed by namespace/workload."""
    try:
        _check_produce_options(topic, rate)
        settings = cli_settings(None, workloads)
        if bootstrap is not None:
            settings.kafka = _kafka_with(settings.kafka, {"bootstrap_servers": bootstrap})
        load_workload_map(settings.workloads_file)  # checked before anything connects
        sent = produce_files(paths, topic, settings, rate_per_s=rate)
    except (DetectorError, FileNotFoundError) as exc:
        fail(str(exc))
    typer.echo(printable(f"produced {sent} records to {topic}"))


@interruptible
def incidents_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON list")] = False,
    database_url: DbOption = None,
) -> None:
    """List the incidents in the database (--json: the ``incidents`` shape of replay --json).

    It only reads: a store that does not exist or is not migrated is an error (exit 2).
    """
    try:
        settings = cli_settings(database_url, None)
        with db.existing_store(settings.database.url) as session:
            incidents = [
                incident_document(i.model_dump(mode="json"))
                for i in load_incidents(session=session)
            ]
    except DetectorError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(incidents, indent=2, default=str))
        return
    console = Console()
    for inc in incidents:
        line = f"{inc['key']}  {inc['stage']}  {inc['workload']}  victims={len(inc['pods'])}"
        console.print(printable(line, one_line=True), markup=False, soft_wrap=True)
        for waiting in _waiting(inc):
            console.print(printable(waiting, one_line=True), markup=False, soft_wrap=True)
    if not incidents:
        console.print("no incidents")


def _waiting(inc: dict[str, Any]) -> list[str]:
    """Return a line per step of ``inc`` waiting for a person: what to approve, and until when."""
    lines = []
    for step in inc["steps"]:
        approval = step["approval_state"]
        if step["state"] != "awaiting_approval" or approval.get("status") != "pending":
            continue
        plan, who = approval.get("plan"), approval.get("approver_group")
        expires = approval.get("expires_at")
        if past_expiry(approval) is not None:
            lines.append(
                f"  step {step['position']} {step['action']} asked {who} until {expires}: "
                "expired, no longer decidable"
            )
            continue
        lines.append(
            f"  waiting: step {step['position']} {step['action']} for {who} (plan {plan}) "
            f"until {approval.get('expires_at')}: "
            f"detector approve|deny {inc['key']} {step['position']} --plan {plan}"
        )
    return lines


_OPTION_OF = {"bootstrap_servers": "--bootstrap", "group_id": "--group"}


def _kafka_with(kafka: KafkaSettings, updates: dict[str, Any]) -> KafkaSettings:
    """Return ``kafka`` with the command's options, validated like the environment's values.

    Raises ConfigError naming the option (``--max-poll-records: ...``).
    """
    try:
        return KafkaSettings.model_validate(kafka.model_dump() | updates)
    except ValidationError as exc:
        raise ConfigError(f"invalid option: {_first_error(exc)}") from exc


def _check_produce_options(topic: str, rate: float | None) -> None:
    """Raise ConfigError naming ``--topic`` or ``--rate`` when its value makes no sense."""
    try:
        check_topic(topic)
    except ValueError as exc:
        raise ConfigError(f"invalid option: --topic: {exc}") from exc
    if rate is not None and not rate > 0:  # also NaN
        raise ConfigError(f"invalid option: --rate: records per second must be over 0, not {rate}")


def _first_error(exc: ValidationError) -> str:
    """Return ``--option: message`` of a validation error's first problem."""
    err = exc.errors(include_input=False, include_url=False)[0]
    field = str(err["loc"][0]) if err["loc"] else "settings"
    option = _OPTION_OF.get(field, f"--{field.replace('_', '-')}")
    return f"{option}: {err['msg'].removeprefix('Value error, ')}"
