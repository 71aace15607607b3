"""``POST /slack/interactions``: Slack's signed interaction requests (the Approve/Deny clicks).

The request is verified (``detector.notify.slack.interactions.signed_payload``: a bad
signature or a timestamp over 5 minutes old gets 401), acknowledged at once with an empty
200 (Slack waits 3 s at most: https://api.slack.com/interactivity/handling#acknowledgment_response),
and carried out after the answer is sent (a background task): the decision, and an
ephemeral message to the user when it is refused. 404 when Slack is not configured; 413 for a
body over ``MAX_BODY_BYTES`` (Slack's payloads are a few kilobytes).
"""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, HTTPException, Request, Response

from detector.errors import NotifyError
from detector.notify.slack.interactions import signed_payload
from detector.web.deps import web

MAX_BODY_BYTES = 1 << 20


router = APIRouter()


@router.post("/slack/interactions")
async def slack_interactions(request: Request, background: BackgroundTasks) -> Response:
    """Verify, acknowledge, then carry out one Slack interaction."""
    ctx = web(request)
    slack = ctx.settings.slack
    if slack.signing_secret is None or ctx.notifier is None:
        raise HTTPException(404, "Slack interactions are not configured")
    length = request.headers.get("Content-Length", "")
    if length.isascii() and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise HTTPException(413, "the request body is too large")
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise HTTPException(413, "the request body is too large")
    try:
        payload = signed_payload(
            body,
            request.headers.get("X-Slack-Request-Timestamp", ""),
            request.headers.get("X-Slack-Signature", ""),
            slack.signing_secret.get_secret_value(),
        )
    except NotifyError as exc:
        status = 401 if exc.reason == "bad_signature" else 400
        raise HTTPException(status, exc.detail) from exc
    background.add_task(ctx.notifier.interactions.handle, payload)
    return Response(status_code=200)
