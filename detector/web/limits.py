"""The HTTP edge: every request body is bounded before the app reads it, and the bearer API
is authenticated before its body is read (a pure ASGI middleware, ``BoundedBody``).

Without it FastAPI reads and parses a whole body before a handler can look at the token: two
concurrent 256 MiB bodies sent to the approve API without a token took the server to 1.4 GiB.
Here a ``Content-Length`` over the bound is answered 413 at once; a body without one (chunked)
is read up to the bound and answered 413 past it; a ``POST /api/...`` without a valid bearer
token is answered 401 before a byte of its body is read. What passes is handed to the app as
read (at most ``max_bytes`` held per request).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import HTTPException, Request
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1024 * 1024  # Slack's interaction payloads and decisions are far smaller


class BoundedBody:
    """Bound request bodies to ``max_bytes``; ``bearer(request)`` (raising HTTPException 401)
    authenticates ``POST /api/...`` before its body is read."""

    def __init__(
        self, app: ASGIApp, bearer: Callable[[Request], str], max_bytes: int = MAX_BODY_BYTES
    ) -> None:
        self.app = app
        self.bearer = bearer
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self._refused(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _too_large(self.max_bytes)(scope, receive, send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body: list[bytes] | None = chunks

        async def replay() -> Message:
            nonlocal body
            if body is None:
                return await receive()  # after the body: a disconnect, for streaming responses
            whole, body = b"".join(body), None
            return {"type": "http.request", "body": whole, "more_body": False}

        await self.app(scope, replay, send)

    def _refused(self, scope: Scope) -> Response | None:
        """Return the answer to a request refused on its headers alone, or None."""
        if scope["method"] == "POST" and str(scope["path"]).startswith("/api/"):
            try:
                self.bearer(Request(scope))
            except HTTPException as exc:
                return JSONResponse({"detail": exc.detail}, exc.status_code, exc.headers)
        length = Headers(scope=scope).get("content-length")
        if length is not None:
            if not (length.isascii() and length.isdigit()):
                return JSONResponse({"detail": "Content-Length is not a number"}, 400)
            if int(length) > self.max_bytes:
                return _too_large(self.max_bytes)
        return None


def _too_large(max_bytes: int) -> Response:
    return JSONResponse({"detail": f"the request body is over {max_bytes} bytes"}, 413)
