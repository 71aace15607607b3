"""The web sessions ended before their cookie expires: logged out, kept until that expiry.

A login session lives in a signed cookie (Starlette's ``SessionMiddleware``), so ending it
server-side needs a record: its random ``sid`` is written here at logout and a cookie that
carries it is refused from then on, in every process and after restarts.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from detector.db import Base, UTCDateTime


class EndedSession(Base):
    """A session ended by logout: its id, whose it was, and when its cookie would expire."""

    __tablename__ = "ended_sessions"

    sid: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
