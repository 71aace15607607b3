"""The operator commands of containment: approve, deny, arm, disarm, kill-switch, serve.

They change the store of a running detector, so they never create or migrate one: a store
that does not exist or is not at the latest migration is refused (``db.require_head``).
Every change of a control is kept with who, when, why and from where (this host);
``kill-switch status`` shows the latest ones. Everything echoed from input is printed through
``textsafe.printable``.

Exit codes: 0 done; 1 refused (not on the approver allow-list, or the step is not waiting for
approval); 2 error (unknown incident, step or workload, no such store, bad settings, database
failure).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC
from types import FrameType
from typing import Annotated, TypeVar

import typer
from sqlalchemy.orm import Session

from detector import db
from detector.cli.exits import fail, interruptible
from detector.cli.settings import cli_settings
from detector.config import Settings
from detector.errors import ApprovalError, ConfigError, DetectorError
from detector.incidents import service
from detector.notify import flows as notify_flows
from detector.runbooks import approvals, controls
from detector.runbooks.flows import DecisionKind, DecisionRequest
from detector.runbooks.models import StepApproval
from detector.textsafe import printable

T = TypeVar("T")
DbOption = Annotated[
    str | None, typer.Option("--db", help="SQLAlchemy URL (default: DETECTOR_DATABASE__URL)")
]
AsOption = Annotated[str | None, typer.Option("--as", help="who does it (default: the OS user)")]
ReasonOption = Annotated[str, typer.Option(help="why, recorded on the timeline")]
PlanOption = Annotated[
    str,
    typer.Option(
        "--plan",
        help="the plan digest you decide on, as the approval request shows it "
        "(refused if the plan changed since)",
    ),
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="a workload the store has no incident or verdict of")
]


@contextmanager
def _store(settings: Settings) -> Iterator[Session]:
    with db.existing_store(settings.database.url) as session:
        yield session
        session.commit()


_SAFE = (DecisionKind.KILL_SWITCH_ON, DecisionKind.DISARM)  # the brakes: never held back


def _settings(database_url: str | None, safe: bool) -> Settings:
    """Return the command's settings; for a brake, the store's alone when the rest is invalid.

    A bad, unrelated setting (a shared env file) must not keep anyone from the kill switch or
    from disarming: the error is printed as a warning and only the store's URL is used.
    """
    try:
        return cli_settings(database_url, None)
    except ConfigError as exc:
        if not safe:
            raise
        typer.echo(printable(f"warning: {exc}; using the store only", one_line=True), err=True)
        fallback = Settings.model_construct()
        url = database_url or os.environ.get("DETECTOR_DATABASE__URL")
        fallback.database.url = url or fallback.database.url
        return fallback


def _run(
    database_url: str | None, work: Callable[[Settings, Session], T], *, safe: bool = False
) -> T:
    """Run ``work`` in one transaction; map refusals to exit 1 and errors to exit 2."""
    try:
        settings = _settings(database_url, safe)
        with _store(settings) as session:
            return work(settings, session)
    except ApprovalError as exc:
        refused = exc.reason != "not_found"
        hint = "" if refused else "; `detector incidents` lists the keys and steps waiting"
        line = f"refused: {exc.detail}" if refused else f"error: {exc}{hint}"
        typer.echo(printable(line, one_line=True), err=True)
        raise typer.Exit(1 if refused else 2) from exc
    except DetectorError as exc:
        typer.echo(printable(f"error: {exc}", one_line=True), err=True)
        raise typer.Exit(2) from exc


def _decide(request: DecisionRequest, url: str | None) -> None:
    """Carry out ``request`` through the one decide flow and print what it changed."""

    def work(settings: Settings, session: Session) -> str:
        done = notify_flows.decide(
            request,
            session=session,
            approvers=settings.containment.approvers,
            slack=settings.slack,
        )
        row = done.approval
        if row is not None:
            step = f"step {row.position} {row.step_id} of {request.incident}"
            return (
                f"{row.status}: {step} by {row.decided_by}{_dry_run_note(settings, session, row)}"
            )
        control = done.control
        assert control is not None
        store = db.redact(settings.database.url)
        if request.kind is DecisionKind.ARM:
            unless = "unless DETECTOR_DRY_RUN or the kill switch"
            return f"armed: {control.scope} may act for real ({unless}) in {store}"
        if request.kind is DecisionKind.DISARM:
            return f"disarmed: {control.scope} is dry-run only in {store}"
        return _kill_switch_line(settings, session)

    typer.echo(printable(_run(url, work, safe=request.kind in _SAFE)))


def _dry_run_note(settings: Settings, session: Session, row: StepApproval) -> str:
    """Say when an approved step will still change nothing (dry-run or not armed)."""
    if row.status != "approved":
        return ""
    incident = row.incident
    scope = f"{incident.namespace}/{incident.workload}"
    if settings.dry_run:
        return " (dry-run: DETECTOR_DRY_RUN=true here, nothing will change)"
    armed = approvals.is_armed(
        session=session,
        namespace=incident.namespace,
        workload=incident.workload,
        armed_workloads=settings.containment.armed_workloads,
    )
    return "" if armed else f" (dry-run: {scope} is not armed, nothing will change)"


def _kill_switch_line(settings: Settings, session: Session) -> str:
    stored = approvals.control(
        session=session, scope=approvals.GLOBAL_SCOPE, name=approvals.KILL_SWITCH
    )
    setting = settings.containment.kill_switch
    on = bool(stored) or setting
    store = db.redact(settings.database.url)
    where = "the setting DETECTOR_CONTAINMENT__KILL_SWITCH" if setting else f"the store {store}"
    return f"kill switch {'on' if on else 'off'}" + (f" ({where})" if on else f" in {store}")


def _status_lines(settings: Settings, session: Session, limit: int) -> str:
    """Return the kill switch's state, then the latest control changes (latest first)."""
    lines = [_kill_switch_line(settings, session)]
    changes = controls.history(session=session, limit=limit)
    lines.append(f"control changes, latest first ({len(changes)} shown, at most {limit}):")
    for row in changes:
        when = row.changed_at.astimezone(UTC).isoformat(timespec="seconds")
        what = controls.describe(row.scope, row.name, row.enabled)
        why = f": {row.reason}" if row.reason else ""
        lines.append(
            printable(f"  {when}  {what} by {controls.origin_text(row)}{why}", one_line=True)
        )
    if not changes:
        lines.append("  none")
    return "\n".join(lines)


def _check_workload(value: str, database_url: str | None) -> None:
    """Exit 2 with the form expected unless ``value`` is ``NAMESPACE/WORKLOAD``.

    A bare workload name is looked up in the store (when there is one) to name its namespace.
    """
    namespace, _, name = value.partition("/")
    if namespace and name and "/" not in name:
        return
    bare = value if value and "/" not in value else ""
    known = _namespaces_of(bare, database_url) if bare else []
    example = " or ".join(f"{ns}/{bare}" for ns in known) or f"llm/{bare or 'vllm-llama'}"
    fail(f"WORKLOAD must be NAMESPACE/WORKLOAD, e.g. {example}; got {value!r}")


def _namespaces_of(workload: str, database_url: str | None) -> list[str]:
    """Return the namespaces of the store's incidents of ``workload``; none when unreadable."""
    try:
        settings = cli_settings(database_url, None)
        with db.existing_store(settings.database.url) as session:
            rows = service.list_incidents(session=session)
    except DetectorError:
        return []
    return sorted({row.namespace for row in rows if row.workload == workload})[:3]


def _host() -> str:
    """Return this machine's name, recorded with each control change made from the CLI."""
    return socket.gethostname()


@interruptible
def approve_cmd(
    incident: Annotated[str, typer.Argument(help="incident key or id")],
    step: Annotated[str, typer.Argument(help="step id or position")],
    who: Annotated[str, typer.Option("--as", help="approver (on the allow-list)")],
    reason: ReasonOption = "",
    plan: PlanOption = "",
    database_url: DbOption = None,
) -> None:
    """Approve a step waiting for approval; the detector applies it at its next pass."""
    request = DecisionRequest(DecisionKind.APPROVE, "cli", who, reason, incident, step, plan=plan)
    _decide(request, database_url)


@interruptible
def deny_cmd(
    incident: Annotated[str, typer.Argument(help="incident key or id")],
    step: Annotated[str, typer.Argument(help="step id or position")],
    who: Annotated[str, typer.Option("--as", help="approver (on the allow-list)")],
    reason: ReasonOption = "",
    plan: PlanOption = "",
    database_url: DbOption = None,
) -> None:
    """Deny a step waiting for approval: nothing is applied, the next step takes over."""
    request = DecisionRequest(DecisionKind.DENY, "cli", who, reason, incident, step, plan=plan)
    _decide(request, database_url)


@interruptible
def arm_cmd(
    workload: Annotated[str, typer.Argument(help="NAMESPACE/WORKLOAD")],
    who: AsOption = None,
    reason: ReasonOption = "",
    force: ForceOption = False,
    database_url: DbOption = None,
) -> None:
    """Let containment act for real on a workload (it is dry-run until armed)."""
    _check_workload(workload, database_url)
    request = DecisionRequest(
        DecisionKind.ARM, "cli", who or "", reason, workload=workload, force=force, host=_host()
    )
    _decide(request, database_url)


@interruptible
def disarm_cmd(
    workload: Annotated[str, typer.Argument(help="NAMESPACE/WORKLOAD")],
    who: AsOption = None,
    reason: ReasonOption = "",
    database_url: DbOption = None,
) -> None:
    """Make a workload dry-run only again (wins over DETECTOR_CONTAINMENT__ARMED_WORKLOADS).

    Any NAMESPACE/WORKLOAD is accepted, known to the store or not: disarming is never risky.
    """
    _check_workload(workload, database_url)
    request = DecisionRequest(
        DecisionKind.DISARM, "cli", who or "", reason, workload=workload, host=_host()
    )
    _decide(request, database_url)


@interruptible
def kill_switch_cmd(
    state: Annotated[str, typer.Argument(help="on, off or status")],
    who: AsOption = None,
    reason: ReasonOption = "",
    last: Annotated[
        int, typer.Option(min=1, max=1000, help="status: how many control changes to show")
    ] = controls.HISTORY_ROWS,
    database_url: DbOption = None,
) -> None:
    """Hold (on) or release (off) every actuator call of every workload; status shows it.

    ``status`` prints the switch, then the latest changes of every control (kill switch,
    arming): when, what, who, from where and why.
    """
    if state not in ("on", "off", "status"):
        typer.echo("error: STATE must be on, off or status", err=True)
        raise typer.Exit(2)

    if state == "status":
        status = _run(database_url, lambda s, session: _status_lines(s, session, last), safe=True)
        typer.echo(printable(status))
        return
    kind = DecisionKind.KILL_SWITCH_ON if state == "on" else DecisionKind.KILL_SWITCH_OFF
    _decide(DecisionRequest(kind, "cli", who or "", reason, host=_host()), database_url)


@interruptible
def serve_cmd(
    host: Annotated[str | None, typer.Option(help="address (default: DETECTOR_WEB__HOST)")] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="port (default: DETECTOR_WEB__PORT)")
    ] = None,
    database_url: DbOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve the approvals HTTP endpoint (POST /api/incidents/KEY/steps/STEP/approve|deny)
    and, with Slack configured, Slack's interactions (POST /slack/interactions, Socket Mode).

    The store must exist and be migrated (``detector migrate``, or a detector that ran on it).
    """
    import uvicorn

    from detector.web.app import create_app, server_config
    from detector.web.auth import is_loopback

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    try:
        settings = cli_settings(database_url, None)
        db.require_head(settings.database.url)  # the detector's store: a typo must not "work"
    except DetectorError as exc:
        typer.echo(printable(f"error: {exc}", one_line=True), err=True)
        raise typer.Exit(2) from exc
    if not settings.web.tokens and not settings.web.trusted_proxy_header:
        web = settings.web
        reads = "pages and reads are open" if web.public_read or is_loopback(web.host) else (
            "nobody can log in to read")  # fmt: skip
        typer.echo(f"warning: no DETECTOR_WEB__TOKENS: {reads}; every decision, alert and "
                   "lifecycle request is refused (no identity)", err=True)  # fmt: skip
    if not settings.containment.approvers:
        typer.echo("warning: no DETECTOR_CONTAINMENT__APPROVERS: nobody may decide", err=True)
    if settings.slack.enabled:
        how = "Socket Mode" if settings.slack.app_token else "POST /slack/interactions"
        typer.echo(f"slack: posting to {settings.slack.channel or 'per-namespace channels'}, "
                   f"clicks via {how}", err=True)  # fmt: skip
    else:
        typer.echo(
            "slack: not configured (DETECTOR_SLACK__BOT_TOKEN and __CHANNEL): no messages",
            err=True,
        )
    where = (host or settings.web.host, port if port is not None else settings.web.port)
    settings.web.host = where[0]  # reading is open only when bound to loopback
    store = db.redact(settings.database.url)
    typer.echo(f"serving the incident pages and approvals on http://{where[0]}:{where[1]} "
               f"for {store}", err=True)  # fmt: skip
    # uvicorn shuts down on Ctrl-C, then raises SIGINT again with the handler found at start:
    # this one (not Python's default, which asyncio would swap for its own) ends the command
    # as interrupted (exit 130, one line); uvicorn.run would swallow it, Server.run does not
    signal.signal(signal.SIGINT, _interrupt)
    log_level = "info" if verbose else "warning"
    server = uvicorn.Server(server_config(create_app(settings), where[0], where[1], log_level))
    server.run()
    if not server.started:
        fail(f"cannot serve on {where[0]}:{where[1]} (the reason is above)")


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt
