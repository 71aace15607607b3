"""The approvals HTTP endpoint: approve or deny a step with a bearer token.

``POST /api/incidents/{key}/steps/{step}/approve`` and ``.../deny`` (``key``: the incident key,
which contains ``/``, or its numeric id; ``step``: the step id or its position), optional JSON
body ``{"reason": "...", "plan": "<digest>"}`` (``plan``: the digest of the plan the approver
saw, as the approval request states it; a plan changed since is refused). The
``Authorization: Bearer <token>`` header is compared in constant time with every token of the
settings (``DETECTOR_WEB__TOKENS``, owner -> token); the owner is the approver identity
recorded on the timeline, and must be on the approver allow-list
(``DETECTOR_CONTAINMENT__APPROVERS``). Answers: 200 with the decision; 401 without a valid
token; 403 when the owner may not approve; 404 for an unknown incident or step; 409 when the
step is not waiting for approval (not requested yet, already decided, expired by the wall
clock, withdrawn) or its plan changed; 503 when the store fails; nothing changes on a refusal.
Slack's clicks arrive signed at ``POST /slack/interactions`` (``detector.web.slack``) and go
through the same decide flow; with Slack configured the app also runs the Slack sender (and
Socket Mode with an app token) while it serves.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from detector import db
from detector.config import Settings
from detector.errors import ApprovalError, StoreError
from detector.notify import flows as notify_flows
from detector.notify.slack.interactions import Interactions
from detector.notify.slack.notifier import Notifier
from detector.runbooks.flows import DecisionKind, DecisionRequest
from detector.web.slack import add_slack_routes

log = logging.getLogger(__name__)

STATUS = {"forbidden": 403, "not_found": 404, "conflict": 409}
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="detector"'}


class DecisionIn(BaseModel):
    """The optional body of a decision."""

    reason: str = Field("", max_length=1000)
    plan: str = Field("", max_length=64, description="the plan digest the approver saw")


def token_owner(tokens: Mapping[str, str], presented: str) -> str | None:
    """Return the owner of ``presented`` among ``tokens`` (owner -> token), or None.

    Every token is compared with ``hmac.compare_digest``, with no early exit, so the time
    taken does not tell which token or how much of it matched.
    """
    found = None
    given = presented.encode()
    for owner, token in tokens.items():
        if hmac.compare_digest(given, token.encode()):
            found = owner
    return found


def create_app(settings: Settings) -> FastAPI:
    """Return the HTTP app; it opens the database at startup and disposes of it at shutdown."""
    tokens = {owner: s.get_secret_value() for owner, s in settings.web.tokens.items()}
    allowed = tuple(settings.containment.approvers)
    url = settings.database.url
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        db.upgrade(url)
        engine = db.make_engine(url)
        state["sessions"] = db.session_factory(engine)
        notifier = Notifier(settings, state["sessions"]) if settings.slack.enabled else None
        if notifier is not None:
            notifier.start()
            state["notifier"] = notifier
        try:
            yield
        finally:
            if notifier is not None:
                notifier.stop()
            engine.dispose()

    app = FastAPI(
        title="GPU OOM cascade detector",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.middleware("http")
    async def boundary(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        try:
            return await call_next(request)
        except Exception:  # the HTTP boundary: log the context, answer 500
            log.exception("request failed method=%s path=%s", request.method, request.url.path)
            return JSONResponse({"detail": "internal error"}, status_code=500)

    def interactions() -> Interactions | None:
        notifier = state.get("notifier")
        return notifier.interactions if notifier is not None else None

    add_slack_routes(app, settings.slack, interactions)

    def approver(authorization: Annotated[str | None, Header()] = None) -> str:
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise HTTPException(401, "a bearer token is required", headers=CHALLENGE)
        owner = token_owner(tokens, presented.strip())
        if owner is None:
            raise HTTPException(401, "invalid token", headers=CHALLENGE)
        return owner

    # Depends as a default value: the annotations of these nested functions are strings
    # (postponed evaluation) that FastAPI resolves in the module, where ``approver`` is unknown.
    approver_dependency = Depends(approver)

    def decide(key: str, step: str, approve: bool, who: str, body: DecisionIn | None) -> Any:
        kind = DecisionKind.APPROVE if approve else DecisionKind.DENY
        reason, plan = (body.reason, body.plan) if body is not None else ("", "")
        request = DecisionRequest(kind, "http", who, reason, incident=key, step=step, plan=plan)
        try:
            with state["sessions"]() as session:
                row = notify_flows.decide(
                    request, session=session, approvers=allowed, slack=settings.slack
                ).approval
                assert row is not None
                session.commit()
                if "notifier" in state:
                    state["notifier"].wake()
                return {
                    "incident": key,
                    "step": row.step_id,
                    "position": row.position,
                    "status": row.status,
                    "by": row.decided_by,
                    "via": row.via,
                    "decided_at": row.decided_at.isoformat() if row.decided_at else None,
                }
        except ApprovalError as exc:
            raise HTTPException(STATUS.get(exc.reason, 400), exc.detail) from exc
        except StoreError as exc:
            log.warning("store failed path=incidents/%s/steps/%s error=%s", key, step, exc)
            raise HTTPException(503, "the incident store is unavailable") from exc

    @app.post("/api/incidents/{key:path}/steps/{step}/approve")
    def approve(
        key: str, step: str, body: DecisionIn | None = None, who: str = approver_dependency
    ) -> Any:
        """Approve a step waiting for approval, as the token's owner."""
        return decide(key, step, True, who, body)

    @app.post("/api/incidents/{key:path}/steps/{step}/deny")
    def deny(
        key: str, step: str, body: DecisionIn | None = None, who: str = approver_dependency
    ) -> Any:
        """Deny a step waiting for approval, as the token's owner: nothing is applied."""
        return decide(key, step, False, who, body)

    return app
