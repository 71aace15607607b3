"""Create the incident store.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 00:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Times are "timestamp with time zone" on PostgreSQL; detector.incidents.models.UTCDateTime
# stores naive UTC on SQLite and attaches UTC again when reading.

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _pk() -> sa.Column[int]:
    return sa.Column("id", _id(), primary_key=True)


def _fk(
    column: str, target: str, *, nullable: bool = False, on_delete: str = "CASCADE"
) -> sa.Column[int]:
    return sa.Column(column, _id(), sa.ForeignKey(target, ondelete=on_delete), nullable=nullable)


def _source_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("source_origin", sa.String(1024), nullable=False),
        sa.Column("source_partition", sa.Integer(), nullable=False),
        sa.Column("source_position", sa.BigInteger(), nullable=False),
    ]


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "incidents",
        _pk(),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("pattern", sa.String(64), nullable=False),
        sa.Column("cluster", sa.String(255), nullable=True),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("workload", sa.String(255), nullable=False),
        sa.Column("workload_kind", sa.String(64), nullable=False),
        sa.Column("stage", sa.String(32), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("key", name="uq_incidents_key"),
    )
    op.create_index("ix_incidents_workload", "incidents", ["namespace", "workload"])

    op.create_table(
        "incident_pods",
        _fk("incident_id", "incidents.id"),
        sa.Column("pod", sa.String(255), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("first_oom_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("incident_id", "pod", name="pk_incident_pods"),
    )

    op.create_table(
        "evidence",
        _pk(),
        _fk("incident_id", "incidents.id"),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("pod", sa.String(255), nullable=True),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        *_source_columns(),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("attrs", sa.JSON(), nullable=False),
        sa.UniqueConstraint(
            "incident_id",
            "kind",
            "source_origin",
            "source_partition",
            "source_position",
            name="uq_evidence_source",
        ),
    )
    op.create_index("ix_evidence_incident_time", "evidence", ["incident_id", "time"])

    op.create_table(
        "timeline_entries",
        _pk(),
        _fk("incident_id", "incidents.id"),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        _fk("evidence_id", "evidence.id", nullable=True, on_delete="SET NULL"),
        sa.Column("dedupe_key", sa.String(512), nullable=False),
        sa.UniqueConstraint(
            "incident_id", "dedupe_key", name="uq_timeline_entries_incident_id_dedupe_key"
        ),
    )
    op.create_index(
        "ix_timeline_entries_incident_time", "timeline_entries", ["incident_id", "time"]
    )

    op.create_table(
        "verdicts",
        _pk(),
        sa.Column("cluster", sa.String(255), nullable=True),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("workload", sa.String(255), nullable=False),
        sa.Column("verdict", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        *_source_columns(),
        sa.Column("dedupe_key", sa.String(512), nullable=False),
        sa.UniqueConstraint("dedupe_key", name="uq_verdicts_dedupe_key"),
    )
    op.create_index("ix_verdicts_workload", "verdicts", ["namespace", "workload"])

    op.create_table(
        "runbook_runs",
        _pk(),
        _fk("incident_id", "incidents.id"),
        sa.Column("runbook", sa.String(255), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("incident_id", "runbook", name="uq_runbook_runs_incident_id_runbook"),
    )

    op.create_table(
        "runbook_steps",
        _pk(),
        _fk("run_id", "runbook_runs.id"),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("approval", sa.String(255), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("run_id", "position", name="uq_runbook_steps_run_id_position"),
    )

    op.create_table(
        "questions",
        _pk(),
        _fk("incident_id", "incidents.id"),
        sa.Column("qkey", sa.String(64), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        _fk("evidence_id", "evidence.id", nullable=True, on_delete="SET NULL"),
        sa.Column("to_check", sa.Text(), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("incident_id", "qkey", name="uq_questions_incident_id_qkey"),
    )

    op.create_table(
        "dead_letters",
        _pk(),
        *_source_columns(),
        sa.Column("reason", sa.String(255), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("raw", sa.LargeBinary(), nullable=False),
        sa.Column("raw_size_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "source_origin",
            "source_partition",
            "source_position",
            name="uq_dead_letters_source",
        ),
    )


def downgrade() -> None:
    """Revert this revision."""
    for table in (
        "dead_letters",
        "questions",
        "runbook_steps",
        "runbook_runs",
        "verdicts",
        "timeline_entries",
        "evidence",
        "incident_pods",
        "incidents",
    ):
        op.drop_table(table)
