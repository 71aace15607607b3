"""The web pages in a real browser: headless chromium (Playwright) against a real uvicorn.

The store holds the generated cascade, replayed in dry-run near the wall clock and cut while
every pod is down: its third step (staggered restarts) waits for approval. Its first GPU OOM
log line carries markup (``XSS``), which the evidence section must show as text. The live test
replays a cascade cut after the second death, opens its page, then replays a longer cut into the
same store and waits for the third victim to appear without a reload.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from http_helpers import serving
from recordings import AWAITING_S, awaiting_now, cascade
from sqlalchemy import create_engine, text

from detector.config import ContainmentSettings, DatabaseSettings, Settings, WebSettings
from detector.lab.recording import DEATHS
from detector.pipeline import replay

expect = pytest.importorskip("playwright.sync_api").expect
Tab = Any  # tests/e2e/conftest.py's Tab: a page in a fresh context, with .requests and .dialogs

ALICE = "alice-token-0123456789"
XSS = "<script>alert(1)</script> <img src=x onerror=alert(2)>"
DECISION = text(
    "SELECT status, decided_by, via FROM approvals WHERE incident_id = :i AND position = 4"
)
LIVE_WAIT_MS = 15_000  # live.js asks every 5 s


def settings_for(url: str, host: str = "127.0.0.1") -> Settings:
    return Settings(
        database=DatabaseSettings(url=url),
        web=WebSettings(host=host, tokens={"alice": ALICE}),  # type: ignore[dict-item]
        containment=ContainmentSettings(approvers=["alice"]),
    )


def with_markup(recording: Path) -> Path:
    """Put ``XSS`` into the first GPU OOM line of the recording's container logs."""
    logs = recording / "container-logs.jsonl"
    lines = logs.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "CUDA out of memory" in line)
    record = json.loads(lines[at])
    record["log"] = record["log"].replace("CUDA out of memory.", f"CUDA out of memory. {XSS}", 1)
    lines[at] = json.dumps(record)
    logs.write_text("\n".join(lines) + "\n")
    return recording


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    url = f"sqlite:///{tmp_path_factory.mktemp('web') / 'store.db'}"
    recording = with_markup(awaiting_now(tmp_path_factory.mktemp("rec") / "cascade"))
    result = replay([recording], settings_for(url))
    [incident] = result.incidents
    return {"url": url, "id": incident.id, "key": incident.key, "stage": incident.stage}


@pytest.fixture(scope="module")
def server(store: dict[str, Any]) -> Iterator[dict[str, Any]]:
    with serving(settings_for(store["url"])) as base:
        yield store | {"base": base}


def assert_same_origin(tab: Tab, base: str) -> None:
    origin = urlsplit(base)
    away = [u for u in tab.requests if urlsplit(u)[:2] != origin[:2]]
    assert tab.requests and not away, away


def incident_row(tab: Tab, server: dict[str, Any]) -> Any:
    link = tab.page.locator(f"a[href='/incidents/{server['id']}']")
    return tab.page.locator("table.list tbody tr", has=link)


def other_stage(server: dict[str, Any]) -> str:
    return "resolved" if server["stage"] != "resolved" else "suspected"


def log_in(tab: Tab, base: str, next_path: str = "/incidents") -> None:
    tab.page.goto(f"{base}/login?next={next_path}")
    tab.page.fill("#token", ALICE)
    tab.page.click("form.card button[type=submit]")
    expect(tab.page.locator("header .who")).to_have_text("alice")


def test_list_shows_the_incident_and_filters_by_stage(tab: Tab, server: dict[str, Any]) -> None:
    page, base = tab.page, server["base"]
    page.goto(f"{base}/incidents")
    row = incident_row(tab, server)
    expect(row).to_have_count(1)
    expect(row).to_contain_text("llm/vllm-llama")
    expect(row).to_contain_text(server["key"])
    expect(row.locator(".badge.waiting")).to_have_text("step 4")

    page.goto(f"{base}/incidents?stage={other_stage(server)}")
    expect(page.locator("select[name=stage]")).to_have_value(other_stage(server))
    expect(row).to_have_count(0)
    expect(page.locator("p.empty").first).to_contain_text("matches these filters")
    page.goto(f"{base}/incidents?stage={server['stage']}")
    expect(row).to_have_count(1)
    assert_same_origin(tab, base)


def test_filter_form_filters_by_stage(tab: Tab, server: dict[str, Any]) -> None:
    page, base = tab.page, server["base"]
    page.goto(f"{base}/incidents")
    row = incident_row(tab, server)
    page.select_option("select[name=stage]", other_stage(server))
    with page.expect_response(lambda r: "/incidents?" in r.url) as answer:
        page.click("form.filters button[type=submit]")
    assert answer.value.status == 200
    expect(row).to_have_count(0)
    expect(page.locator("p.empty").first).to_contain_text("matches these filters")
    page.select_option("select[name=stage]", server["stage"])
    page.click("form.filters button[type=submit]")
    expect(row).to_have_count(1)


def test_incident_page_shows_victims_and_timeline(tab: Tab, server: dict[str, Any]) -> None:
    page, base = tab.page, server["base"]
    page.goto(f"{base}/incidents/{server['id']}")
    expect(page.locator("ol.victims li")).to_have_count(4)
    expect(page.locator("ol.victims li").first).to_contain_text("died of GPU OOM")
    entries = page.locator("section.timeline ol.entries li")
    everything = entries.count()
    assert everything > 10

    page.click("nav.kinds a:text-is('stage')")
    expect(page).to_have_url(re.compile(r"kind=stage"))
    expect(page.locator("nav.kinds a[aria-current]")).to_have_text("stage")
    stages = entries.count()
    assert 0 < stages < everything
    assert entries.evaluate_all("es => es.every(e => e.classList.contains('stage'))")
    page.click("nav.kinds a:text-is('all')")
    expect(entries).to_have_count(everything)
    assert_same_origin(tab, base)


def test_incident_page_draws_the_charts(tab: Tab, server: dict[str, Any]) -> None:
    page = tab.page
    page.goto(f"{server['base']}/incidents/{server['id']}")
    expect(page.locator("ol.victims li")).to_have_count(4)
    expect(page.locator("section.charts svg")).to_have_count(2)  # load balancer, pressure
    assert page.locator("section.charts svg polyline").count() >= 4  # requests, 5xx, pods
    assert page.locator("section.charts line.marker.death").count() == 8  # 4 on each chart


def test_log_markup_is_shown_as_text(tab: Tab, server: dict[str, Any]) -> None:
    page, base = tab.page, server["base"]
    page.goto(f"{base}/incidents/{server['id']}")
    page.click("section.evidence summary")  # the evidence is folded: the story comes first
    log = page.locator("section.evidence pre.log", has_text="<script>alert(1)</script>")
    expect(log.first).to_be_visible()
    expect(log.first).to_contain_text(XSS)
    assert page.locator("img").count() == 0
    assert page.locator("[onerror]").count() == 0
    assert page.locator("script:not([src])").count() == 0
    page.wait_for_timeout(300)  # a dialog, if one were to fire, fires on load
    assert tab.dialogs == []
    assert_same_origin(tab, base)


def test_actions_need_a_login_and_the_forms_csrf_token(tab: Tab, server: dict[str, Any]) -> None:
    page, base = tab.page, server["base"]
    action = f"{base}/incidents/{server['id']}/steps/4/approve"
    page.goto(action)  # the confirmation page, read without a login on loopback
    expect(page.locator("p.error")).to_contain_text("Log in to decide")
    expect(page.locator("form.card")).to_have_count(0)

    refused = page.request.post(action, form={"csrf": "", "plan": "", "reason": ""})
    assert refused.status == 401

    log_in(tab, base)
    forged = page.request.post(action, form={"csrf": "0" * 64, "plan": "", "reason": ""})
    assert forged.status == 403
    page.goto(f"{base}/incidents/{server['id']}")
    expect(page.locator("#step-4 .decide a.button.primary")).to_be_visible()  # still waiting
    assert_same_origin(tab, base)


def test_reading_needs_a_login_off_loopback(tab: Tab, store: dict[str, Any]) -> None:
    with serving(settings_for(store["url"], host="0.0.0.0")) as base:
        page = tab.page
        page.goto(f"{base}/incidents")
        expect(page).to_have_url(re.compile(r"/login\?next=(/|%2F)incidents$"))
        expect(page.locator("#token")).to_be_visible()
        assert page.request.get(f"{base}/api/incidents").status == 401
        page.fill("#token", ALICE)
        page.click("form.card button[type=submit]")
        expect(page).to_have_url(f"{base}/incidents")
        expect(page.locator(f"a[href='/incidents/{store['id']}']")).to_have_count(1)
        assert_same_origin(tab, base)


def test_approval_on_the_page_lands_in_the_store(tab: Tab, server: dict[str, Any]) -> None:
    page, base = tab.page, server["base"]
    log_in(tab, base, f"/incidents/{server['id']}")
    expect(page).to_have_url(f"{base}/incidents/{server['id']}")
    page.click("#step-4 a:text-is('Approve…')")
    expect(page.locator("h1")).to_contain_text("Approve step 4")
    radius = page.locator("dl.radius")
    expect(radius).to_be_visible()
    expect(radius).to_contain_text("vllm-llama-")  # the pods it restarts
    page.click("form.card button.primary")

    expect(page).to_have_url(f"{base}/incidents/{server['id']}")
    decided = page.locator("#step-4 p.decided")
    expect(decided).to_contain_text("approved by alice via web")
    expect(page.locator("#step-4 .decide")).to_have_count(0)
    engine = create_engine(server["url"])
    try:
        with engine.connect() as conn:
            row = conn.execute(DECISION, {"i": server["id"]}).one()
    finally:
        engine.dispose()
    assert tuple(row) == ("approved", "alice", "web")
    assert_same_origin(tab, base)


def test_the_page_follows_new_records_without_a_reload(tab: Tab, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    settings = settings_for(url)
    start = time.time() - AWAITING_S - 30.0
    short = cascade(tmp_path / "short", start=start, until_s=DEATHS[1] + 5)
    longer = cascade(tmp_path / "longer", start=start, until_s=DEATHS[2] + 5)
    [incident] = replay([short], settings).incidents
    with serving(settings) as base:
        page = tab.page
        page.goto(f"{base}/incidents/{incident.id}")
        victims = page.locator("ol.victims li")
        expect(victims).to_have_count(2)
        page.evaluate("window.__noReload = 'still here'")

        [again] = replay([longer], settings).incidents
        assert again.id == incident.id

        expect(victims).to_have_count(3, timeout=LIVE_WAIT_MS)
        assert page.evaluate("window.__noReload") == "still here"
        assert any("partial=1" in u for u in tab.requests)
        assert_same_origin(tab, base)
