"""The approvals API: approve or deny a step with a bearer token.

``POST /api/incidents/{key}/steps/{step}/approve`` and ``.../deny`` (``key``: the incident key,
which contains ``/``, or its numeric id; ``step``: the step id or its position), optional JSON
body ``{"reason": "...", "plan": "<digest>"}`` (``plan``: the digest of the plan the approver
saw, as the approval request states it; a plan changed since is refused). The
``Authorization: Bearer <token>`` header names the approver (``detector.web.auth``), who must
be on the approver allow-list (``DETECTOR_CONTAINMENT__APPROVERS``). Answers: 200 with the
decision; 401 without a valid token; 403 when the owner may not approve; 404 for an unknown
incident or step; 409 when the step is not waiting for approval (not requested yet, already
decided, expired by the wall clock, withdrawn) or its plan changed; 503 when the store fails;
nothing changes on a refusal. The pages and Slack go through the same decide flow.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from detector.runbooks.flows import DecisionKind, DecisionRequest
from detector.web.deps import decide, web

router = APIRouter()


class DecisionIn(BaseModel):
    """The optional body of a decision."""

    reason: str = Field("", max_length=1000)
    plan: str = Field("", max_length=64, description="the plan digest the approver saw")


def _decide(request: Request, key: str, step: str, approve: bool, body: DecisionIn | None) -> Any:
    who = web(request).auth.bearer(request)
    kind = DecisionKind.APPROVE if approve else DecisionKind.DENY
    reason, plan = (body.reason, body.plan) if body is not None else ("", "")
    decision = DecisionRequest(kind, "http", who, reason, incident=key, step=step, plan=plan)
    row = decide(request, decision).approval
    assert row is not None
    return {
        "incident": key,
        "step": row.step_id,
        "position": row.position,
        "status": row.status,
        "by": row.decided_by,
        "via": row.via,
        "decided_at": row.decided_at.isoformat() if row.decided_at else None,
    }


@router.post("/api/incidents/{key:path}/steps/{step}/approve")
def approve(request: Request, key: str, step: str, body: DecisionIn | None = None) -> Any:
    """Approve a step waiting for approval, as the token's owner."""
    return _decide(request, key, step, True, body)


@router.post("/api/incidents/{key:path}/steps/{step}/deny")
def deny(request: Request, key: str, step: str, body: DecisionIn | None = None) -> Any:
    """Deny a step waiting for approval, as the token's owner: nothing is applied."""
    return _decide(request, key, step, False, body)


@router.post("/api/incidents/{ref:path}")
def unknown_action(ref: str) -> Any:
    """Answer 404 for any other POST under an incident (only approve and deny exist)."""
    raise HTTPException(404, "no such action: POST .../steps/STEP/approve or .../deny")
