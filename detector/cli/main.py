"""The ``detector`` command line: the entry point that builds Settings and passes them down."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

from detector import db
from detector.cli.approvals import (
    approve_cmd,
    arm_cmd,
    deny_cmd,
    disarm_cmd,
    kill_switch_cmd,
    serve_cmd,
)
from detector.cli.ceilings import ceilings_cmd
from detector.cli.classify import classify_cmd
from detector.cli.exits import INTERRUPTED, fail, interruptible
from detector.cli.explain import explain_cmd
from detector.cli.gpu import gpu_sample_cmd
from detector.cli.options import Container, Namespace, Owner, Pod, WorkloadsFile
from detector.cli.postmortem import postmortem_cmd
from detector.cli.report import render_report
from detector.cli.settings import cli_settings as _settings
from detector.cli.show import dead_letters_cmd, show_cmd
from detector.cli.simulate import simulate_cmd
from detector.cli.stream import incidents_cmd, produce_cmd, run_cmd
from detector.config import Settings
from detector.errors import DetectorError
from detector.events.reader import total_bytes
from detector.events.sources.raw_text import LogIdentity
from detector.notify.senders import deliver as deliver_events
from detector.notify.slack.notifier import deliver
from detector.pipeline import replay
from detector.report.document import ReplayResult, to_document
from detector.textsafe import printable

app = typer.Typer(help="Detect and contain GPU OOM cascading failures.", no_args_is_help=True)
PROGRESS_MIN_BYTES = 5 * 2**20  # show a progress bar for inputs larger than this
app.command("classify")(classify_cmd)
app.command("ceilings")(ceilings_cmd)
app.command("explain")(explain_cmd)


app.command("run")(run_cmd)
app.command("produce")(produce_cmd)
app.command("incidents")(incidents_cmd)
app.command("show")(show_cmd)
app.command("dead-letters")(dead_letters_cmd)
app.command("gpu-sample")(gpu_sample_cmd)
app.command("approve")(approve_cmd)
app.command("deny")(deny_cmd)
app.command("arm")(arm_cmd)
app.command("disarm")(disarm_cmd)
app.command("kill-switch")(kill_switch_cmd)
app.command("serve")(serve_cmd)
app.command("postmortem")(postmortem_cmd)
app.command("simulate")(simulate_cmd)


@app.command("replay")
@interruptible
def replay_cmd(
    paths: Annotated[list[Path], typer.Argument(help="recorded stream files or folders")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    database_url: Annotated[
        str | None, typer.Option("--db", help="SQLAlchemy URL (default: DETECTOR_DATABASE__URL)")
    ] = None,
    workloads: WorkloadsFile = None,
    namespace: Namespace = None,
    pod: Pod = None,
    container: Container = None,
    workload: Owner = None,
    notify: Annotated[
        bool, typer.Option("--notify", help="post the incidents to Slack (DETECTOR_SLACK__*)")
    ] = False,
    page: Annotated[
        bool, typer.Option("--page", help="page PagerDuty too (DETECTOR_PAGERDUTY__*), a drill")
    ] = False,
    annotate: Annotated[
        bool, typer.Option("--annotate", help="annotate Grafana too (DETECTOR_GRAFANA__*)")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Replay recorded streams, detect GPU OOM cascades, plan containment (dry-run).

    Plain-text logs (one pod's raw log, e.g. from kubectl logs) need --namespace and --pod.
    With --notify, the incidents are posted to Slack as ``detector run`` would (a drill);
    PagerDuty is paged only with --page, Grafana annotated only with --annotate.
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    err = Console(stderr=True)
    try:
        settings = _settings(database_url, workloads)
        identity = None
        if namespace or pod:
            identity = LogIdentity(namespace, pod, container, workload, settings.cluster)
        result = _run_replay(
            paths,
            settings,
            show_progress=not as_json,
            console=err,
            identity=identity,
            notify=notify,
            page=page,
            annotate=annotate,
        )
    except (DetectorError, FileNotFoundError) as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(to_document(result), indent=2, default=str))
    else:
        approvers, url = settings.containment.approvers, settings.database.url
        render_report(result, Console(), approvers=approvers, db=url)
    if notify:
        _deliver(settings, err)
    if page or annotate:
        _send_events(settings, err, page=page, annotate=annotate)


def _run_replay(
    paths: list[Path],
    settings: Settings,
    *,
    show_progress: bool,
    console: Console,
    identity: LogIdentity | None,
    notify: bool = False,
    page: bool = False,
    annotate: bool = False,
) -> ReplayResult:
    size = total_bytes(paths)
    if not show_progress or size < PROGRESS_MIN_BYTES:
        return replay(paths, settings, identity=identity, notify=notify, page=page,
                      annotate=annotate)  # fmt: skip
    columns = (BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("replay", total=size)
        advance = lambda n: bar.advance(task, n)  # noqa: E731
        return replay(paths, settings, progress=advance, identity=identity, notify=notify,
                      page=page, annotate=annotate)  # fmt: skip


def _deliver(settings: Settings, err: Console) -> None:
    """Post what the replay queued for Slack; say what is left (it stays in the outbox)."""
    kept = "kept in the outbox: the next replay --notify, run or serve sends it"
    try:
        sent = deliver(settings)
    except DetectorError as exc:
        err.print(f"[red]error:[/red] Slack: {escape(printable(str(exc)))} ({kept})")
        raise typer.Exit(1) from exc
    err.print(f"Slack: {sent.messages} messages posted or updated")
    if sent.held:
        err.print(
            f"[red]error:[/red] Slack: {sent.held} incident(s) held by another sender (a "
            f"detector running, or one that died: its lease ends within "
            f"{settings.slack.lease_s:.0f} s); {kept}"
        )
        raise typer.Exit(1)


def _send_events(settings: Settings, err: Console, *, page: bool, annotate: bool) -> None:
    """Send what the replay queued for PagerDuty and Grafana; say what is left (it stays in
    the outbox)."""
    try:
        found = deliver_events(settings, page=page, annotate=annotate)
    except DetectorError as exc:
        err.print(f"[red]error:[/red] {escape(printable(str(exc)))}")
        raise typer.Exit(1) from exc
    left = 0
    for target, (sent, pending) in found.items():
        err.print(f"{target}: {sent} events sent")
        if pending:
            err.print(f"[red]error:[/red] {target}: {pending} event(s) kept in the outbox "
                      "(retried by the next replay, run or serve)")  # fmt: skip
        left += pending
    if left:
        raise typer.Exit(1)


@app.command("migrate")
@interruptible
def migrate_cmd(
    database_url: Annotated[str | None, typer.Option("--db", help="SQLAlchemy URL")] = None,
) -> None:
    """Bring the incident store's schema to the latest migration (alembic upgrade head)."""
    try:
        settings = _settings(database_url, None)
        db.upgrade(settings.database.url)
    except DetectorError as exc:
        fail(str(exc))
    typer.echo(printable(f"database at head: {db.redact(settings.database.url)}"))


def main() -> None:
    """Run the command line (``detector``, ``python -m detector``).

    A usage error (an unknown option, a bad value, a missing argument) is one line on stderr
    naming the command's ``--help``, exit 2, instead of click's boxed usage text; no arguments
    print the help, as before.
    """
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        typer.echo("interrupted", err=True)
        raise SystemExit(INTERRUPTED) from None
    except typer.TyperException as exc:  # click's usage errors and exceptions, as typer has them
        ctx = getattr(exc, "ctx", None)
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        line = printable(f"error: {exc.format_message()}{where}", one_line=True)
        typer.echo(line, err=True)
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
