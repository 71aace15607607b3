"""The notification outbox: an incident's root message and the timeline entries its thread tells.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-21 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "notification_threads",
        sa.Column(
            "incident_id",
            ID,
            sa.ForeignKey("incidents.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("channel", sa.String(255), nullable=False),
        sa.Column("ts", sa.String(32)),
        sa.Column("digest", sa.String(64)),
        sa.Column("claimed_at", sa.DateTime(timezone=True)),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("drill", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
    )
    op.create_table(
        "notifications",
        sa.Column("id", ID, primary_key=True),
        sa.Column(
            "incident_id", ID, sa.ForeignKey("incidents.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "entry_id",
            ID,
            sa.ForeignKey("timeline_entries.id", ondelete="CASCADE"),
            nullable=False,
            unique=True,
        ),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("batch", sa.String(64)),
        sa.Column("sent_at", sa.DateTime(timezone=True)),
        sa.Column("ts", sa.String(32)),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
    )
    op.create_index("ix_notifications_pending", "notifications", ["incident_id", "sent_at"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_notifications_pending", table_name="notifications")
    op.drop_table("notifications")
    op.drop_table("notification_threads")
