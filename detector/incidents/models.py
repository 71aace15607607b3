"""ORM models of the incident store, the system of record (SQLAlchemy 2.0, typed ``Mapped``).

Every table has a unique key on what makes a write idempotent: the incident key, the source
record position of evidence, verdicts and dead letters, a dedupe key on timeline entries.
Source positions store the Kafka partition, or ``-1`` (``FILE_PARTITION``) for files, so that
a NULL never defeats a unique constraint. Times are timezone-aware UTC ``datetime`` values.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from detector.events.model import SourcePos

FILE_PARTITION = -1  # stored in source_partition for records read from files (no partition)
RAW_LIMIT_BYTES = 64 * 1024  # dead-letter raw bytes are truncated to this size

# Constraint names are fixed so that migrations (and SQLite batch mode) can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# 64-bit ids on PostgreSQL; SQLite only auto-increments a column declared INTEGER.
IdType = BigInteger().with_variant(Integer(), "sqlite")


class Stage(StrEnum):
    """Stage of an incident (DESIGN.md section 4)."""

    SUSPECTED = "suspected"
    CASCADING = "cascading"
    CONTAINED = "contained"
    RESOLVED = "resolved"


class EvidenceKind(StrEnum):
    """Kind of a piece of evidence attached to an incident."""

    GPU_OOM = "gpu_oom"
    ENGINE_DEAD = "engine_dead"
    CRASH_LOOP = "crash_loop"
    LB_ERRORS = "lb_errors"
    GPU_MEMORY = "gpu_memory"
    ENGINE_PRESSURE = "engine_pressure"
    ENGINE_CONFIG = "engine_config"
    HOST_OOM = "host_oom"
    POD_READY = "pod_ready"


class TimelineKind(StrEnum):
    """Kind of a timeline entry."""

    SIGNAL = "signal"
    STAGE = "stage"
    STEP = "step"
    QUESTION = "question"
    VERDICT = "verdict"
    NOTE = "note"


class RunMode(StrEnum):
    """Whether a runbook run acts for real."""

    DRY_RUN = "dry_run"
    LIVE = "live"


class StepStatus(StrEnum):
    """Status of one runbook step: ``dry_run`` while only recorded, else the engine's state.

    The engine's states are those of ``detector.runbooks.steps.StepState``.
    """

    PLANNED = "planned"
    DRY_RUN = "dry_run"
    AWAITING_APPROVAL = "awaiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    APPROVED = "approved"
    APPLYING = "applying"
    VERIFYING = "verifying"
    VERIFIED = "verified"
    ESCALATED = "escalated"
    ROLLED_BACK = "rolled_back"
    DENIED = "denied"
    EXPIRED = "expired"
    NOT_NEEDED = "not_needed"
    LIFTING = "lifting"
    LIFTED = "lifted"


def to_datetime(ts: float) -> datetime:
    """Convert Unix seconds (UTC) to a timezone-aware UTC datetime."""
    return datetime.fromtimestamp(ts, tz=UTC)


def to_timestamp(value: datetime) -> float:
    """Convert a timezone-aware datetime to Unix seconds."""
    return value.timestamp()


class UTCDateTime(TypeDecorator[datetime]):
    """Store timezone-aware datetimes as UTC and read them back timezone-aware UTC.

    PostgreSQL keeps them in ``timestamptz``; SQLite has no time zones, so the value is stored
    as naive UTC and UTC is attached again on the way out. Naive datetimes are refused
    (``ValueError``): they are ambiguous.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Normalize to UTC before writing."""
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Attach or convert to UTC after reading."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of the incident store."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _source(origin: str, partition: int, position: int) -> SourcePos:
    return SourcePos(
        origin=origin,
        position=position,
        partition=None if partition == FILE_PARTITION else partition,
    )


class Incident(Base):
    """One GPU OOM cascade of one workload."""

    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_workload", "namespace", "workload"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    key: Mapped[str] = mapped_column(String(255), unique=True)
    pattern: Mapped[str] = mapped_column(String(64), default="gpu_oom_cascade")
    cluster: Mapped[str | None] = mapped_column(String(255))
    namespace: Mapped[str] = mapped_column(String(255))
    workload: Mapped[str] = mapped_column(String(255))
    workload_kind: Mapped[str] = mapped_column(String(64))
    stage: Mapped[str] = mapped_column(String(32))
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    victims: Mapped[list[IncidentPod]] = relationship(
        order_by="IncidentPod.position", cascade="all, delete-orphan", passive_deletes=True
    )
    evidence: Mapped[list[Evidence]] = relationship(
        order_by=lambda: (Evidence.time, Evidence.id),
        cascade="all, delete-orphan",
        passive_deletes=True,
    )
    timeline: Mapped[list[TimelineEntry]] = relationship(
        order_by=lambda: (TimelineEntry.time, TimelineEntry.id),
        cascade="all, delete-orphan",
        passive_deletes=True,
    )
    runs: Mapped[list[RunbookRun]] = relationship(
        order_by="RunbookRun.id", cascade="all, delete-orphan", passive_deletes=True
    )
    questions: Mapped[list[Question]] = relationship(
        order_by="Question.id", cascade="all, delete-orphan", passive_deletes=True
    )
    approvals: Mapped[list[StepApproval]] = relationship(
        order_by="StepApproval.position", cascade="all, delete-orphan", passive_deletes=True
    )


class IncidentPod(Base):
    """A victim pod of an incident; ``position`` is its 1-based order of failure.

    The primary key (incident_id, pod) is the unique key that makes adding a victim idempotent.
    """

    __tablename__ = "incident_pods"

    incident_id: Mapped[int] = mapped_column(
        IdType, ForeignKey("incidents.id", ondelete="CASCADE"), primary_key=True
    )
    pod: Mapped[str] = mapped_column(String(255), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    first_oom_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Evidence(Base):
    """One signal attached to an incident, keyed by its source record."""

    __tablename__ = "evidence"
    __table_args__ = (
        UniqueConstraint(
            "incident_id",
            "kind",
            "source_origin",
            "source_partition",
            "source_position",
            name="uq_evidence_source",
        ),
        Index("ix_evidence_incident_time", "incident_id", "time"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    pod: Mapped[str | None] = mapped_column(String(255))
    time: Mapped[datetime] = mapped_column(UTCDateTime())
    source_origin: Mapped[str] = mapped_column(String(1024))
    source_partition: Mapped[int] = mapped_column(Integer, default=FILE_PARTITION)
    source_position: Mapped[int] = mapped_column(BigInteger)
    summary: Mapped[str] = mapped_column(Text)
    text: Mapped[str] = mapped_column(Text, default="")
    attrs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    @property
    def source(self) -> SourcePos:
        """Return the source record position (partition None for files)."""
        return _source(self.source_origin, self.source_partition, self.source_position)


class TimelineEntry(Base):
    """One line of an incident's timeline."""

    __tablename__ = "timeline_entries"
    __table_args__ = (
        UniqueConstraint("incident_id", "dedupe_key"),
        Index("ix_timeline_entries_incident_time", "incident_id", "time"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    time: Mapped[datetime] = mapped_column(UTCDateTime())
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    evidence_id: Mapped[int | None] = mapped_column(
        IdType, ForeignKey("evidence.id", ondelete="SET NULL")
    )
    dedupe_key: Mapped[str] = mapped_column(String(512))
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # a step's actor, diff ...

    evidence: Mapped[Evidence | None] = relationship()


class Verdict(Base):
    """A recorded "not this pattern" decision for a workload, with its reason."""

    __tablename__ = "verdicts"
    __table_args__ = (Index("ix_verdicts_workload", "namespace", "workload"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    cluster: Mapped[str | None] = mapped_column(String(255))
    namespace: Mapped[str] = mapped_column(String(255))
    workload: Mapped[str] = mapped_column(String(255))
    verdict: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    time: Mapped[datetime] = mapped_column(UTCDateTime())
    source_origin: Mapped[str] = mapped_column(String(1024))
    source_partition: Mapped[int] = mapped_column(Integer, default=FILE_PARTITION)
    source_position: Mapped[int] = mapped_column(BigInteger)
    dedupe_key: Mapped[str] = mapped_column(String(512), unique=True)

    @property
    def source(self) -> SourcePos:
        """Return the source record position (partition None for files)."""
        return _source(self.source_origin, self.source_partition, self.source_position)


class RunbookRun(Base):
    """One run of a containment runbook for an incident."""

    __tablename__ = "runbook_runs"
    __table_args__ = (UniqueConstraint("incident_id", "runbook"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    runbook: Mapped[str] = mapped_column(String(255))
    version: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(32), default="planned")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    steps: Mapped[list[RunbookStep]] = relationship(
        order_by="RunbookStep.position", cascade="all, delete-orphan", passive_deletes=True
    )


class RunbookStep(Base):
    """One step of a runbook run, at its 1-based ``position``."""

    __tablename__ = "runbook_steps"
    __table_args__ = (UniqueConstraint("run_id", "position"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    run_id: Mapped[int] = mapped_column(IdType, ForeignKey("runbook_runs.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    approval: Mapped[str] = mapped_column(String(255), default="")
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Question(Base):
    """An on-call question about an incident and its answer, if the evidence gives one."""

    __tablename__ = "questions"
    __table_args__ = (UniqueConstraint("incident_id", "qkey"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    qkey: Mapped[str] = mapped_column(String(64))
    question: Mapped[str] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text)
    evidence_id: Mapped[int | None] = mapped_column(
        IdType, ForeignKey("evidence.id", ondelete="SET NULL")
    )
    to_check: Mapped[str] = mapped_column(Text, default="")
    answered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    evidence: Mapped[Evidence | None] = relationship()


class DeadLetter(Base):
    """A record that could not be processed, kept with its reason and source position."""

    __tablename__ = "dead_letters"
    __table_args__ = (
        UniqueConstraint(
            "source_origin", "source_partition", "source_position", name="uq_dead_letters_source"
        ),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    source_origin: Mapped[str] = mapped_column(String(1024))
    source_partition: Mapped[int] = mapped_column(Integer, default=FILE_PARTITION)
    source_position: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(String(255))
    detail: Mapped[str] = mapped_column(Text, default="")
    raw: Mapped[bytes] = mapped_column(LargeBinary)
    raw_size_bytes: Mapped[int] = mapped_column(Integer)  # size before truncation
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    @property
    def source(self) -> SourcePos:
        """Return the source record position (partition None for files)."""
        return _source(self.source_origin, self.source_partition, self.source_position)


class StepApproval(Base):
    """The approval of one runbook step of an incident.

    Policy ``auto`` rows are written ``approved`` by ``policy:auto``; ``approval`` rows are
    ``pending`` until a person on the allow-list approves or denies them, or they expire.
    Only a pending row changes (a conditional update), so concurrent decisions cannot both win.
    """

    __tablename__ = "approvals"
    __table_args__ = (UniqueConstraint("incident_id", "step_id"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    step_id: Mapped[str] = mapped_column(String(64))
    position: Mapped[int] = mapped_column(Integer)
    policy: Mapped[str] = mapped_column(String(16))
    approver_group: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16))
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    decided_by: Mapped[str | None] = mapped_column(String(255))
    via: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")


class Control(Base):
    """An operator's switch: the global kill switch (scope ``*``) or a workload's arming.

    ``scope`` is ``*`` or ``namespace/workload``; ``name`` is ``kill_switch`` or ``armed``.
    """

    __tablename__ = "controls"

    scope: Mapped[str] = mapped_column(String(512), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_by: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text, default="")


class StepAction(Base):
    """One actuator call of a step on a workload: the history the safety rails count.

    ``move`` is the engine's (applied, restarted, rolled_back, lifted, removed); ``live``
    False for a dry run; ``dedupe_key`` makes recording it idempotent.
    """

    __tablename__ = "step_actions"
    __table_args__ = (Index("ix_step_actions_workload_time", "namespace", "workload", "time"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    namespace: Mapped[str] = mapped_column(String(255))
    workload: Mapped[str] = mapped_column(String(255))
    step_id: Mapped[str] = mapped_column(String(64))
    move: Mapped[str] = mapped_column(String(32))
    live: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16))
    time: Mapped[datetime] = mapped_column(UTCDateTime())
    dedupe_key: Mapped[str] = mapped_column(String(512), unique=True)
