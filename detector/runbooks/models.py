"""ORM models of runbook runs: runs, steps, approvals, operator controls, the action history.

They belong to the runbooks package because only containment reads and writes them.
``RunbookRun`` and ``StepApproval`` hang off an incident by ``incident_id``; the backrefs
``Incident.runs`` and ``Incident.approvals`` are declared here so that ``detector.incidents``
knows nothing of runbooks.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, backref, mapped_column, relationship

from detector.db import Base, IdType, UTCDateTime
from detector.incidents.models import Incident


class RunMode(StrEnum):
    """Whether a runbook run acts for real."""

    DRY_RUN = "dry_run"
    LIVE = "live"


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
    incident: Mapped[Incident] = relationship(
        backref=backref(
            "runs", order_by="RunbookRun.id", cascade="all, delete-orphan", passive_deletes=True
        )
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
    plan_digest: Mapped[str | None] = mapped_column(String(64))
    decided_event_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    incident: Mapped[Incident] = relationship(
        backref=backref(
            "approvals",
            order_by="StepApproval.position",
            cascade="all, delete-orphan",
            passive_deletes=True,
        )
    )


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

    ``move`` is the step machine's (applied, restarted, rolled_back, lifted, removed); ``live``
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


class ControlChange(Base):
    """One change of an operator's switch, kept forever: who, when, why and from where.

    ``scope`` and ``name`` as in ``Control``; ``changed_at`` is the wall clock (a person's
    decision); ``via`` the face (``cli``, ``http`` ...) and ``host`` the machine the CLI ran on
    (empty for other faces). ``Control`` keeps only the latest state.
    """

    __tablename__ = "control_changes"
    __table_args__ = (Index("ix_control_changes_changed_at", "changed_at"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    scope: Mapped[str] = mapped_column(String(512))
    name: Mapped[str] = mapped_column(String(64))
    enabled: Mapped[bool] = mapped_column(Boolean)
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    changed_by: Mapped[str] = mapped_column(String(255))
    via: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(255), default="")
    reason: Mapped[str] = mapped_column(Text, default="")
