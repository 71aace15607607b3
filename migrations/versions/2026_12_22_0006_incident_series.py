"""Per-incident time series for charts and the postmortem: one row per bucket, metric and label.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-22 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "incident_series",
        sa.Column("id", ID, primary_key=True),
        sa.Column(
            "incident_id", ID, sa.ForeignKey("incidents.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metric", sa.String(32), nullable=False),
        sa.Column("label", sa.String(255), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("detail", sa.String(32), nullable=False),
        sa.UniqueConstraint(
            "incident_id",
            "metric",
            "label",
            "time",
            name="uq_incident_series_incident_id_metric_label_time",
        ),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("incident_series")
