"""The approvals endpoint behind a real uvicorn on a free loopback port, over real HTTP.

The store holds the generated cascade, cut while every pod is down and replayed in dry-run near
the wall clock: its third step (staggered restarts, policy approval) is waiting for approval,
the first two were approved by policy. A second store holds the same cascade at its recorded
time (2025): its approval expired long ago and a decision on it is refused.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from http_helpers import serving
from recordings import awaiting_in_2025, awaiting_now

from detector import db
from detector.config import ContainmentSettings, DatabaseSettings, Settings, WebSettings
from detector.incidents import service
from detector.pipeline import replay
from detector.web.auth import token_owner

ALICE = "alice-token-0123456789abcdef"
EVE = "eve-token-0123456789abcdef00"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('http') / 'store.db'}"
    settings = Settings(
        database=DatabaseSettings(url=url),
        containment=ContainmentSettings(approvers=["alice"]),
        web=WebSettings(tokens={"alice": ALICE, "eve": EVE}),  # type: ignore[dict-item]
    )
    result = replay([awaiting_now(tmp_path_factory.mktemp("rec") / "cascade")], settings)
    key = result.incidents[0].key
    with serving(settings) as base:
        yield {"base": base, "key": key, "url": url, "id": result.incidents[0].id}


def post(server: dict[str, Any], path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = token if " " in token else f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        server["base"] + path, data=data or b"", headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:  # closes the connection it holds
            payload = json.loads(exc.read() or b"null")
        if exc.code == 401:
            assert exc.headers["WWW-Authenticate"].startswith("Bearer")
        return exc.code, payload


def step_path(server: dict[str, Any], step: str, verb: str = "approve") -> str:
    return f"/api/incidents/{quote(server['key'], safe='')}/steps/{step}/{verb}"


@pytest.mark.parametrize(
    ("token", "status"),
    [
        (None, 401),  # missing
        ("Basic YWxpY2U6eA==", 401),  # another scheme
        ("Bearer ", 401),  # empty
        ("not-the-token-0123456789", 401),  # bad
        (ALICE[:-1], 401),  # a prefix of a good one
        (EVE, 403),  # a good token of someone not on the approver allow-list
    ],
)
def test_tokens_are_checked_before_anything(
    server: dict[str, Any], token: str | None, status: int
) -> None:
    code, body = post(server, step_path(server, "stagger_restarts"), token)
    assert code == status, body
    assert isinstance(body["detail"], str)


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/incidents/llm%2Fnope%401/steps/stagger_restarts/approve", 404),
        ("/api/incidents/999999/steps/stagger_restarts/approve", 404),
        ("STEP:reboot_the_cluster", 404),
        ("STEP:lower_batch_ceiling", 409),  # approved by policy auto: nothing to decide
        ("STEP:1", 409),
    ],
)
def test_unknown_and_undecidable(server: dict[str, Any], path: str, status: int) -> None:
    if path.startswith("STEP:"):
        path = step_path(server, path.removeprefix("STEP:"))
    code, body = post(server, path, ALICE)
    assert code == status, body


def test_a_decision_on_a_plan_that_changed_is_refused(server: dict[str, Any]) -> None:
    old = {"reason": "go", "plan": "000000000000"}  # not the digest of the plan pending now
    code, body = post(server, step_path(server, "stagger_restarts"), ALICE, old)
    assert code == 409 and "the plan changed" in body["detail"], body


def test_an_invalid_body_is_a_short_422_that_does_not_echo_it(server: dict[str, Any]) -> None:
    reason = "r" * 2000  # over DecisionIn.reason's 1,000 characters
    code, body = post(server, step_path(server, "stagger_restarts"), ALICE, {"reason": reason})
    assert code == 422
    assert body["detail"] == [
        {
            "loc": ["body", "reason"],
            "msg": "String should have at most 1000 characters",
            "type": "string_too_long",
        }
    ]
    assert reason[:100] not in json.dumps(body) and len(json.dumps(body)) < 300


def test_approve_records_the_token_owner_then_conflicts(server: dict[str, Any]) -> None:
    raw_key_path = f"/api/incidents/{server['key']}/steps/4/approve"  # "/" in the key, unencoded
    code, body = post(server, raw_key_path, ALICE, {"reason": "crash-looping, go"})
    assert code == 200, body
    assert (body["step"], body["status"], body["by"], body["via"]) == (
        "stagger_restarts",
        "approved",
        "alice",
        "http",
    )
    assert post(server, step_path(server, "stagger_restarts"), ALICE)[0] == 409
    assert post(server, step_path(server, "stagger_restarts", "deny"), ALICE)[0] == 409
    engine = db.make_engine(server["url"])
    try:
        with db.session_factory(engine)() as session:
            incident = service.get_incident_by_key(session=session, key=server["key"])
            assert incident is not None
            entry = service.timeline(session=session, incident=incident)[-1]
            assert entry.message == (
                "step 4 stagger_restarts approved by alice via http: crash-looping, go"
            )
            assert entry.detail is not None and entry.detail["actor"] == "alice"
    finally:
        engine.dispose()


def test_unknown_routes_and_methods(server: dict[str, Any]) -> None:
    assert post(server, f"/api/incidents/{server['id']}/steps/4/maybe", ALICE)[0] == 404
    request = urllib.request.Request(server["base"] + step_path(server, "4"), method="GET")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    info.value.close()
    assert info.value.code == 405


def test_token_owner_compares_every_token() -> None:
    tokens = {"a": "x" * 20, "b": "y" * 20}
    assert token_owner(tokens, "y" * 20) == "b"
    assert token_owner(tokens, "z" * 20) is None
    assert token_owner({}, "x") is None


def test_a_late_approval_is_refused_with_409_and_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'late.db'}"
    settings = Settings(
        database=DatabaseSettings(url=url),
        containment=ContainmentSettings(approvers=["alice"]),
        web=WebSettings(tokens={"alice": ALICE}),  # type: ignore[dict-item]
    )
    key = replay([awaiting_in_2025(tmp_path / "cascade")], settings).incidents[0].key

    def snapshot() -> tuple[list[tuple[str, str | None]], int]:
        engine = db.make_engine(url)
        try:
            with db.session_factory(engine)() as session:
                incident = service.get_incident_by_key(session=session, key=key)
                assert incident is not None
                rows = [(a.status, a.decided_by) for a in incident.approvals]  # type: ignore[attr-defined]
                return rows, len(service.timeline(session=session, incident=incident))
        finally:
            engine.dispose()

    before = snapshot()
    with serving(settings) as base:
        code, body = post({"base": base}, f"/api/incidents/{quote(key, safe='')}/steps/4/approve",
                          ALICE)  # fmt: skip
    assert code == 409, body
    assert "expired at 2025-03-14" in body["detail"]
    assert snapshot() == before


def _raw(base: str, head: bytes, body_chunks: int = 0, chunk: bytes = b"") -> bytes:
    """Send ``head`` then ``body_chunks`` x ``chunk`` on a raw socket; return the answer's first
    bytes (the server may answer and close before the body is sent)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(head)
        try:
            for _ in range(body_chunks):
                conn.sendall(chunk)
        except OSError:
            pass  # answered and closed: the rest was never read
        return conn.recv(4096)


def test_bodies_are_bounded_and_the_api_authenticated_before_reading(
    server: dict[str, Any],
) -> None:
    """A 256 MiB body is never read: 401 without a token, 413 with one, and a chunked body
    that does not say its size is cut at the bound."""
    path = f"/api/incidents/{quote(server['key'], safe='')}/steps/3/approve"
    big = 256 * 1024 * 1024
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {big}\r\n").encode()  # fmt: skip
    answer = _raw(server["base"], head + b"\r\n", 16, b"x" * 65536)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    bearer = f"Authorization: Bearer {ALICE}\r\n".encode()
    answer = _raw(server["base"], head + bearer + b"\r\n", 16, b"x" * 65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    chunked = (b"POST /slack/interactions HTTP/1.1\r\nHost: x\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    piece = b"10000\r\n" + b"x" * 65536 + b"\r\n"
    answer = _raw(server["base"], chunked, 64, piece)  # 4 MiB, over the 1 MiB bound
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert post(server, path, None, {"reason": "x"})[0] == 401  # as before, small


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/incidents/99999999999999999999", 404),  # over the 64-bit id column
        ("GET", "/api/incidents/9223372036854775808", 404),
        ("GET", "/incidents/0", 404),
        ("POST", "/api/incidents/99999999999999999999/steps/3/approve", 404),
        ("GET", "/api/incidents?since_h=1e309", 422),
        ("GET", "/api/incidents?since_h=-1", 422),
        # str.isdigit() is true for a superscript one, which int() refuses: was 500 (schemathesis)
        ("GET", "/api/incidents/%C2%B9", 404),
        ("GET", "/incidents/%C2%B9", 404),
        ("POST", "/api/incidents/%C2%B9/steps/3/approve", 404),
    ],
)
def test_values_out_of_range_at_the_edge_are_404_or_422(
    server: dict[str, Any], method: str, path: str, status: int
) -> None:
    headers = {"Authorization": f"Bearer {ALICE}"}
    request = urllib.request.Request(server["base"] + path, headers=headers, method=method,
                                     data=b"" if method == "POST" else None)  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            got = response.status
    except urllib.error.HTTPError as exc:
        with exc:
            got = exc.code
    assert got == status
