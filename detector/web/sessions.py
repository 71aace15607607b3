"""Login sessions ended server-side (``detector.web.models.EndedSession``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from detector.web.models import EndedSession

SESSION_MAX_AGE_S = 12 * 3600  # a session cookie's lifetime (``SessionMiddleware``'s max_age)


def end(session: Session, sid: str, owner: str, now: datetime | None = None) -> None:
    """Record that session ``sid`` of ``owner`` ended (logout), until its cookie expires;
    forget the ended sessions whose cookies have expired. The caller commits."""
    now = now or datetime.now(UTC)
    session.execute(delete(EndedSession).where(EndedSession.expires_at < now))
    if session.get(EndedSession, sid) is None:
        expires = now + timedelta(seconds=SESSION_MAX_AGE_S)
        session.add(EndedSession(sid=sid, owner=owner, ended_at=now, expires_at=expires))


def is_ended(session: Session, sid: str) -> bool:
    """Return True when session ``sid`` was ended by a logout."""
    return session.scalar(select(EndedSession.sid).where(EndedSession.sid == sid)) is not None
