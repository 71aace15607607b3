"""The read commands: ``detector show`` (one incident) and ``detector dead-letters``.

They read the store of a running detector, so they never create or migrate one: a store that
does not exist or is not at the latest migration is refused (``db.require_head``). Everything
echoed from input is printed through ``textsafe.printable``.

Exit codes: 0 done; 2 error (unknown incident, no such store, bad settings, database
failure), said in one line on stderr.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from sqlalchemy.orm import Session

from detector import db
from detector.cli.exits import interruptible
from detector.cli.report import render_incident
from detector.cli.settings import cli_settings
from detector.config import Settings
from detector.errors import DetectorError
from detector.incidents import service
from detector.report.dead_letters import DeadLetters, load_dead_letters
from detector.report.document import incident_document
from detector.report.read import load_incidents
from detector.textsafe import printable

DbOption = Annotated[
    str | None, typer.Option("--db", help="SQLAlchemy URL (default: DETECTOR_DATABASE__URL)")
]
_MAX_ID_DIGITS = 18  # a longer number is no id (ids are 64-bit) but maybe a key


@interruptible
def show_cmd(
    incident: Annotated[
        str, typer.Argument(help="incident key (e.g. llm/vllm-llama@1741943017) or its id")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print the incident's document")] = False,
    database_url: DbOption = None,
) -> None:
    """Print one incident as the web page shows it: the replay report's section of it.

    --json prints its document, the same as its entry of ``detector incidents --json``.
    """
    try:
        settings = cli_settings(database_url, None)
        with db.existing_store(settings.database.url) as session:
            doc = _incident(session, incident, settings)
    except DetectorError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
    else:
        approvers, url = settings.containment.approvers, settings.database.url
        render_incident(doc, Console(), approvers=approvers, db=url)


@interruptible
def dead_letters_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    database_url: DbOption = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="only this reason, e.g. malformed_json")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many")] = 50,
) -> None:
    """List the rejected records (dead letters), newest first, with the counts by reason.

    The raw record is shown as safe text: UTF-8 with replacement characters, control
    characters as escapes, at most 200 characters.
    """
    try:
        settings = cli_settings(database_url, None)
        with db.existing_store(settings.database.url) as session:
            letters = load_dead_letters(session=session, reason=reason, limit=limit)
    except DetectorError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(_dead_letters_json(letters, reason), indent=2))
        return
    for line in _dead_letter_lines(letters, reason):
        typer.echo(printable(line, one_line=True))


def _incident(session: Session, value: str, settings: Settings) -> dict[str, Any]:
    """Return the document of the incident with key or id ``value``; exit 2 when unknown."""
    key = value
    if value.isascii() and value.isdigit() and len(value) <= _MAX_ID_DIGITS:
        row = service.get_incident(session=session, incident_id=int(value))
        key = row.key if row is not None else value
    found = load_incidents(session=session, keys=[key])
    if found:
        return incident_document(found[0].model_dump(mode="json"))
    keys = [i.key for i in service.list_incidents(session=session)]
    close = close_keys(value, keys)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    where = db.redact(settings.database.url)
    _fail(f"no incident {value!r} in the store at {where} ({len(keys)} incident(s)){hint}")


def close_keys(value: str, keys: list[str], n: int = 3) -> list[str]:
    """Return up to ``n`` of ``keys`` that look like ``value``: those it starts, then difflib's."""
    starts = [k for k in keys if value and k.startswith(value)]
    near = difflib.get_close_matches(value, keys, n=n, cutoff=0.6)
    return list(dict.fromkeys(starts + near))[:n]


def _dead_letters_json(letters: DeadLetters, reason: str | None) -> dict[str, Any]:
    return {
        "total": letters.total,
        "by_reason": letters.by_reason,
        "reason": reason,
        "matched": letters.matched,
        "dead_letters": [
            asdict(row) | {"created_at": row.created_at.astimezone(UTC).isoformat()}
            for row in letters.rows
        ],
    }


def _dead_letter_lines(letters: DeadLetters, reason: str | None) -> Iterator[str]:
    """Yield the text report: the counts by reason, then each dead letter in three lines."""
    if not letters.total:
        yield "no dead letters"
        return
    counts = ", ".join(f"{r}={n}" for r, n in letters.by_reason.items())
    yield f"{letters.total} dead letter(s) by reason: {counts}"
    which = f" with reason {reason}" if reason is not None else ""
    yield f"showing {len(letters.rows)} of {letters.matched}{which}, newest first"
    for row in letters.rows:
        when = f"{row.created_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        yield ""
        yield f"#{row.id} {when}  {row.source}  {row.reason}  ({row.raw_size_bytes} bytes)"
        yield f"  detail: {row.detail}"
        yield f"  raw: {row.raw_preview}{' [cut]' if row.raw_cut else ''}"


def _fail(message: str) -> NoReturn:
    typer.echo(printable(f"error: {message}", one_line=True), err=True)
    raise typer.Exit(2)
