"""The composite incident of the read model: the incident with its runbook runs and approvals.

``IncidentOut.model_validate(incident)`` inside the session that loaded ``incident``:
``runs`` and ``approvals`` are the backrefs that ``detector.runbooks.models`` declares.
"""

from __future__ import annotations

from detector.incidents.schemas import (
    EvidenceOut,
    IncidentSummaryOut,
    QuestionOut,
    TimelineEntryOut,
    VictimOut,
)
from detector.runbooks import models as _runbook_models  # noqa: F401  (declares the backrefs)
from detector.runbooks.schemas import ApprovalOut, RunOut


class IncidentOut(IncidentSummaryOut):
    """An incident with its victims, evidence, timeline, runs, questions and approvals."""

    victims: list[VictimOut]
    evidence: list[EvidenceOut]
    timeline: list[TimelineEntryOut]
    runs: list[RunOut]
    questions: list[QuestionOut]
    approvals: list[ApprovalOut] = []
