"""A hostile or careless sender at ``POST /api/alertmanager``, over real HTTP (uvicorn, SQLite).

The store holds the generated cascade of ``llm/vllm-llama`` (open, replayed near the wall
clock), as in ``test_alertmanager_http``; the payloads are
``tests/unit/fixtures/alertmanager_webhook_v4.json`` (its ``_source`` says where it comes
from) with one field made hostile per test: times without an offset or past year 9999 in
UTC, an alert from the future, label names the answer must not echo, markup and control
characters on their way to the incident page.
"""

from __future__ import annotations

import base64
import copy
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from http_helpers import serving
from recordings import awaiting_now
from sqlalchemy import func, select

from detector import db
from detector.config import DatabaseSettings, Settings, WebSettings
from detector.incidents.models import Alert, Evidence, Incident

TOKEN = "alertmanager-token-0123456789"
PAYLOAD = json.loads(
    (Path(__file__).parents[1] / "unit/fixtures/alertmanager_webhook_v4.json").read_text()
)
BEARER = f"Bearer {TOKEN}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from detector.pipeline import replay

    tmp = tmp_path_factory.mktemp("attack")
    url = f"sqlite:///{tmp / 'detector.db'}"
    settings = Settings(
        database=DatabaseSettings(url=url),
        web=WebSettings(tokens={"alertmanager": TOKEN}),  # type: ignore[dict-item]
    )
    incident = replay([awaiting_now(tmp / "cascade")], settings).incidents[0]
    with serving(settings) as base:
        yield {"base": base, "url": url, "incident": incident.id}


def post(base: str, payload: Any, auth: str | None = BEARER) -> tuple[int, Any]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    req = urllib.request.Request(base + "/api/alertmanager", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def scalar(url: str, stmt: Any) -> Any:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            return s.scalar(stmt)
    finally:
        engine.dispose()


def one_alert(**changes: Any) -> dict[str, Any]:
    payload = copy.deepcopy(PAYLOAD)
    alert = {**payload["alerts"][0], **changes}
    payload["alerts"] = [alert]
    payload["groupKey"] = f"attack:{time.time_ns()}"  # a fresh delivery each time
    return payload


@pytest.mark.parametrize(
    ("starts_at", "ends_at", "status"),
    [("2026-12-08T00:40:12", "0001-01-01T00:00:00Z", "firing"),  # no offset
     ("2026-12-08T00:40:12Z", "2026-12-08T00:45:00", "resolved"),  # no offset on endsAt
     ("9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00Z", "firing"),  # year 10000 in UTC
     ("0001-01-01T00:00:00+01:00", "0001-01-01T00:00:00Z", "firing")],  # year 0 in UTC
)  # fmt: skip
def test_a_time_without_offset_or_past_the_calendar_is_400_not_500(
    server: dict[str, Any], starts_at: str, ends_at: str, status: str
) -> None:
    before = scalar(server["url"], select(func.count()).select_from(Alert))
    code, answer = post(server["base"], one_alert(startsAt=starts_at, endsAt=ends_at,
                                                  status=status))  # fmt: skip
    assert code == 400, answer
    assert "version 4" in json.dumps(answer)
    assert scalar(server["url"], select(func.count()).select_from(Alert)) == before


def test_an_alert_from_the_future_does_not_move_the_incident_into_it(
    server: dict[str, Any],
) -> None:
    code, answer = post(server["base"], one_alert(startsAt="9999-12-31T23:59:59Z",
                                                  fingerprint="f00d000000000001"))  # fmt: skip
    assert code == 200, answer
    assert [a["outcome"] for a in answer["alerts"]] == ["evidence"]
    after = datetime.now(UTC).replace(tzinfo=None)
    updated = scalar(server["url"], select(Incident.updated_at)
                     .where(Incident.id == server["incident"]))  # fmt: skip
    assert updated.replace(tzinfo=None) <= after
    latest = scalar(server["url"], select(func.max(Evidence.time))
                    .where(Evidence.incident_id == server["incident"]))  # fmt: skip
    assert latest.replace(tzinfo=None) <= after


def test_the_400_names_no_label_of_the_input(server: dict[str, Any]) -> None:
    labels = {**PAYLOAD["alerts"][0]["labels"], "SECRET<script>label": 7,
              "SECRET\x1b[2J": {"nested": ["SECRET"]}}  # fmt: skip
    code, answer = post(server["base"], one_alert(labels=labels))
    assert code == 400, answer
    text = json.dumps(answer)
    assert "SECRET" not in text
    places = [p["loc"] for p in answer["detail"]["problems"]]
    assert ["alerts", 0, "labels", "<key>"] in places


def test_markup_and_control_characters_reach_the_page_as_text(server: dict[str, Any]) -> None:
    hostile = "<script>alert(1)</script> <!channel> *bold* \x1b[2J\u202eevil"
    labels = {**PAYLOAD["alerts"][0]["labels"], "alertname": "KubePodCrashLooping"}
    code, answer = post(server["base"], one_alert(
        labels=labels, fingerprint="f00d000000000002",
        annotations={"summary": hostile, "description": hostile}))  # fmt: skip
    assert code == 200, answer
    with urllib.request.urlopen(f"{server['base']}/incidents/{server['incident']}",
                                timeout=30) as response:  # fmt: skip
        page = response.read().decode()
    assert "<script>alert(1)</script>" not in page
    assert "\x1b" not in page and "\u202e" not in page


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "auth",
    [basic(f"alertmanager: {TOKEN} "), basic(f"alertmanager:{TOKEN}\n"),
     basic("alertmanager:"), basic(f":{TOKEN}"), basic(TOKEN), f"Digest {TOKEN}",
     f"Bearer{TOKEN}", "Bearer ", "Basic ", "Basic ===="],
)  # fmt: skip
def test_credentials_near_the_token_are_401(server: dict[str, Any], auth: str) -> None:
    code, answer = post(server["base"], one_alert(fingerprint="f00d000000000003"), auth)
    assert code == 401, answer
