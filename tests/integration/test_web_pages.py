"""The web face over real HTTP (uvicorn on a loopback port): pages, JSON, who may read and act.

The store holds the generated cascade replayed near the wall clock, cut while every pod is
down: its staggered-restart step waits for approval. Browser behaviour (clicks, live
refresh, rendering) is in tests/e2e/test_web_browser.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_helpers import serving
from recordings import AWAITING_S, cascade
from sqlalchemy import select

from detector import db
from detector.config import ContainmentSettings, DatabaseSettings, Settings, WebSettings
from detector.incidents import service
from detector.incidents.models import Incident
from detector.pipeline import replay
from detector.runbooks.models import ControlChange, StepApproval

TOKEN = "alice-token-0123456789abcdef"
EVE = "eve-token-0123456789abcdef00"  # a token owner who is not an approver
HOSTILE = "<script>alert(1)</script> <img src=x onerror=alert(2)>"


def _settings(url: str, **web: Any) -> Settings:
    return Settings(
        database=DatabaseSettings(url=url),
        containment=ContainmentSettings(approvers=["alice", "bob@example.com"]),
        web=WebSettings(tokens={"alice": TOKEN, "eve": EVE}, **web),  # type: ignore[dict-item]
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """Return the store URL and the incident id of a replayed cascade with a hostile OOM line."""
    folder = tmp_path_factory.mktemp("web")
    url = f"sqlite:///{folder / 'store.db'}"
    rec = cascade(folder / "rec", start=time.time() - AWAITING_S - 30.0, until_s=AWAITING_S)
    logs = rec / "container-logs.jsonl"
    lines = logs.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if "CUDA out of memory" in line)
    lines[first] = lines[first].replace("CUDA out of memory.", f"CUDA out of memory. {HOSTILE}")
    logs.write_text("\n".join(lines) + "\n")
    result = replay([rec], _settings(url))
    yield url, result.incidents[0].id


def login(web: httpx.Client, token: str, **form: str) -> httpx.Response:
    """Post the login form as a browser does: its page first (the form's token), then it."""
    page = web.get("/login").text
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return web.post("/login", data={"token": token, "csrf": found[1], **form})


def _approval(url: str) -> StepApproval:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            return session.scalars(select(StepApproval).where(StepApproval.position == 4)).one()
    finally:
        engine.dispose()


def test_reading_on_loopback_needs_no_login(store: tuple[str, int]) -> None:
    url, incident_id = store
    with serving(_settings(url)) as base, httpx.Client(base_url=base) as web:
        assert web.get("/healthz").json() == {"status": "ok"}
        assert web.get("/readyz").json() == {"status": "ready"}
        listing = web.get("/incidents")
        assert listing.status_code == 200 and f"/incidents/{incident_id}" in listing.text
        assert f'href="/incidents/{incident_id}#step-4"' in listing.text  # waiting for you
        page = web.get(f"/incidents/{incident_id}")
        assert page.status_code == 200
        assert page.text.count("died of GPU OOM at") == 4
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
        assert "<script>alert" not in page.text and "<img src=x" not in page.text
        assert page.headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert not re.findall(r'(?:src|href)="(?:https?:)?//', page.text)  # nothing external
        api = web.get("/api/incidents").json()
        assert [i["id"] for i in api["incidents"]] == [incident_id]
        assert api["incidents"][0]["waiting"] == [4]
        doc = web.get(f"/api/incidents/{incident_id}").json()
        assert len(doc["pods"]) == 4 and doc["timeline"] and doc["evidence"]
        assert web.get("/api/incidents/999999").status_code == 404
        plot = web.get(f"/incidents/{incident_id}/traffic.svg")  # linked by postmortem.md
        assert plot.headers["content-type"].startswith("image/svg+xml") and "<svg" in plot.text
        assert web.get(f"/incidents/{incident_id}/other.svg").status_code == 404
        stages = web.get(f"/incidents/{incident_id}?kind=stage").text
        assert stages.count('class="entry stage"') == 2  # suspected, cascading
        assert 'class="entry step"' not in stages


def test_elsewhere_reading_and_acting_need_a_login_and_a_csrf_token(
    store: tuple[str, int],
) -> None:
    url, incident_id = store
    with serving(_settings(url, host="0.0.0.0")) as base, httpx.Client(base_url=base) as web:
        assert web.get("/incidents").headers["location"].startswith("/login?next=")
        assert web.get("/api/incidents").status_code == 401
        decide = f"/incidents/{incident_id}/steps/4/approve"
        assert web.post(decide, data={"csrf": "x"}).status_code == 401
        assert login(web, "wrong").status_code == 401
        opened = login(web, TOKEN, next="//evil.example/")
        assert opened.status_code == 303 and opened.headers["location"] == "/incidents"
        cookie = opened.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert web.get("/incidents").status_code == 200
        assert web.post(decide, data={"csrf": "stale"}).status_code == 403
        assert _approval(url).status == "pending"
        confirm = web.get(decide).text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', confirm)
        plan = re.search(r'name="plan" value="([0-9a-f]+)"', confirm)
        assert csrf and plan and "What approving does" in confirm
        done = web.post(decide, data={"csrf": csrf[1], "plan": plan[1], "reason": "go"})
        assert done.status_code == 303
    row = _approval(url)
    assert (row.status, row.decided_by, row.via) == ("approved", "alice", "web")


def test_a_login_needs_the_forms_token_and_this_sites_origin(store: tuple[str, int]) -> None:
    """Login CSRF: a form posted from another site, or without the login page's token,
    logs nobody in."""
    url, _ = store
    with serving(_settings(url, host="0.0.0.0")) as base, httpx.Client(base_url=base) as web:
        assert web.post("/login", data={"token": TOKEN}).status_code == 403  # no form token
        page = web.get("/login").text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf
        form = {"token": TOKEN, "csrf": csrf[1]}
        for origin in ("https://evil.example", "null"):
            refused = web.post("/login", data=form, headers={"Origin": origin})
            assert refused.status_code == 403 and "another site" in refused.text
        assert web.get("/incidents").status_code == 303  # still nobody
        ok = web.post("/login", data=form, headers={"Origin": base})
        assert ok.status_code == 303 and web.get("/incidents").status_code == 200
        # an acting form from another site is refused too, logged in or not
        evil = web.post("/logout", data={"csrf": "x"}, headers={"Origin": "https://evil.example"})
        assert evil.status_code == 403


def test_a_session_ends_with_its_token_and_at_logout_everywhere(store: tuple[str, int]) -> None:
    """A copy of a session cookie does not outlive its logout, nor its token: a server
    restarted with the same session secret and the token removed or rotated refuses it."""
    url, _ = store
    secret = "s" * 40
    same = _settings(url, host="0.0.0.0", session_secret=secret)
    with serving(same) as base, httpx.Client(base_url=base) as web:
        assert login(web, TOKEN).status_code == 303
        stolen = dict(web.cookies)
        assert web.get("/incidents").status_code == 200
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', web.get("/incidents").text)
        assert csrf and web.post("/logout", data={"csrf": csrf[1]}).status_code == 303
        with httpx.Client(base_url=base, cookies=stolen) as copy:
            assert copy.get("/incidents").status_code == 303  # to the login form
    with serving(same) as base, httpx.Client(base_url=base) as web:  # restarted
        with httpx.Client(base_url=base, cookies=stolen) as copy:
            assert copy.get("/incidents").status_code == 303
        assert login(web, TOKEN).status_code == 303
        kept = dict(web.cookies)
    for tokens in ({"eve": EVE}, {"alice": "alice-rotated-0123456789abcdef", "eve": EVE}):
        changed = Settings(
            database=DatabaseSettings(url=url),
            containment=ContainmentSettings(approvers=["alice"]),
            web=WebSettings(host="0.0.0.0", session_secret=secret, tokens=tokens),  # type: ignore[arg-type]
        )
        with serving(changed) as base, httpx.Client(base_url=base, cookies=kept) as copy:
            assert copy.get("/incidents").status_code == 303, tokens
    with serving(same) as base, httpx.Client(base_url=base, cookies=kept) as copy:
        assert copy.get("/incidents").status_code == 200  # the token is back: so is the session


def test_a_trusted_proxy_header_is_honoured_only_from_a_trusted_proxy(
    store: tuple[str, int],
) -> None:
    url, _ = store
    header = {"X-Forwarded-Email": "bob@example.com"}
    trusted = _settings(url, host="0.0.0.0", trusted_proxy_header="X-Forwarded-Email",
                        trusted_proxies=["127.0.0.0/8"])  # fmt: skip
    with serving(trusted) as base, httpx.Client(base_url=base) as web:
        page = web.get("/incidents", headers=header)
        assert page.status_code == 200 and "bob@example.com" in page.text
    elsewhere = _settings(url, host="0.0.0.0", trusted_proxy_header="X-Forwarded-Email",
                          trusted_proxies=["10.0.0.0/8"])  # fmt: skip
    with serving(elsewhere) as base, httpx.Client(base_url=base) as web:
        assert web.get("/incidents", headers=header).status_code == 303
        # a local process claiming to forward for a trusted address is still loopback: the
        # peer is the socket's (uvicorn's own X-Forwarded-For rewriting used to make it 10.9.9.9)
        forged = {**header, "X-Forwarded-For": "10.9.9.9", "X-Real-IP": "10.9.9.9",
                  "Forwarded": "for=10.9.9.9"}  # fmt: skip
        assert web.get("/incidents", headers=forged).status_code == 303
        assert web.get("/api/incidents", headers=forged).status_code == 401


def test_a_page_with_ten_thousand_timeline_entries_is_paged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'big.db'}"
    settings = _settings(url)
    replay([cascade(tmp_path / "rec", until_s=AWAITING_S)], settings)
    engine = db.make_engine(url)
    with db.session_factory(engine)() as session:
        incident = session.scalars(select(Incident)).one()
        for n in range(10_000):
            service.add_timeline_entry(session=session, incident=incident,
                                       time=1741943100.0 + n / 10, kind="note",
                                       message=f"note {n}", dedupe_key=f"bulk:{n}")  # fmt: skip
        session.commit()
        incident_id = incident.id
    engine.dispose()
    with serving(settings) as base, httpx.Client(base_url=base) as web:
        page = web.get(f"/incidents/{incident_id}")
        assert page.status_code == 200
        assert page.text.count('class="entry ') == 200
        assert re.search(r"page 1 of (\d+)", page.text)[1] == "51"  # type: ignore[index]
        last = web.get(f"/incidents/{incident_id}?page=51").text
        assert "note 9999" in last


def test_the_kill_switch_and_arming_from_the_page_keep_their_history(
    store: tuple[str, int],
) -> None:
    url, _ = store
    with serving(_settings(url)) as base, httpx.Client(base_url=base) as web:
        login(web, EVE)
        page = web.get("/controls/kill-switch-on").text
        eve_csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert eve_csrf
        refused = web.post("/controls/kill-switch-on", data={"csrf": eve_csrf[1]})
        assert refused.status_code == 403  # logged in, but not an approver
        # a page, not a bare JSON body: the reason, escaped, and a way back
        assert refused.headers["content-type"].startswith("text/html")
        assert (
            "not on the approver allow-list" in refused.text and "<h1>Refused</h1>" in refused.text
        )
        assert web.get("/incidents/424242").headers["content-type"].startswith("text/html")
        assert web.get("/api/incidents/424242").json() == {"detail": "no such incident"}
    with serving(_settings(url)) as base, httpx.Client(base_url=base) as web:
        login(web, TOKEN)
        confirm = web.get("/controls/kill-switch-on").text
        assert "Every actuator call, of every workload, is held" in confirm
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', confirm)
        assert csrf
        assert web.post("/controls/kill-switch-on", data={"csrf": "x"}).status_code == 403
        done = web.post("/controls/kill-switch-on", data={"csrf": csrf[1], "reason": "drill"})
        assert done.status_code == 303
        unknown = web.post("/controls/arm", data={"csrf": csrf[1], "workload": "llm/nope"})
        assert unknown.status_code == 404  # a workload the store has never seen
        armed = web.post("/controls/arm", data={"csrf": csrf[1], "workload": "llm/vllm-llama"})
        assert armed.status_code == 303
    engine = db.make_engine(url)
    with db.session_factory(engine)() as session:
        changes = [(c.name, c.enabled, c.changed_by, c.via) for c in
                   session.scalars(select(ControlChange).order_by(ControlChange.id))]  # fmt: skip
    engine.dispose()
    assert changes[-2:] == [("kill_switch", True, "alice", "web"), ("armed", True, "alice", "web")]
