"""The web app factory: the pages, the JSON API, the approvals API and Slack's interactions.

``create_app(settings)`` opens the store at startup (migrating it) and disposes of it at
shutdown; with Slack configured it runs the ``Notifier`` (the sender, and Socket Mode) while it
serves. Routers, one per surface: ``pages`` (HTML), ``api`` (JSON, health), ``approvals``
(bearer-token decisions), ``slack`` (signed interactions). Every request sees one
``WebContext`` (``request.app.state.web``). Assets are served by the app itself (``/static``):
no CDN, no external font.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.sessions import SessionMiddleware

from detector import db
from detector.config import Settings
from detector.notify.senders import workers
from detector.notify.slack.notifier import Notifier
from detector.web import alertmanager, api, approvals, lifecycle, pages, sessions, slack
from detector.web.auth import Auth
from detector.web.context import WebContext
from detector.web.limits import BoundedBody

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
MAX_PROBLEMS = 10  # a 422 lists at most this many problems
MAX_PROBLEM_CHARS = 200  # and cuts each message (and each part of its location) to this


async def invalid_request(_request: Request, exc: Exception) -> Response:
    """Answer 422 with where and what is wrong, never the input given: it may be long or secret.

    FastAPI's own handler echoes each invalid value (``input``) back, a 2,000-character body
    included (https://fastapi.tiangolo.com/tutorial/handling-errors/).
    """
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    problems = [
        {
            "loc": [_cut(part) for part in err.get("loc", ())][:MAX_PROBLEMS],
            "msg": str(err.get("msg", ""))[:MAX_PROBLEM_CHARS],
            "type": str(err.get("type", ""))[:MAX_PROBLEM_CHARS],
        }
        for err in errors[:MAX_PROBLEMS]
    ]
    return JSONResponse({"detail": problems, "problems": len(errors)}, status_code=422)


def _cut(part: object) -> int | str:
    return part if isinstance(part, int) else str(part)[:MAX_PROBLEM_CHARS]


def server_config(app: FastAPI, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """Return the uvicorn configuration ``detector serve`` runs ``app`` with.

    Without uvicorn's proxy-header rewriting (``proxy_headers=False``): by default uvicorn
    replaces the client address with ``X-Forwarded-For`` for peers on 127.0.0.1, before the
    app can check the peer, so any local process could claim a trusted proxy's address and
    act as anyone. The peer the app sees is the socket's; ``Auth`` alone reads forwarded
    headers, from ``DETECTOR_WEB__TRUSTED_PROXIES`` only. No ``Server`` header either.
    """
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, proxy_headers=False, server_header=False
    )


def create_app(settings: Settings) -> FastAPI:
    """Return the web app for ``settings`` (see the module doc)."""
    secret = settings.web.session_secret
    key = secret.get_secret_value().encode() if secret else secrets.token_bytes(32)

    def ended(sid: str) -> bool:
        with ctx.session() as store:
            return sessions.is_ended(store, sid)

    ctx = WebContext(settings, Auth(settings.web, key, ended))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        db.upgrade(settings.database.url)
        engine = db.make_engine(settings.database.url)
        ctx.make_session = db.session_factory(engine)
        if settings.slack.enabled:
            ctx.notifier = Notifier(settings, ctx.make_session)
            ctx.notifier.start()
        ctx.workers = workers(settings, ctx.make_session)  # PagerDuty, Grafana
        for worker in ctx.workers:
            worker.start()
        try:
            yield
        finally:
            if ctx.notifier is not None:
                ctx.notifier.stop()
            for worker in ctx.workers:
                worker.stop()
            engine.dispose()

    app = FastAPI(
        title="GPU OOM cascade detector",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",  # what schemathesis and API clients read
    )
    app.state.web = ctx
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, pages.refused)

    @app.middleware("http")
    async def boundary(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        try:
            response = await call_next(request)
        except Exception:  # the HTTP boundary: log the context, answer 500
            log.exception("request failed method=%s path=%s", request.method, request.url.path)
            return JSONResponse({"detail": "internal error"}, status_code=500)
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'",
        )
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response

    app.add_middleware(
        SessionMiddleware,
        secret_key=key.hex(),
        session_cookie="detector_session",
        same_site="strict",
        https_only=settings.web.base_url.startswith("https://"),
        max_age=sessions.SESSION_MAX_AGE_S,
    )
    # added last: the outermost; the Alertmanager receiver also takes basic auth
    app.add_middleware(BoundedBody, bearer=alertmanager.edge_auth(ctx.auth))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.include_router(api.router)
    app.include_router(lifecycle.router)  # before approvals' catch-all POST
    app.include_router(approvals.router)
    app.include_router(alertmanager.router)
    app.include_router(slack.router)
    app.include_router(pages.router)
    return app
