"""Grafana annotations end to end against a local stand-in of the annotations API: each
stage change and each applied or lifted step of the replayed cascade, once, with the
incident's tags; a refused token is not retried, a 503 is.

The stand-in checks what Grafana's ``POST /api/annotations`` takes
(https://grafana.com/docs/grafana/latest/developers/http_api/annotations/#create-annotation):
a bearer token, ``time`` (epoch ms, integer), ``tags`` (strings), ``text``, optional
``dashboardUID``/``panelId``/``timeEnd``; answers ``{"message": "Annotation added", "id": N}``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from recordings import cascade
from sqlalchemy import select, update

from detector import db
from detector.config import CorrelateSettings, DatabaseSettings, GrafanaSettings, Settings
from detector.incidents.models import TimelineEntry
from detector.notify.models import OutboxEvent
from detector.notify.senders import deliver as deliver_events
from detector.pipeline import replay

TOKEN = "glsa_0123456789abcdef0123456789abcdef_01234567"
FIELDS = frozenset({"time", "timeEnd", "tags", "text", "dashboardUID", "panelId"})


class Grafana:
    """The annotations API on a free loopback port; ``annotations`` holds those accepted."""

    def __init__(self) -> None:
        self.annotations: list[dict[str, Any]] = []
        self.faults: list[int] = []
        self.refused: list[int] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, path: str, auth: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if path != "/api/annotations":
            return 404, {"message": "Not found"}
        if self.faults:
            status = self.faults.pop(0)
            self.refused.append(status)
            return status, {"message": "injected fault"}
        if auth != f"Bearer {TOKEN}":
            self.refused.append(401)
            return 401, {"message": "Unauthorized"}
        problem = _problem(body)
        if problem:
            self.refused.append(400)
            return 400, {"message": problem}
        self.annotations.append(json.loads(body))
        return 200, {"message": "Annotation added", "id": len(self.annotations)}

    def __enter__(self) -> Grafana:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _problem(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return "bad request data"
    if not isinstance(data, dict) or set(data) - FIELDS:
        return "unknown fields"
    if not isinstance(data.get("time"), int) or not isinstance(data.get("text"), str):
        return "time (epoch ms) and text are required"
    tags = data.get("tags", [])
    if not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        return "tags must be strings"
    return ""


class _Handler(BaseHTTPRequestHandler):
    def __init__(self, grafana: Grafana, *args: Any) -> None:
        self.grafana = grafana
        super().__init__(*args)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, answer = self.grafana.answer(self.path, self.headers.get("Authorization", ""), body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def grafana() -> Iterator[Grafana]:
    with Grafana() as g:
        yield g


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cascade(tmp_path_factory.mktemp("rec") / "cascade")


def settings(url: str, grafana: Grafana, token: str = TOKEN) -> Settings:
    return Settings(
        database=DatabaseSettings(url=url),
        correlate=CorrelateSettings(quiet_s=5),
        grafana=GrafanaSettings(url=grafana.url, token=token),  # type: ignore[arg-type]
    )


def deliver(s: Settings) -> tuple[int, int]:
    return deliver_events(s, page=False, annotate=True)["grafana"]


def entries(url: str, *kinds: str) -> list[TimelineEntry]:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            found = list(s.scalars(select(TimelineEntry).where(TimelineEntry.kind.in_(kinds))
                                   .order_by(TimelineEntry.id)))  # fmt: skip
            s.expunge_all()
            return found
    finally:
        engine.dispose()


def events(url: str) -> list[OutboxEvent]:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            found = list(s.scalars(select(OutboxEvent).order_by(OutboxEvent.id)))
            s.expunge_all()
            return found
    finally:
        engine.dispose()


def test_stage_changes_and_acting_steps_are_annotated_once(
    sqlite_url: str, grafana: Grafana, recording: Path
) -> None:
    s = settings(sqlite_url, grafana)
    result = replay([recording], s, annotate=True)
    key = result.incidents[0].key
    sent, pending = deliver(s)
    assert pending == 0 and sent == len(grafana.annotations)
    stages = [a for a in grafana.annotations if any(t.startswith("stage:") for t in a["tags"])]
    assert [a["tags"][-1] for a in stages] == [
        "stage:suspected", "stage:cascading", "stage:contained", "stage:resolved"
    ]  # fmt: skip
    steps = [a for a in grafana.annotations if a not in stages]
    assert steps and all(" applied" in a["text"] or " lifted" in a["text"] for a in steps)
    assert all(
        a["tags"][:4] == ["gpu-oom-cascade", "namespace:llm", "workload:vllm-llama",
                          f"incident:{key}"]
        for a in grafana.annotations
    )  # fmt: skip
    stage_rows = entries(sqlite_url, "stage")
    assert [a["time"] for a in stages] == [round(e.time.timestamp() * 1000) for e in stage_rows]
    assert all(a["text"].startswith("[drill] ") for a in grafana.annotations)

    replay([recording], s, annotate=True)  # the same records again: nothing new
    assert deliver(s) == (0, 0)
    assert len(grafana.annotations) == sent


def test_nothing_is_annotated_unless_asked(
    sqlite_url: str, grafana: Grafana, recording: Path
) -> None:
    replay([recording], settings(sqlite_url, grafana))
    assert events(sqlite_url) == []


def test_a_503_is_retried_and_a_refused_token_is_not(
    sqlite_url: str, grafana: Grafana, recording: Path
) -> None:
    s = settings(sqlite_url, grafana, token="glsa_wrong_token_0000000000")
    replay([recording], s, annotate=True)
    queued = len(events(sqlite_url))
    grafana.faults.append(503)
    assert deliver(s) == (0, queued)  # the first waits for its back-off; the rest behind it
    first = events(sqlite_url)[0]
    assert "HTTP 503" in first.error and first.sent_at is None and first.attempts == 1
    engine = db.make_engine(sqlite_url)
    try:
        with db.session_factory(engine)() as session:
            session.execute(update(OutboxEvent).values(due_at=first.time))  # due now
            session.commit()
    finally:
        engine.dispose()
    assert deliver(s) == (0, 0)  # each refused (401) once, closed with the reason
    assert grafana.refused == [503] + [401] * queued
    assert all(e.error.startswith("refused: HTTP 401") for e in events(sqlite_url))
    assert deliver(s) == (0, 0)
    assert grafana.annotations == []
