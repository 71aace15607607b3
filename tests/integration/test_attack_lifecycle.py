"""Lifecycle decisions raced and abused over real HTTP (uvicorn; SQLite and PostgreSQL).

The store holds the generated cascade (``recordings.cascade``), replayed at its recorded time:
``contained``, not resolved. Eight approvers press Acknowledge (or Resolve) at the same moment;
the first stands and the others are told it is done (409), never a second acknowledgement; a
form posted without its CSRF token, or by someone off the allow-list, changes nothing.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from http_helpers import serving
from recordings import cascade
from sqlalchemy import func, select

from detector import db
from detector.config import ContainmentSettings, DatabaseSettings, Settings, WebSettings
from detector.incidents.models import TimelineEntry
from detector.pipeline import replay

PEOPLE = {f"oncall{i}": f"token-of-oncall{i}-0123456789abcdef" for i in range(8)}
OUTSIDER = "outsider-token-0123456789abcdef"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite"
                                       else "postgres_url")  # fmt: skip
    settings = Settings(
        database=DatabaseSettings(url=url),
        containment=ContainmentSettings(approvers=list(PEOPLE)),
        web=WebSettings(tokens={**PEOPLE, "outsider": OUTSIDER}),  # type: ignore[dict-item]
    )
    result = replay([cascade(tmp_path / "rec")], settings)
    assert result.incidents[0].resolved_at is None
    with serving(settings) as base:
        yield {"base": base, "url": url, "key": result.incidents[0].key,
               "id": result.incidents[0].id}  # fmt: skip


def act(base: str, key: str, what: str, token: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body if body is not None else {}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    path = f"/api/incidents/{urllib.request.quote(key, safe='')}/{what}"
    req = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def lifecycle_entries(url: str, incident: int, act_: str) -> int:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            stmt = (
                select(func.count())
                .select_from(TimelineEntry)
                .where(TimelineEntry.incident_id == incident)
            )
            rows = s.scalars(select(TimelineEntry.detail).where(
                TimelineEntry.incident_id == incident)).all()  # fmt: skip
            assert s.scalar(stmt) == len(rows)
            return sum(1 for d in rows if (d or {}).get("lifecycle") == act_)
    finally:
        engine.dispose()


def race(served: dict[str, Any], what: str, body: Any = None) -> list[int]:
    start = threading.Barrier(len(PEOPLE))

    def one(token: str) -> int:
        start.wait()
        return act(served["base"], served["key"], what, token, body)[0]

    with ThreadPoolExecutor(len(PEOPLE)) as pool:
        return sorted(pool.map(one, PEOPLE.values()))


def test_eight_acknowledge_at_once_and_one_stands(served: dict[str, Any]) -> None:
    codes = race(served, "acknowledge")
    assert codes.count(200) == 1, codes
    assert set(codes) <= {200, 409}, codes
    assert lifecycle_entries(served["url"], served["id"], "acknowledged") == 1


def test_eight_resolve_at_once_and_one_stands(served: dict[str, Any]) -> None:
    codes = race(served, "resolve", {"reason": "the node was drained"})
    assert codes.count(200) == 1, codes
    assert set(codes) <= {200, 409}, codes
    assert lifecycle_entries(served["url"], served["id"], "resolved") == 1


def test_absurd_values_are_refused_and_change_nothing(served: dict[str, Any]) -> None:
    base, key, token = served["base"], served["key"], PEOPLE["oncall0"]
    for body in ({"minutes": -5}, {"minutes": 10**12}, {"minutes": 0}, {"minutes": "1e3"},
                 {"minutes": 1.5}):  # fmt: skip
        code, answer = act(base, key, "snooze", token, body)
        assert code in (400, 422), (body, answer)
    code, _ = act(base, key, "resolve", token, {"reason": "  \n\t "})
    assert code == 400
    code, _ = act(base, key, "resolve", token, {"reason": "x" * 5000})
    assert code in (400, 422)
    code, _ = act(base, key, "acknowledge", OUTSIDER)
    assert code == 403
    code, _ = act(base, "no-such-incident", "acknowledge", token)
    assert code == 404
    for what in ("acknowledged", "resolved", "snoozed"):
        assert lifecycle_entries(served["url"], served["id"], what) == 0
