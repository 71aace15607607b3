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
from detector.cli.settings import cli_settings
from detector.config import KafkaSettings
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
    """Detect GPU OOM cascades live from Kafka until SIGTERM or SIGINT (at-least-once)."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        settings = cli_settings(database_url, workloads)
        kafka = settings.kafka
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
        try:  # validated like the environment's values (ranges, types)
            settings.kafka = KafkaSettings.model_validate(kafka.model_dump() | updates)
        except ValidationError as exc:
            raise ConfigError(f"invalid option: {_first_error(exc)}") from exc
        stop = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            logging.getLogger(__name__).info("stopping signal=%d", signum)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        run_stream(settings, stop)
    except DetectorError as exc:
        typer.echo(printable(f"error: {exc}"), err=True)
        raise typer.Exit(2) from exc


def produce_cmd(
    paths: Annotated[list[Path], typer.Argument(help="recorded stream files or folders")],
    topic: Annotated[str, typer.Option(help="topic to ship the records to")],
    bootstrap: BootstrapOption = None,
    rate: Annotated[float | None, typer.Option(help="records per second (default: max)")] = None,
    workloads: Annotated[Path | None, typer.Option(help="YAML upstream mapping")] = None,
) -> None:
    """Ship recorded files to a topic record by record, keyed by namespace/workload."""
    try:
        settings = cli_settings(None, workloads)
        if bootstrap:
            settings.kafka.bootstrap_servers = bootstrap
        sent = produce_files(paths, topic, settings, rate_per_s=rate)
    except (DetectorError, FileNotFoundError) as exc:
        typer.echo(printable(f"error: {exc}"), err=True)
        raise typer.Exit(2) from exc
    typer.echo(printable(f"produced {sent} records to {topic}"))


def incidents_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON list")] = False,
    database_url: DbOption = None,
) -> None:
    """List the incidents in the database (--json: the ``incidents`` shape of replay --json)."""
    try:
        settings = cli_settings(database_url, None)
        engine = db.make_engine(settings.database.url)
        try:
            with db.session_factory(engine)() as session:
                incidents = [
                    incident_document(i.model_dump(mode="json"))
                    for i in load_incidents(session=session)
                ]
        finally:
            engine.dispose()
    except DetectorError as exc:
        typer.echo(printable(f"error: {exc}"), err=True)
        raise typer.Exit(2) from exc
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


def _first_error(exc: ValidationError) -> str:
    """Return ``field: message`` of a validation error's first problem."""
    err = exc.errors()[0]
    return f"--{'-'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}"
