"""The Alertmanager receiver: ``POST /api/alertmanager`` takes the webhook payload, version 4.

Alertmanager's ``webhook_config`` sends it (https://prometheus.io/docs/alerting/latest/
configuration/#webhook_config), authenticated as its ``http_config`` can: ``authorization``
(``Authorization: Bearer <token>``) or ``basic_auth`` (user = the token's owner, password =
the token), with a token of ``DETECTOR_WEB__TOKENS``. Each alert joins the open incident of its
workload, or is kept as seen (``detector.incidents.alerts``). Answers: 200 with what became
of each alert (``evidence``, ``seen``, ``verdict``, ``unattributed``, ``duplicate``); 401
without valid credentials (before the body is read: ``detector.web.limits``); 400 for a body
that is not the payload, with where (fields and indexes; a place the input names, such as
a label's name, as ``<key>``) and what is wrong, never the body; 413 over the body
bound; 503 when the store fails.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from detector.errors import StoreError
from detector.incidents import alerts
from detector.textsafe import printable
from detector.web.auth import Auth
from detector.web.deps import web

log = logging.getLogger(__name__)

PATH = "/api/alertmanager"
MAX_PROBLEMS = 10
MAX_PROBLEM_CHARS = 200
CHALLENGE = {"WWW-Authenticate": 'Basic realm="detector", Bearer realm="detector"'}

router = APIRouter()


def sender(auth: Auth, request: Request) -> str:
    """Return who sends the request: a bearer token's owner, or basic auth's user when the
    password is that user's token. Raises HTTPException(401)."""
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic":
        try:
            return auth.bearer(request)
        except HTTPException as exc:
            raise HTTPException(401, exc.detail, headers=CHALLENGE) from exc
    try:
        decoded = base64.b64decode(presented.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise HTTPException(401, "malformed basic credentials", headers=CHALLENGE) from exc
    user, colon, password = decoded.partition(":")
    # The password is the token exactly: no padding (``Auth.login`` forgives a form's blanks).
    owner = auth.login(password) if colon and password == password.strip() else None
    if owner is None or owner != user:
        raise HTTPException(401, "invalid credentials", headers=CHALLENGE)
    return owner


def edge_auth(auth: Auth) -> Callable[[Request], str]:
    """Return the check ``BoundedBody`` runs before reading a ``POST /api/...`` body: this
    receiver's (bearer or basic), the bearer token elsewhere."""

    def check(request: Request) -> str:
        if request.url.path == PATH:
            return sender(auth, request)
        return auth.bearer(request)

    return check


def parse(body: bytes) -> alerts.WebhookIn:
    """Return the payload in ``body``; raises HTTPException(400) saying where and what is wrong
    (never the input)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPException(400, "the body is not JSON") from exc
    except RecursionError as exc:  # nested deeper than any Alertmanager payload
        raise HTTPException(400, "the body is nested too deep") from exc
    try:
        return alerts.WebhookIn.model_validate(data)
    except ValidationError as exc:
        problems = [
            {
                "loc": [_place(p) for p in err.get("loc", ())],
                "msg": str(err.get("msg", ""))[:MAX_PROBLEM_CHARS],
            }
            for err in exc.errors(include_input=False)[:MAX_PROBLEMS]
        ]
        raise HTTPException(400, {"reason": "not an Alertmanager webhook payload (version 4)",
                                  "problems": problems}) from exc  # fmt: skip


def _field_names() -> frozenset[str]:
    names: set[str] = set()
    for model in (alerts.WebhookIn, alerts.AlertIn):
        for name, field in model.model_fields.items():
            names.update(n for n in (name, field.alias) if n)
    return frozenset(names)


FIELDS = _field_names()
KEY = "<key>"  # a place named by the input (a label's name): never echoed


def _place(part: object) -> str | int:
    """Return one step of an error's place: an index, a field of the payload, else ``KEY``."""
    if isinstance(part, int):
        return part
    return part if isinstance(part, str) and part in FIELDS else KEY


@router.post(PATH)
async def receive(request: Request) -> Any:
    """Take Alertmanager's webhook payload (see the module doc)."""
    ctx = web(request)
    who = sender(ctx.auth, request)
    payload = parse(await request.body())
    try:
        received = await run_in_threadpool(_store, ctx.session, payload)
    except StoreError as exc:
        log.warning("store failed alertmanager group=%s error=%s",
                    printable(payload.group_key[:80], one_line=True), exc)  # fmt: skip
        raise HTTPException(503, "the incident store is unavailable") from exc
    ctx.changed()
    new = [r for r in received if r.outcome != "duplicate"]
    log.info("alertmanager delivery by=%s alerts=%d new=%d truncated=%d", who, len(received),
             len(new), payload.truncated_alerts)  # fmt: skip
    return {
        "alerts": [asdict(r) for r in received],
        "new": len(new),
        "duplicates": len(received) - len(new),
        "truncated": payload.truncated_alerts,
    }


def _store(make_session: Callable[[], Any], payload: alerts.WebhookIn) -> list[alerts.Received]:
    """Store the payload's alerts in one transaction; raises StoreError."""
    try:
        with make_session() as session:
            received = alerts.receive(payload, session=session, now=datetime.now(UTC))
            session.commit()
            return received
    except SQLAlchemyError as exc:
        raise StoreError(f"storing alerts failed: {type(exc).__name__}") from exc
