"""The JSON API and the health checks.

``GET /healthz``: the process is up (200). ``GET /readyz``: the store answers (200, else 503).
``GET /api/incidents``: the incident list (``?stage=&namespace=&since_h=``; open ones first)
and the "not this pattern" verdicts. ``GET /api/incidents/{id or key}``: the incident document
(``detector.report.document.incident_document``) with its evidence (original text and source)
and its time series. Reading needs an identity unless the server binds to loopback or
``DETECTOR_WEB__PUBLIC_READ`` is set (``detector.web.auth``): 401 otherwise.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from sqlalchemy import text

from detector.errors import StoreError
from detector.incidents import service
from detector.report.document import incident_document
from detector.report.listing import list_incidents
from detector.report.read import load_incident
from detector.report.series import SERIES_BUCKET_S, load_series
from detector.web.deps import require_reader, web

router = APIRouter()
DECISION_PATH = re.compile(r"/steps/[^/]+/(approve|deny)$")
reader = Depends(require_reader)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Answer while the process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(request: Request) -> dict[str, str]:
    """Answer 200 when the store answers a query, 503 otherwise."""
    try:
        with web(request).session() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:  # any store failure means not ready
        raise HTTPException(503, "the incident store does not answer") from exc
    return {"status": "ready"}


@router.get("/api/incidents", dependencies=[reader])
def incidents(
    request: Request,
    stage: str = "",
    namespace: str = "",
    since_h: float = Query(0.0, ge=0, le=1e6, description="hours back; 0: no time filter"),
) -> dict[str, Any]:
    """Return the incident list and the verdicts (see the module doc)."""
    since = datetime.now(UTC) - timedelta(hours=since_h) if since_h > 0 else None
    try:
        with web(request).session() as session:
            rows = list_incidents(session=session, stage=stage or None,
                                  namespace=namespace or None, since=since)  # fmt: skip
            verdicts = service.list_verdicts(session=session)
    except StoreError as exc:
        raise HTTPException(503, "the incident store is unavailable") from exc
    return {
        "incidents": [asdict(r) | {"open": r.open} for r in rows],
        "verdicts": [
            {
                "workload": f"{v.namespace}/{v.workload}",
                "verdict": v.verdict,
                "reason": v.reason,
                "time": v.time,
            }
            for v in verdicts[:500]
        ],
    }


@router.get("/api/incidents/{ref:path}", dependencies=[reader])
def incident(request: Request, ref: str) -> dict[str, Any]:
    """Return one incident's document, evidence and series; 404 when there is none."""
    if DECISION_PATH.search(ref):  # a decision's URL asked with GET
        raise HTTPException(405, "decide with POST", headers={"Allow": "POST"})
    return incident_view(request, ref)


def incident_view(request: Request, ref: str) -> dict[str, Any]:
    """Return the JSON view of an incident (the page reads the same); raises HTTPException."""
    try:
        with web(request).session() as session:
            found = load_incident(session=session, ref=ref)
            if found is None:
                raise HTTPException(404, "no such incident")
            inc = found.model_dump(mode="json")
            series = load_series(session=session, incident_id=found.id)
    except StoreError as exc:
        raise HTTPException(503, "the incident store is unavailable") from exc
    doc = incident_document(inc)
    evidence = {e["id"]: e for e in inc["evidence"]}
    return doc | {
        "namespace": inc["namespace"],
        "updated_at": inc["updated_at"],
        "resolved_at": inc["resolved_at"],
        "victims": inc["victims"],
        "evidence": list(evidence.values()),
        "series": [r.model_dump(mode="json") for r in series],
        "series_bucket_s": SERIES_BUCKET_S,
        "timeline": [
            {
                "id": t["id"],
                "time": t["time"],
                "kind": t["kind"],
                "message": t["message"],
                "evidence_id": t["evidence_id"],
                "detail": t.get("detail"),
            }
            for t in inc["timeline"]
        ],
    }
