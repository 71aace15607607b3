"""The live commands: ``detector run``, ``detector produce`` and ``detector incidents``."""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from detector import db
from detector.cli.exits import INTERRUPTED, fail, interruptible
from detector.cli.report import decision_lines
from detector.cli.settings import cli_settings
from detector.config import KafkaSettings, check_topic, load_workload_map
from detector.errors import ConfigError, DetectorError
from detector.events.reader import iter_files
from detector.report.document import decidable, incident_document
from detector.report.read import load_incidents
from detector.stream.app import file_topics, produce_files, run_stream
from detector.textsafe import printable

DbOption = Annotated[
    str | None, typer.Option("--db", help="SQLAlchemy URL (default: DETECTOR_DATABASE__URL)")
]
BootstrapOption = Annotated[
    str | None,
    typer.Option("--bootstrap", help="host:port,... (default: DETECTOR_KAFKA__BOOTSTRAP_SERVERS)"),
]
PartitionsOption = Annotated[
    int | None,
    typer.Option(
        help="partitions of the topics it creates when none exists yet, else the existing "
        "topics' count (default: DETECTOR_KAFKA__PARTITIONS, 4)"
    ),
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
    partitions: PartitionsOption = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="serve /metrics on this port (0: off)")
    ] = None,
    workloads: Annotated[Path | None, typer.Option(help="YAML upstream mapping")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Detect GPU OOM cascades live from Kafka until SIGTERM or SIGINT (at-least-once).

    It logs its configuration and its partitions at start, also without ``-v``.

    SIGTERM stops it after the batch in hand (exit 0); Ctrl-C (SIGINT) too, then says
    ``interrupted`` (exit 130).
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    logging.getLogger(run_stream.__module__).setLevel(logging.INFO)  # start and assignment
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
            "partitions": partitions,
            "metrics_port": metrics_port,
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
    topic: Annotated[
        str | None,
        typer.Option(help="topic of every file (default: each file's own stream topic)"),
    ] = None,
    bootstrap: BootstrapOption = None,
    speed: Annotated[
        float | None,
        typer.Option(help="pace by event time: 1 = as recorded, 10 = ten times faster"),
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="records per second, over 0 (default: max)")
    ] = None,
    partitions: PartitionsOption = None,
    workloads: Annotated[Path | None, typer.Option(help="YAML upstream mapping")] = None,
) -> None:
    """Ship recorded files to their topics, merged in event time, keyed by namespace/workload.

    Each file goes to the topic of its stream in ``DETECTOR_KAFKA__TOPICS`` (container logs,
    Kubernetes events, load-balancer logs, GPU metrics), told from its records' format.
    """
    try:
        _check_produce_options(topic, rate, speed)
        settings = cli_settings(None, workloads)
        updates = {"bootstrap_servers": bootstrap, "partitions": partitions}
        settings.kafka = _kafka_with(
            settings.kafka, {k: v for k, v in updates.items() if v is not None}
        )
        load_workload_map(settings.workloads_file)  # checked before anything connects
        if topic is None:
            files = file_topics(paths, settings.kafka.topics)
        else:
            files = dict.fromkeys(iter_files(paths), topic)
        sent = produce_files(files, settings, rate_per_s=rate, speed=speed)
    except (DetectorError, FileNotFoundError) as exc:
        fail(str(exc))
    for name, count in sent.items():
        typer.echo(printable(f"produced {count} records to {name}"))


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
    approvers, url = settings.containment.approvers, settings.database.url
    for inc in incidents:
        line = f"{inc['key']}  {inc['stage']}  {inc['workload']}  victims={len(inc['pods'])}"
        console.print(printable(line, one_line=True), markup=False, soft_wrap=True)
        for waiting in _waiting(inc, approvers, url):
            console.print(printable(waiting, one_line=True), markup=False, soft_wrap=True)
    if not incidents:
        console.print("no incidents")


def _waiting(inc: dict[str, Any], approvers: Sequence[str], url: str) -> list[str]:
    """Return lines per step of ``inc`` waiting for a person: until when, who may decide it
    now and the exact approve and deny commands (``decidable``, as Slack's buttons)."""
    lines = []
    for step in inc["steps"]:
        approval = step["approval_state"]
        if step["state"] != "awaiting_approval" or approval.get("status") != "pending":
            continue
        what = f"step {step['position']} {step['action']}"
        expires = approval.get("expires_at")
        if not decidable(step):
            who = approval.get("approver_group")
            lines.append(f"  {what} asked {who} until {expires}: expired, no longer decidable")
            continue
        lines.append(f"  waiting: {what} until {expires} (plan {approval.get('plan')})")
        lines += [f"    {x}" for x in decision_lines(inc["key"], step, approvers=approvers, db=url)]
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


def _check_produce_options(topic: str | None, rate: float | None, speed: float | None) -> None:
    """Raise ConfigError naming ``--topic``, ``--rate`` or ``--speed`` when its value makes
    no sense."""
    try:
        if topic is not None:
            check_topic(topic)
    except ValueError as exc:
        raise ConfigError(f"invalid option: --topic: {exc}") from exc
    if rate is not None and not rate > 0:  # also NaN
        raise ConfigError(f"invalid option: --rate: records per second must be over 0, not {rate}")
    if speed is not None and not 0 < speed < math.inf:
        raise ConfigError(f"invalid option: --speed: a factor over 0, not {speed}")
    if rate is not None and speed is not None:
        raise ConfigError("invalid option: --rate and --speed pace differently: give one")


def _first_error(exc: ValidationError) -> str:
    """Return ``--option: message`` of a validation error's first problem."""
    err = exc.errors(include_input=False, include_url=False)[0]
    field = str(err["loc"][0]) if err["loc"] else "settings"
    option = _OPTION_OF.get(field, f"--{field.replace('_', '-')}")
    return f"{option}: {err['msg'].removeprefix('Value error, ')}"
