"""The operator commands of containment: approve, deny, arm, disarm, kill-switch, serve.

Exit codes: 0 done; 1 refused (not on the approver allow-list, or the step is not waiting for
approval); 2 error (unknown incident or step, bad settings, database failure).
"""

from __future__ import annotations

import getpass
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, TypeVar

import typer
from sqlalchemy.orm import Session

from detector import db
from detector.cli.settings import cli_settings
from detector.config import Settings
from detector.errors import DetectorError
from detector.runbooks import approvals
from detector.runbooks.approvals import ApprovalError

T = TypeVar("T")
DbOption = Annotated[
    str | None, typer.Option("--db", help="SQLAlchemy URL (default: DETECTOR_DATABASE__URL)")
]
AsOption = Annotated[str | None, typer.Option("--as", help="who does it (default: the OS user)")]
ReasonOption = Annotated[str, typer.Option(help="why, recorded on the timeline")]


@contextmanager
def _store(settings: Settings) -> Iterator[Session]:
    db.upgrade(settings.database.url)
    engine = db.make_engine(settings.database.url)
    try:
        with db.session_factory(engine)() as session:
            yield session
            session.commit()
    finally:
        engine.dispose()


def _run(database_url: str | None, work: Callable[[Settings, Session], T]) -> T:
    """Run ``work`` in one transaction; map refusals to exit 1 and errors to exit 2."""
    try:
        settings = cli_settings(database_url, None)
        with _store(settings) as session:
            return work(settings, session)
    except ApprovalError as exc:
        typer.echo(
            f"refused: {exc.detail}" if exc.code != "not_found" else f"error: {exc}", err=True
        )
        raise typer.Exit(2 if exc.code == "not_found" else 1) from exc
    except DetectorError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _decide(incident: str, step: str, who: str, reason: str, url: str | None, ok: bool) -> None:
    def work(settings: Settings, session: Session) -> str:
        allowed = settings.containment.approvers
        if not allowed:
            raise ApprovalError(
                "forbidden", "no approvers configured: set DETECTOR_CONTAINMENT__APPROVERS"
            )
        row = approvals.decide(
            session=session,
            incident_ref=incident,
            step_ref=step,
            approve=ok,
            approver=who,
            via="cli",
            approvers=allowed,
            reason=reason,
        )
        return f"{row.status}: step {row.position} {row.step_id} of {incident} by {who}"

    typer.echo(_run(url, work))


def approve_cmd(
    incident: Annotated[str, typer.Argument(help="incident key or id")],
    step: Annotated[str, typer.Argument(help="step id or position")],
    who: Annotated[str, typer.Option("--as", help="approver (on the allow-list)")],
    reason: ReasonOption = "",
    database_url: DbOption = None,
) -> None:
    """Approve a step waiting for approval; the detector applies it at its next pass."""
    _decide(incident, step, who, reason, database_url, True)


def deny_cmd(
    incident: Annotated[str, typer.Argument(help="incident key or id")],
    step: Annotated[str, typer.Argument(help="step id or position")],
    who: Annotated[str, typer.Option("--as", help="approver (on the allow-list)")],
    reason: ReasonOption = "",
    database_url: DbOption = None,
) -> None:
    """Deny a step waiting for approval: nothing is applied, the next step takes over."""
    _decide(incident, step, who, reason, database_url, False)


def _arm(workload: str, armed: bool, who: str | None, reason: str, url: str | None) -> None:
    def work(_: Settings, session: Session) -> str:
        scope = approvals.workload_scope(workload)
        by = who or getpass.getuser()
        approvals.set_control(
            session=session, scope=scope, name=approvals.ARMED, enabled=armed, by=by, reason=reason
        )
        if armed:
            return f"armed: {scope} may act for real (unless DETECTOR_DRY_RUN or the kill switch)"
        return f"disarmed: {scope} is dry-run only"

    typer.echo(_run(url, work))


def arm_cmd(
    workload: Annotated[str, typer.Argument(help="NAMESPACE/WORKLOAD")],
    who: AsOption = None,
    reason: ReasonOption = "",
    database_url: DbOption = None,
) -> None:
    """Let containment act for real on a workload (it is dry-run until armed)."""
    _arm(workload, True, who, reason, database_url)


def disarm_cmd(
    workload: Annotated[str, typer.Argument(help="NAMESPACE/WORKLOAD")],
    who: AsOption = None,
    reason: ReasonOption = "",
    database_url: DbOption = None,
) -> None:
    """Make a workload dry-run only again (wins over DETECTOR_CONTAINMENT__ARMED_WORKLOADS)."""
    _arm(workload, False, who, reason, database_url)


def kill_switch_cmd(
    state: Annotated[str, typer.Argument(help="on, off or status")],
    who: AsOption = None,
    reason: ReasonOption = "",
    database_url: DbOption = None,
) -> None:
    """Hold (on) or release (off) every actuator call of every workload; status shows it."""
    if state not in ("on", "off", "status"):
        typer.echo("error: STATE must be on, off or status", err=True)
        raise typer.Exit(2)

    def work(settings: Settings, session: Session) -> str:
        if state != "status":
            approvals.set_control(
                session=session,
                scope=approvals.GLOBAL_SCOPE,
                name=approvals.KILL_SWITCH,
                enabled=state == "on",
                by=who or getpass.getuser(),
                reason=reason,
            )
        stored = approvals.control(
            session=session, scope=approvals.GLOBAL_SCOPE, name=approvals.KILL_SWITCH
        )
        setting = settings.containment.kill_switch
        on = bool(stored) or setting
        where = "the setting DETECTOR_CONTAINMENT__KILL_SWITCH" if setting else "the store"
        return f"kill switch {'on' if on else 'off'}" + (f" ({where})" if on else "")

    typer.echo(_run(database_url, work))


def serve_cmd(
    host: Annotated[str | None, typer.Option(help="address (default: DETECTOR_WEB__HOST)")] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="port (default: DETECTOR_WEB__PORT)")
    ] = None,
    database_url: DbOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve the approvals HTTP endpoint (POST /api/incidents/KEY/steps/STEP/approve|deny)."""
    import uvicorn

    from detector.web.app import create_app

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    try:
        settings = cli_settings(database_url, None)
    except DetectorError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if not settings.web.tokens:
        typer.echo("warning: no DETECTOR_WEB__TOKENS: every request will be refused", err=True)
    uvicorn.run(
        create_app(settings),
        host=host or settings.web.host,
        port=port if port is not None else settings.web.port,
        log_level="info" if verbose else "warning",
    )
