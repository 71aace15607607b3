"""Web sessions ended by logout before their cookie expires (``detector.web.models``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-23 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "ended_sessions",
        sa.Column("sid", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_ended_sessions_expires_at", "ended_sessions", ["expires_at"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_ended_sessions_expires_at", table_name="ended_sessions")
    op.drop_table("ended_sessions")
