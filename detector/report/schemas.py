"""The composite incident of the read model: the incident with its runbook runs and approvals.

``IncidentOut.model_validate(incident)`` inside the session that loaded ``incident``:
``runs`` and ``approvals`` are the backrefs that ``detector.runbooks.models`` declares. Its
``contained`` stage entries say who contained the incident (``detector.report.recovery``).
"""

from __future__ import annotations

from pydantic import field_validator

from detector.incidents.schemas import (
    EvidenceOut,
    IncidentSummaryOut,
    Out,
    QuestionOut,
    TimelineEntryOut,
    VictimOut,
)
from detector.report.recovery import attribute
from detector.runbooks import models as _runbook_models  # noqa: F401  (declares the backrefs)
from detector.runbooks.schemas import ApprovalOut, RunOut


class SignalCoverageOut(Out):
    """One of the four signals of the incident's workload: ``count`` signals of it seen; when
    none, why (``reason``), what was found (``detail``) and how to bring it in (``hint``).
    The shape of ``detector.correlate.coverage.SignalCoverage``."""

    signal: str
    count: int
    reason: str = ""
    detail: str = ""
    hint: str = ""


class IncidentOut(IncidentSummaryOut):
    """An incident with its victims, evidence, timeline, runs, questions and approvals, and
    its workload's signal coverage (None until the pipeline first stored it).

    Each ``stage -> contained`` timeline entry carries its attribution: containment, or the
    pods recovering by themselves (``detector.report.recovery.attribute``).
    """

    victims: list[VictimOut]
    evidence: list[EvidenceOut]
    timeline: list[TimelineEntryOut]
    runs: list[RunOut]
    questions: list[QuestionOut]
    approvals: list[ApprovalOut] = []
    coverage: list[SignalCoverageOut] | None = None

    @field_validator("timeline")
    @classmethod
    def _attributed(cls, timeline: list[TimelineEntryOut]) -> list[TimelineEntryOut]:
        return attribute(timeline)
