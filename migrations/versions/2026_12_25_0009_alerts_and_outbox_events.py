"""Alertmanager's alerts as delivered, and the outbox's events for PagerDuty.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-25 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "alertmanager_alerts",
        sa.Column("id", ID, primary_key=True),
        sa.Column("dedupe_key", sa.String(64), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("alertname", sa.String(255), nullable=False),
        sa.Column("signal", sa.String(32), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(255)),
        sa.Column("pod", sa.String(255)),
        sa.Column("workload", sa.String(255)),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("starts_at", TIME, nullable=False),
        sa.Column("ends_at", TIME),
        sa.Column("generator_url", sa.Text(), nullable=False),
        sa.Column("received_at", TIME, nullable=False),
        sa.Column("incident_id", ID, sa.ForeignKey("incidents.id", ondelete="SET NULL")),
        sa.UniqueConstraint("dedupe_key", name="uq_alertmanager_alerts_dedupe_key"),
    )
    op.create_table(
        "outbox_events",
        sa.Column("id", ID, primary_key=True),
        sa.Column(
            "incident_id", ID, sa.ForeignKey("incidents.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("target", sa.String(16), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("dedupe_key", sa.String(255), nullable=False),
        sa.Column("time", TIME, nullable=False),
        sa.Column("due_at", TIME, nullable=False),
        sa.Column("claimed_at", TIME),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("sent_at", TIME),
        sa.Column("drill", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.UniqueConstraint("target", "dedupe_key", name="uq_outbox_events_target_dedupe_key"),
    )
    op.create_index("ix_outbox_events_pending", "outbox_events", ["target", "sent_at"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_outbox_events_pending", table_name="outbox_events")
    op.drop_table("outbox_events")
    op.drop_table("alertmanager_alerts")
