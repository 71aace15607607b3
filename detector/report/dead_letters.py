"""Load the dead letters (records the detector rejected) for the faces to list; reads only.

A dead letter keeps the raw bytes of the record as it came (up to 64 KiB, see
``incidents.service.add_dead_letter``). Those bytes are input: ``raw_preview`` gives them as
text that is safe to show (UTF-8 with replacement characters, control and bidi characters as
escapes, one line, at most ``RAW_PREVIEW_CHARS`` characters of the decoded text). Source,
reason and detail are given as stored: a face escapes them as it escapes every input string.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detector.db import store_errors
from detector.incidents.models import DeadLetter
from detector.textsafe import printable

RAW_PREVIEW_CHARS = 200


@dataclass(frozen=True)
class DeadLetterRow:
    """One rejected record: where it came from, why, and a safe preview of its bytes.

    ``source`` is ``file:line`` or ``topic[partition]@offset``; ``raw_size_bytes`` is the
    record's size before the store cut it; ``raw_cut`` is True when ``raw_preview`` does not
    show the whole record.
    """

    id: int
    source: str
    reason: str
    detail: str
    raw_preview: str
    raw_size_bytes: int
    raw_cut: bool
    created_at: datetime


@dataclass(frozen=True)
class DeadLetters:
    """The newest dead letters (``rows``) and the count of every stored one by reason.

    ``by_reason`` counts the whole table, whatever the filter and limit (most first, then by
    name), so a face can say what else there is; ``matched`` is how many match the filter.
    """

    rows: list[DeadLetterRow]
    by_reason: dict[str, int]
    total: int
    matched: int


def raw_preview(raw: bytes, size_bytes: int) -> tuple[str, bool]:
    """Return ``raw`` as safe one-line text (see the module doc) and whether it was cut."""
    text = raw.decode("utf-8", errors="replace")
    cut = len(text) > RAW_PREVIEW_CHARS or size_bytes > len(raw)
    return printable(text[:RAW_PREVIEW_CHARS], one_line=True), cut


@store_errors
def load_dead_letters(
    *, session: Session, reason: str | None = None, limit: int = 50
) -> DeadLetters:
    """Return at most ``limit`` dead letters (with ``reason`` if given), newest first.

    Newest is by ``created_at`` (when the record was rejected), then by id. Raises StoreError.
    """
    counted = session.execute(
        select(DeadLetter.reason, func.count()).group_by(DeadLetter.reason)
    ).all()
    by_reason = {r: int(n) for r, n in sorted(counted, key=lambda row: (-row[1], row[0]))}
    stmt = select(DeadLetter).order_by(DeadLetter.created_at.desc(), DeadLetter.id.desc())
    if reason is not None:
        stmt = stmt.where(DeadLetter.reason == reason)
    rows = [_row(d) for d in session.scalars(stmt.limit(limit))]
    total = sum(by_reason.values())
    matched = total if reason is None else by_reason.get(reason, 0)
    return DeadLetters(rows=rows, by_reason=by_reason, total=total, matched=matched)


def _row(letter: DeadLetter) -> DeadLetterRow:
    preview, cut = raw_preview(letter.raw, letter.raw_size_bytes)
    return DeadLetterRow(
        id=letter.id,
        source=str(letter.source),
        reason=letter.reason,
        detail=letter.detail,
        raw_preview=preview,
        raw_size_bytes=letter.raw_size_bytes,
        raw_cut=cut,
        created_at=letter.created_at,
    )
