"""ORM models of the incident store, the system of record (SQLAlchemy 2.0, typed ``Mapped``).

Every table has a unique key on what makes a write idempotent: the incident key, the source
record position of evidence, verdicts and dead letters, a dedupe key on timeline entries.
Source positions store the Kafka partition, or ``-1`` (``FILE_PARTITION``) for files, so that
a NULL never defeats a unique constraint. Times are timezone-aware UTC ``datetime`` values.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from detector.db import Base, IdType, UTCDateTime
from detector.events.model import SourcePos

FILE_PARTITION = -1  # stored in source_partition for records read from files (no partition)
RAW_LIMIT_BYTES = 64 * 1024  # dead-letter raw bytes are truncated to this size


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
    NEXT_VICTIM = "next_victim"  # a forecast: the survivor whose pressure reaches its ceiling next
    REQUEST_HELD = "request_held"  # a request a victim failed as it died: the largest so far
    START_FAILED = "start_failed"  # a pod could not start: its GPU's memory is still held
    ALERT = "alert"  # an Alertmanager alert whose name maps to none of our signals: context
    HARDWARE_FAULT = "hardware_fault"  # an XID/ECC alert: the GPU failed, not its memory


class TimelineKind(StrEnum):
    """Kind of a timeline entry."""

    SIGNAL = "signal"
    STAGE = "stage"
    STEP = "step"
    QUESTION = "question"
    VERDICT = "verdict"
    NOTE = "note"


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
    # which of the four signals the workload has seen, and why each missing one is missing
    # (``detector.correlate.coverage.SignalCoverage.to_dict``, in ``SIGNALS`` order)
    coverage: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)

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
    questions: Mapped[list[Question]] = relationship(
        order_by="Question.id", cascade="all, delete-orphan", passive_deletes=True
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


class SeriesValue(Base):
    """One bucket of one time series of an incident (``detector.correlate.series``).

    ``metric``: requests, errors_5xx, shed_429 (responses in the bucket; label ""), pressure
    (a pod's highest used/total ratio; label: the pod) and ceiling (the ratio it was judged
    against); ``detail``: "KV cache" or "GPU memory" for the last two. ``time`` is the start of
    the bucket. Unique per (incident, metric, label, time): written by upsert.
    """

    __tablename__ = "incident_series"
    __table_args__ = (UniqueConstraint("incident_id", "metric", "label", "time"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    incident_id: Mapped[int] = mapped_column(IdType, ForeignKey("incidents.id", ondelete="CASCADE"))
    time: Mapped[datetime] = mapped_column(UTCDateTime())
    metric: Mapped[str] = mapped_column(String(32))
    label: Mapped[str] = mapped_column(String(255), default="")
    value: Mapped[float] = mapped_column(Float)
    detail: Mapped[str] = mapped_column(String(32), default="")


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


class Alert(Base):
    """One Alertmanager alert as delivered (``detector.incidents.alerts``), once per status.

    ``dedupe_key`` (unique) is the SHA-256 of the group key, fingerprint, status and start:
    Alertmanager's HA peers, retries and repeats deliver the same alert again
    (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config). ``signal`` is
    what its name maps to; ``outcome``: ``evidence`` (joined ``incident_id``), ``seen`` (no
    incident of its workload open), ``verdict`` (a hardware fault), ``unattributed``.
    """

    __tablename__ = "alertmanager_alerts"

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    dedupe_key: Mapped[str] = mapped_column(String(64), unique=True)
    group_key: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    alertname: Mapped[str] = mapped_column(String(255))
    signal: Mapped[str] = mapped_column(String(32))
    outcome: Mapped[str] = mapped_column(String(32))
    namespace: Mapped[str | None] = mapped_column(String(255))
    pod: Mapped[str | None] = mapped_column(String(255))
    workload: Mapped[str | None] = mapped_column(String(255))
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    annotations: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ends_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    generator_url: Mapped[str] = mapped_column(Text, default="")
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())  # wall clock
    incident_id: Mapped[int | None] = mapped_column(
        IdType, ForeignKey("incidents.id", ondelete="SET NULL")
    )
