"""Dependencies shared by the routers: the web context, the reader check, the decide flow."""

from __future__ import annotations

import logging

from fastapi import HTTPException, Request

from detector.errors import ApprovalError, StoreError
from detector.notify import flows as notify_flows
from detector.runbooks.flows import DecisionRequest, DecisionResult
from detector.web.context import WebContext

log = logging.getLogger(__name__)

STATUS = {"forbidden": 403, "not_found": 404, "conflict": 409}


def web(request: Request) -> WebContext:
    """Return the app's ``WebContext``."""
    ctx: WebContext = request.app.state.web
    return ctx


def require_reader(request: Request) -> None:
    """Refuse a request that may not read (401): no identity where one is needed."""
    if not web(request).auth.may_read(request):
        raise HTTPException(401, "log in first: /login (or an authenticating proxy)")


def decide(request: Request, decision: DecisionRequest) -> DecisionResult:
    """Carry out a person's decision through the one decide flow, commit, wake the sender.

    Raises HTTPException: 403/404/409 for a refusal (nothing changed), 503 when the store fails.
    """
    ctx = web(request)
    settings = ctx.settings
    try:
        with ctx.session() as session:
            result = notify_flows.decide(
                decision,
                session=session,
                approvers=tuple(settings.containment.approvers),
                slack=settings.slack,
                pagerduty=settings.pagerduty,
                grafana=settings.grafana,
            )
            session.commit()
    except ApprovalError as exc:
        raise HTTPException(STATUS.get(exc.reason, 400), exc.detail or exc.reason) from exc
    except StoreError as exc:
        log.warning("store failed decision=%s error=%s", decision.kind.value, exc)
        raise HTTPException(503, "the incident store is unavailable") from exc
    ctx.changed()
    return result
