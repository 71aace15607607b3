"""The HTML pages: the incident list, the incident timeline, dead letters, login, decisions.

Rendered server-side with Jinja2 (autoescape on: every value from input is text, never markup)
from the read model; they work without JavaScript, and ``/static/live.js`` refreshes an open
incident's page in place (it asks for ``?partial=1`` and swaps the content only when its
``data-version`` changed). Decisions (approve/deny a step, arm/disarm a workload, the kill
switch) take two steps: a confirmation page that shows what will happen, then a POST with the
identity's CSRF token, through the one decide flow. Reading needs an identity unless the
server binds to loopback or ``DETECTOR_WEB__PUBLIC_READ`` is set (``detector.web.auth``).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from detector.errors import PostmortemError, StoreError
from detector.incidents import service
from detector.notify.slack.blocks import BLAST_PARAMS
from detector.postmortem.export import export_postmortem
from detector.postmortem.render import FORMATS
from detector.report.dead_letters import load_dead_letters
from detector.report.document import decidable, past_expiry
from detector.report.listing import list_incidents
from detector.report.now import down_spans
from detector.runbooks.flows import DecisionKind, DecisionRequest
from detector.textsafe import printable
from detector.web import sessions
from detector.web.api import incident_view
from detector.web.auth import SID_KEY
from detector.web.charts import charts
from detector.web.deps import decide, web

router = APIRouter()
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
# Every value from input is printed with its control and bidi characters shown as escapes,
# then autoescaped: text, never markup or a control code.
templates.env.finalize = lambda value: printable(value) if isinstance(value, str) else value


def _utc(value: str | datetime | None, date: bool = True) -> str:
    """Format a time (ISO text or datetime) the one way the pages show times: UTC, seconds."""
    if not value:
        return ""
    when = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    when = when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC" if date else "%H:%M:%S")


templates.env.filters["utc"] = _utc
PAGE_SIZE = 200  # timeline entries per page
STAGES = ("suspected", "cascading", "contained", "resolved")
CONTROLS = {
    "arm": DecisionKind.ARM,
    "disarm": DecisionKind.DISARM,
    "kill-switch-on": DecisionKind.KILL_SWITCH_ON,
    "kill-switch-off": DecisionKind.KILL_SWITCH_OFF,
}


def _page(request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
    ctx = web(request)
    who = ctx.auth.identity(request)
    values = {"dry_run": ctx.settings.dry_run} | values
    values |= {"who": who, "csrf": ctx.auth.csrf_token(who) if who else ""}
    return templates.TemplateResponse(request, name, values, status_code=status)


# The paths whose refusals are answered as JSON (clients, not people): everything else is a page.
_MACHINE_PATHS = ("/api/", "/slack/", "/healthz", "/readyz", "/static/")
_HEADINGS = {401: "Log in first", 403: "Refused", 404: "Not found", 409: "Nothing changed",
             413: "Too large", 503: "The incident store is unavailable"}  # fmt: skip


async def refused(request: Request, exc: Exception) -> Response:
    """Answer an ``HTTPException`` on a page as a page (the status, the reason, a way back);
    on the API, Slack and probe paths as FastAPI's JSON (``{"detail": ...}``)."""
    assert isinstance(exc, StarletteHTTPException)
    if request.url.path.startswith(_MACHINE_PATHS):
        return await http_exception_handler(request, exc)
    status = exc.status_code
    detail = printable(str(exc.detail), one_line=True)
    back = request.url.path.split("/steps/", 1)[0] if "/steps/" in request.url.path else "/"
    values = {"status": status, "heading": _HEADINGS.get(status, f"Error {status}"),
              "detail": detail, "back": back}  # fmt: skip
    try:
        return _page(request, "refused.html", status, **values)
    except Exception:  # an answer whatever state the session is in
        return templates.TemplateResponse(request, "refused.html", values, status_code=status)


def _reader(request: Request) -> RedirectResponse | None:
    if web(request).auth.may_read(request):
        return None
    target = quote(str(request.url.path) + ("?" + request.url.query if request.url.query else ""))
    return RedirectResponse(f"/login?next={target}", status_code=303)


@router.get("/", include_in_schema=False)
def home() -> RedirectResponse:
    """Send people to the incident list."""
    return RedirectResponse("/incidents", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/incidents") -> HTMLResponse:
    """Show the login form (a token of ``DETECTOR_WEB__TOKENS``)."""
    return _login_page(request, 200, next, "")


def _login_page(request: Request, status: int, next: str, error: str) -> HTMLResponse:
    login_csrf = web(request).auth.login_csrf(request)
    return _page(request, "login.html", status, next=_local(next), error=error,
                 login_csrf=login_csrf)  # fmt: skip


@router.post("/login", response_model=None)
def login(
    request: Request, token: str = Form(""), next: str = Form("/incidents"), csrf: str = Form("")
) -> HTMLResponse | RedirectResponse:
    """Start a session for the token's owner; 401 with the form again when it is unknown,
    403 when the form came from another site or without this session's login token."""
    auth = web(request).auth
    if not auth.same_origin(request) or not auth.check_login_csrf(request, csrf):
        error = "the login form is stale or from another site: log in again"
        return _login_page(request, 403, next, error)
    who = auth.login(token)
    if who is None:
        return _login_page(request, 401, next, "unknown token")
    web(request).auth.start_session(request, who)
    return RedirectResponse(_local(next), status_code=303)


@router.post("/logout")
def logout(request: Request, csrf: str = Form("")) -> RedirectResponse:
    """End the session, here and server-side (a copy of its cookie no longer works)."""
    who = _actor(request, csrf)
    sid = request.session.get(SID_KEY)
    if isinstance(sid, str) and sid:
        with web(request).session() as store:
            sessions.end(store, sid, who)
            store.commit()
    request.session.clear()
    return RedirectResponse("/incidents", status_code=303)


@router.get("/incidents", response_class=HTMLResponse, response_model=None)
def incidents(
    request: Request, stage: str = "", namespace: str = "", since_h: str = ""
) -> Response:
    """List the incidents (open ones first) and the verdicts, with filters (an empty or
    unreadable ``since_h`` is no time filter)."""
    if (redirect := _reader(request)) is not None:
        return redirect
    hours = _hours(since_h)
    since = datetime.now(UTC) - timedelta(hours=hours) if hours else None
    with web(request).session() as session:
        rows = list_incidents(session=session, stage=stage or None,
                              namespace=namespace or None, since=since)  # fmt: skip
        verdicts = service.list_verdicts(session=session)[:200]
    filters = {"stage": stage, "namespace": namespace, "since_h": f"{hours:g}" if hours else ""}
    return _page(request, "incidents.html", rows=rows, verdicts=verdicts, filters=filters,
                 stages=STAGES)  # fmt: skip


@router.get(
    "/incidents/{ref:path}/steps/{position}/{action}",
    response_class=HTMLResponse,
    response_model=None,
)
def confirm_step(request: Request, ref: str, position: int, action: str) -> Response:
    """Show what approving or denying the step does, with the form that does it."""
    if (redirect := _reader(request)) is not None:
        return redirect
    if action not in ("approve", "deny"):
        raise HTTPException(404, "no such action")
    view = incident_view(request, ref)
    step = next((s for s in view["steps"] if s["position"] == position), None)
    if step is None:
        raise HTTPException(404, "no such step")
    return _page(request, "confirm_step.html", inc=view, step=_step_view(step), action=action)


# --- the postmortem export (detector.postmortem.export): Markdown, HTML, JSON -------------
# The HTML export is one self-contained file: its own stylesheet inline, no script at all.
_EXPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"


@router.get("/incidents/{ref:path}/postmortem.{fmt}", response_model=None)
def postmortem(request: Request, ref: str, fmt: str) -> Response:
    """Serve the incident's postmortem draft (``fmt``: md, html, json); a verdict's for a
    workload with a "not this pattern" verdict. Read access as the incident page."""
    if (redirect := _reader(request)) is not None:
        return redirect
    if fmt not in FORMATS:
        raise HTTPException(404, "no such format: postmortem.md, .html or .json")
    ctx = web(request)
    try:
        with ctx.session() as session:
            found = export_postmortem(session=session, ref=ref, fmt=fmt, settings=ctx.settings)
    except PostmortemError as exc:
        raise HTTPException(404, "no such incident or verdict") from exc
    except StoreError as exc:
        raise HTTPException(503, "the incident store is unavailable") from exc
    disposition = f'inline; filename="{found.filename}"'
    headers = {"Content-Disposition": disposition, "Content-Security-Policy": _EXPORT_CSP}
    return Response(found.data, media_type=found.media_type, headers=headers)


@router.get("/incidents/{ref:path}/{plot}.svg", response_model=None)
def postmortem_plot(request: Request, ref: str, plot: str) -> Response:
    """Serve a plot the Markdown postmortem links beside it (``traffic.svg``, ``pressure.svg``)."""
    if (redirect := _reader(request)) is not None:
        return redirect
    ctx = web(request)
    try:
        with ctx.session() as session:
            found = export_postmortem(session=session, ref=ref, fmt="md", settings=ctx.settings)
    except PostmortemError as exc:
        raise HTTPException(404, "no such incident") from exc
    except StoreError as exc:
        raise HTTPException(503, "the incident store is unavailable") from exc
    svg = dict(found.plots).get(f"{plot}.svg")
    if svg is None:
        raise HTTPException(404, "no such plot: traffic.svg or pressure.svg")
    return Response(
        svg, media_type="image/svg+xml", headers={"Content-Security-Policy": _EXPORT_CSP}
    )


@router.get("/incidents/{ref:path}", response_class=HTMLResponse, response_model=None)
def incident(
    request: Request, ref: str, kind: str = "", page: int = 1, partial: bool = False
) -> Response:
    """Show one incident: header, charts, steps, questions, timeline (paged), evidence."""
    if (redirect := _reader(request)) is not None:
        return redirect
    view = incident_view(request, ref)
    version = hashlib.sha256(json.dumps(view, sort_keys=True, default=str).encode()).hexdigest()
    kinds = sorted({t["kind"] for t in view["timeline"]})
    shown = [t for t in view["timeline"] if not kind or t["kind"] == kind]
    pages = max(1, -(-len(shown) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    settings = web(request).settings
    steps = [_step_view(s) for s in view["steps"]]
    values: dict[str, Any] = {
        "inc": view,
        "version": version[:16],
        "charts": charts(
            _series(view),
            _markers(view),
            settings.correlate.kv_cache_ceiling,
            view["series_bucket_s"],
            down_spans(view),
        ),
        "steps": steps,
        "waiting": [st for st in steps if st["waiting"]],
        "detected": _detected(view),
        "kinds": kinds,
        "kind": kind,
        "entries": shown[(page - 1) * PAGE_SIZE : page * PAGE_SIZE],
        "page": page,
        "pages": pages,
        "evidence": {e["id"]: e for e in view["evidence"]},
        "query": lambda **q: "?" + urlencode({"kind": kind, "page": page} | q),
        "partial": partial,
    }
    return _page(request, "incident_body.html" if partial else "incident.html", **values)


@router.post("/incidents/{ref:path}/steps/{position}/{action}")
def decide_step(
    request: Request,
    ref: str,
    position: int,
    action: str,
    csrf: str = Form(""),
    plan: str = Form(""),
    reason: str = Form("", max_length=1000),
) -> RedirectResponse:
    """Approve or deny the step as the logged-in approver; then back to the incident."""
    if action not in ("approve", "deny"):
        raise HTTPException(404, "no such action")
    who = _actor(request, csrf)
    kind = DecisionKind.APPROVE if action == "approve" else DecisionKind.DENY
    decide(request, DecisionRequest(kind, "web", who, reason, incident=ref,
                                    step=str(position), plan=plan))  # fmt: skip
    return RedirectResponse(f"/incidents/{quote(ref)}", status_code=303)


@router.get("/controls/{action}", response_class=HTMLResponse, response_model=None)
def confirm_control(request: Request, action: str, workload: str = "") -> Response:
    """Show what arming, disarming or the kill switch does, with the form that does it."""
    if (redirect := _reader(request)) is not None:
        return redirect
    if action not in CONTROLS:
        raise HTTPException(404, "no such control")
    return _page(request, "confirm_control.html", action=action, workload=workload)


@router.post("/controls/{action}")
def control(
    request: Request,
    action: str,
    csrf: str = Form(""),
    workload: str = Form(""),
    reason: str = Form("", max_length=1000),
) -> RedirectResponse:
    """Arm or disarm a workload, or switch the kill switch, as the logged-in approver."""
    kind = CONTROLS.get(action)
    if kind is None:
        raise HTTPException(404, "no such control")
    who = _actor(request, csrf)
    if who not in web(request).settings.containment.approvers:
        raise HTTPException(403, f"{who!r} is not on the approver allow-list")
    decide(request, DecisionRequest(kind, "web", who, reason, workload=workload))
    return RedirectResponse("/incidents", status_code=303)


@router.get("/dead-letters", response_class=HTMLResponse, response_model=None)
def dead_letters(request: Request, reason: str = "") -> Response:
    """List the rejected records by reason, with their raw bytes shown as text."""
    if (redirect := _reader(request)) is not None:
        return redirect
    try:
        with web(request).session() as session:
            found = load_dead_letters(session=session, reason=reason or None, limit=200)
    except StoreError as exc:
        raise HTTPException(503, "the incident store is unavailable") from exc
    return _page(request, "dead_letters.html", found=found, reason=reason)


def _hours(value: str) -> float:
    try:
        hours = float(value)
    except ValueError:
        return 0.0
    return hours if 0 < hours < 1e6 else 0.0


def _actor(request: Request, csrf: str) -> str:
    """Return the identity acting, on the allow-list, with a valid CSRF token; else 401/403."""
    ctx = web(request)
    if not ctx.auth.same_origin(request):
        raise HTTPException(403, "the form came from another site")
    who = ctx.auth.identity(request)
    if who is None:
        raise HTTPException(401, "log in first: /login")
    if not ctx.auth.check_csrf(who, csrf):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")
    return who


def _local(target: str) -> str:
    """Return ``target`` when it is a path of this site (no open redirect), else the list."""
    return target if target.startswith("/") and not target.startswith("//") else "/incidents"


def _step_view(step: dict[str, Any]) -> dict[str, Any]:
    approval = step["approval_state"]
    params = step.get("params") or {}
    radius = [(label, params[key]) for key, label in BLAST_PARAMS if params.get(key) not in
              (None, "", [])]  # fmt: skip
    return step | {"waiting": decidable(step), "radius": radius, "expired": past_expiry(approval)}


def _detected(view: dict[str, Any]) -> str:
    """Return how long after the first GPU OOM the incident reached ``cascading`` ("" if not)."""
    victims = sorted(view["victims"], key=lambda v: v["position"])
    cascading = [t for t in view["timeline"] if t["kind"] == "stage" and "cascading" in
                 t["message"].split(":", 1)[0]]  # fmt: skip
    if not victims or not cascading:
        return ""
    first = datetime.fromisoformat(victims[0]["first_oom_at"])
    seconds = (datetime.fromisoformat(cascading[0]["time"]) - first).total_seconds()
    return f"cascading detected {seconds:.0f} s after the first GPU OOM"


def _series(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the view's series rows with their times as datetimes (for ``charts``)."""
    return [r | {"time": datetime.fromisoformat(r["time"])} for r in view["series"]]


def _markers(view: dict[str, Any]) -> list[tuple[datetime, str, str]]:
    found = []
    for t in view["timeline"]:
        when = datetime.fromisoformat(t["time"])
        detail = t.get("detail") or {}
        if t["kind"] == "stage":
            found.append((when, "stage", t["message"].split(":", 1)[0]))
        elif t["kind"] == "signal" and t["message"].startswith("victim #"):
            found.append((when, "death", t["message"].split(":", 1)[0]))
        elif t["kind"] == "step" and detail.get("event") in ("applied", "lifted", "rolled_back"):
            found.append((when, "step", f"step {detail.get('position')} {detail.get('event')}"))
    return found
