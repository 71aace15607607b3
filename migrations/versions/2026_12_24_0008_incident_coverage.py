"""Each incident's signal coverage: which of the four signals its workload has seen, and why
each missing one is missing (``detector.correlate.coverage``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-24 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("incidents") as batch:
        batch.add_column(sa.Column("coverage", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("incidents") as batch:
        batch.drop_column("coverage")
