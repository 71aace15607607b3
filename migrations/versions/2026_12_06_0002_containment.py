"""Containment: step approvals, operator controls (kill switch, arming), the action history
of the safety rails, and a structured detail on timeline entries.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _incident_fk() -> sa.Column[int]:
    return sa.Column(
        "incident_id", _id(), sa.ForeignKey("incidents.id", ondelete="CASCADE"), nullable=False
    )


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "approvals",
        sa.Column("id", _id(), primary_key=True),
        _incident_fk(),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("policy", sa.String(16), nullable=False),
        sa.Column("approver_group", sa.String(255), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_by", sa.String(255), nullable=True),
        sa.Column("via", sa.String(32), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.UniqueConstraint("incident_id", "step_id", name="uq_approvals_incident_id_step_id"),
    )
    op.create_table(
        "controls",
        sa.Column("scope", sa.String(512), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "name", name="pk_controls"),
    )
    op.create_table(
        "step_actions",
        sa.Column("id", _id(), primary_key=True),
        _incident_fk(),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("workload", sa.String(255), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("move", sa.String(32), nullable=False),
        sa.Column("live", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dedupe_key", sa.String(512), nullable=False),
        sa.UniqueConstraint("dedupe_key", name="uq_step_actions_dedupe_key"),
    )
    op.create_index(
        "ix_step_actions_workload_time", "step_actions", ["namespace", "workload", "time"]
    )
    with op.batch_alter_table("timeline_entries") as batch:
        batch.add_column(sa.Column("detail", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("timeline_entries") as batch:
        batch.drop_column("detail")
    op.drop_index("ix_step_actions_workload_time", table_name="step_actions")
    for table in ("step_actions", "controls", "approvals"):
        op.drop_table(table)
