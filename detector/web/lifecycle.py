"""The incident's lifecycle over HTTP: acknowledge, resolve with a reason, snooze.

- ``POST /api/incidents/{key}/acknowledge``, ``.../resolve`` (JSON ``{"reason": "..."}``,
  required) and ``.../snooze`` (JSON ``{"minutes": N}``) with ``Authorization: Bearer
  <token>`` (``detector.web.auth``);
- ``POST /incidents/{ref}/lifecycle/{act}`` from the incident page's forms (a login session
  and its CSRF token; fields ``reason``, ``minutes``), then back to the page.

Both go through the one decide flow (``detector.web.deps.decide``), with the approvals'
allow-list, audit (the timeline entry names who, via which face, why) and refusals: 401
without an identity, 403 off the allow-list, 404 for an unknown incident, 409 when it is
resolved already (or acknowledged already), 400 for a resolve without a reason or minutes
out of range; nothing changes on a refusal.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, Field

from detector.incidents.lifecycle import MAX_SNOOZE_MIN
from detector.runbooks.flows import DecisionKind, DecisionRequest
from detector.web.deps import decide, web
from detector.web.pages import _actor as form_actor  # the page forms' one identity check

router = APIRouter()

ACTS = {a.value: a for a in (DecisionKind.ACKNOWLEDGE, DecisionKind.RESOLVE, DecisionKind.SNOOZE)}


class LifecycleIn(BaseModel):
    """The optional body of a lifecycle decision."""

    reason: str = Field("", max_length=1000)
    minutes: int = Field(0, ge=0, le=MAX_SNOOZE_MIN)


def _decide(request: Request, key: str, act: str, who: str, via: str, body: LifecycleIn) -> Any:
    kind = ACTS.get(act)
    if kind is None:
        raise HTTPException(404, "no such action: acknowledge, resolve or snooze")
    decision = DecisionRequest(kind, via, who, body.reason, incident=key, minutes=body.minutes)
    result = decide(request, decision)
    assert result.incident is not None and result.entry is not None
    return {
        "incident": result.incident.key,
        "stage": result.incident.stage,
        "action": act,
        "by": who,
        "via": via,
        "message": result.entry.message,
    }


@router.post("/api/incidents/{key:path}/acknowledge")
def acknowledge(request: Request, key: str) -> Any:
    """Acknowledge the incident as the token's owner."""
    who = web(request).auth.bearer(request)
    return _decide(request, key, "acknowledge", who, "http", LifecycleIn())


@router.post("/api/incidents/{key:path}/resolve")
def resolve(request: Request, key: str, body: LifecycleIn) -> Any:
    """Resolve the incident with ``reason`` as the token's owner."""
    who = web(request).auth.bearer(request)
    return _decide(request, key, "resolve", who, "http", body)


@router.post("/api/incidents/{key:path}/snooze")
def snooze(request: Request, key: str, body: LifecycleIn) -> Any:
    """Snooze the incident's Slack replies for ``minutes`` as the token's owner."""
    who = web(request).auth.bearer(request)
    return _decide(request, key, "snooze", who, "http", body)


@router.post("/incidents/{ref:path}/lifecycle/{act}")
def from_page(
    request: Request,
    ref: str,
    act: str,
    csrf: str = Form(""),
    reason: str = Form("", max_length=1000),
    minutes: int = Form(0, ge=0, le=MAX_SNOOZE_MIN),
) -> RedirectResponse:
    """Acknowledge, resolve or snooze from the incident page; then back to it."""
    who = form_actor(request, csrf)
    _decide(request, ref, act, who, "web", LifecycleIn(reason=reason, minutes=minutes))
    return RedirectResponse(f"/incidents/{quote(ref)}", status_code=303)
