"""Approvals name the plan they are for and the event time a decision was made at.

``plan_digest``: the digest of the step's plan the approval was requested for (a decision on
another plan is refused); ``decided_event_at``: the event time the detector had reached when
a person decided (the step moves at that event time, never earlier).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("plan_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("decided_event_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("decided_event_at")
        batch.drop_column("plan_digest")
