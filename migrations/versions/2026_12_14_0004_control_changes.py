"""The history of operator controls: every change of the kill switch or of a workload's arming.

``control_changes`` keeps who changed which control, when (wall clock), why and from where
(the face: cli, http ...; the host name for the CLI); ``controls`` keeps only the latest state.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-14 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "control_changes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("scope", sa.String(512), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_by", sa.String(255), nullable=False),
        sa.Column("via", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
    )
    op.create_index("ix_control_changes_changed_at", "control_changes", ["changed_at"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_control_changes_changed_at", table_name="control_changes")
    op.drop_table("control_changes")
