"""``detector postmortem``: export an incident's postmortem draft (Markdown, HTML or JSON).

It reads the store of a running detector, so it never creates or migrates one
(``db.require_head``). Without ``-o`` the document goes to stdout; with ``-o PATH`` it is
written to PATH, and a Markdown document gets its plots beside it (``traffic.svg``,
``pressure.svg``, which it links); every format also gets the autoscaling action item beside
it as a ready KEDA ScaledObject (``scaledobject-<namespace>-<name>.yaml``), or a line saying
why there is none. Exit codes: 0 done; 2 error (unknown incident, no such
store, bad settings, a file that cannot be written), said in one line on stderr.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from detector import db
from detector.cli.exits import interruptible
from detector.cli.settings import cli_settings
from detector.errors import DetectorError
from detector.postmortem.autoscaling import DEFAULT_PROMETHEUS_URL  # yaml only: no pandas
from detector.textsafe import printable

if TYPE_CHECKING:
    from detector.postmortem.export import Export


class Format(StrEnum):
    """The export formats."""

    MD = "md"
    HTML = "html"
    JSON = "json"


@interruptible
def postmortem_cmd(
    incident: Annotated[
        str,
        typer.Argument(
            help="incident key or id; or a workload (ns/name) or verdict:ID for a verdict"
        ),
    ],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="md, html or json")] = Format.MD,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="write here (md: plots beside it)")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option("--db", help="SQLAlchemy URL (default: DETECTOR_DATABASE__URL)")
    ] = None,
    prometheus_url: Annotated[
        str,
        typer.Option(help="the Prometheus the autoscaling manifest's triggers query (with -o)"),
    ] = DEFAULT_PROMETHEUS_URL,
) -> None:
    """Export the postmortem of an incident: impact, detection, causal chain, measured effects.

    The same incident exports to the same bytes. For a "not this pattern" verdict it
    explains why it was not a GPU OOM cascade.
    """
    # pandas and matplotlib: imported by this command only, never by `detector run`'s process
    from detector.postmortem.export import export_postmortem

    try:
        settings = cli_settings(database_url, None)
        db.require_head(settings.database.url)
        engine = db.make_engine(settings.database.url)
        try:
            with db.session_factory(engine)() as session:
                export = export_postmortem(
                    session=session,
                    ref=incident,
                    fmt=fmt.value,
                    settings=settings,
                    prometheus_url=prometheus_url,
                )
        finally:
            engine.dispose()
    except DetectorError as exc:
        _fail(str(exc))
    if output is None:
        sys.stdout.buffer.write(export.data)
        sys.stdout.flush()
        return
    try:
        _write(export, output)
    except OSError as exc:
        _fail(f"cannot write {output}: {exc.strerror or exc}")
    typer.echo(printable(f"wrote {output}", one_line=True), err=True)
    manifest = export.manifest
    if manifest is not None:
        said = f"wrote {output.parent / manifest.filename}" if manifest.text else None
        said = said or f"no autoscaling manifest: {manifest.reason}"
        typer.echo(printable(said, one_line=True), err=True)


def _write(export: Export, output: Path) -> None:
    """Write the document to ``output`` (its folder made when missing) and its plot files
    beside it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(export.data)
    for name, svg in export.plots:
        (output.parent / name).write_text(svg, encoding="utf-8")
    if export.manifest is not None and export.manifest.text is not None:
        (output.parent / export.manifest.filename).write_text(export.manifest.text, "utf-8")


def _fail(message: str) -> NoReturn:
    typer.echo(printable(f"error: {message}", one_line=True), err=True)
    raise typer.Exit(2)
