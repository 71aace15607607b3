"""The incident's lifecycle from Slack, the page and the API, through the one decide flow:
acknowledge, snooze, resolve with a reason; refused for someone who may not decide; the page
(PagerDuty emulator) acknowledged and resolved with the incident's key; a person's resolve
reopened by a new victim.

The store holds the generated cascade, replayed whole at its recorded time with Slack and
PagerDuty on: ``contained``, not resolved, its page triggered and its root message posted
(Slack emulator).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_helpers import serving
from pagerduty_emulator import PagerDutyEmulator
from recordings import cascade
from slack_emulator import SlackEmulator, block_actions_payload, signed_request
from sqlalchemy import select

from detector import db
from detector.config import (
    ContainmentSettings,
    DatabaseSettings,
    PagerDutySettings,
    Settings,
    SlackSettings,
    WebSettings,
)
from detector.correlate.state import VictimAdded
from detector.incidents.flows import IncidentRecorder
from detector.incidents.models import Incident, TimelineEntry
from detector.notify.senders import deliver as deliver_events
from detector.notify.slack.notifier import deliver
from detector.pipeline import replay

CHANNEL = "C0INCIDENTS"
SECRET = "test-signing-secret-0123456789"
ALICE = "alice-token-0123456789abcdef"
EVE = "eve-token-0123456789abcdef00"


@pytest.fixture
def pagerduty() -> Iterator[PagerDutyEmulator]:
    with PagerDutyEmulator() as emulator:
        yield emulator


@pytest.fixture
def store(
    slack_emulator: SlackEmulator, pagerduty: PagerDutyEmulator, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    emu = slack_emulator
    settings = Settings(
        database=DatabaseSettings(url=f"sqlite:///{tmp_path / 'store.db'}"),
        containment=ContainmentSettings(approvers=["slack:U42", "alice"]),
        web=WebSettings(tokens={"alice": ALICE, "eve": EVE}, host="0.0.0.0"),  # type: ignore[dict-item]
        slack=SlackSettings(
            bot_token=emu.bot_token,  # type: ignore[arg-type]
            signing_secret=SECRET,  # type: ignore[arg-type]
            channel=CHANNEL,
            api_url=emu.api_url,
            lease_s=1.0,
        ),
        pagerduty=PagerDutySettings(
            routing_key=pagerduty.routing_key,  # type: ignore[arg-type]
            events_url=pagerduty.url,
        ),
    )
    result = replay([cascade(tmp_path / "rec")], settings, notify=True, page=True)
    assert result.incidents[0].stage == "contained"
    deliver(settings)
    deliver_events(settings, page=True, annotate=False)
    key = result.incidents[0].key
    assert pagerduty.actions() == [("trigger", key)]
    yield {"settings": settings, "key": key, "id": result.incidents[0].id}


def root(emu: SlackEmulator) -> dict[str, Any]:
    roots = [m for m in emu.root_messages(CHANNEL) if m.get("thread_ts") in (None, m["ts"])]
    assert len(roots) == 1
    return roots[0]


def texts(message: dict[str, Any]) -> str:
    return json.dumps(message.get("blocks", []), ensure_ascii=False)


def menu_click(emu: SlackEmulator, user: str, act: str) -> dict[str, Any]:
    """A click on the root message's on-call menu (an overflow: ``selected_option``)."""
    message = root(emu)
    [section] = [b for b in message["blocks"] if b.get("block_id") == "lifecycle"]
    options = section["accessory"]["options"]
    option = next(o for o in options if json.loads(o["value"])["a"] == act)
    payload = block_actions_payload(user_id=user, action_id="incident_lifecycle", value="",
                                    channel=CHANNEL, message_ts=message["ts"],
                                    block_id="lifecycle")  # fmt: skip
    payload["actions"] = [{"type": "overflow", "action_id": "incident_lifecycle",
                           "block_id": "lifecycle", "selected_option": option,
                           "action_ts": f"{time.time():.6f}"}]  # fmt: skip
    return payload


def post_slack(base: str, payload: dict[str, Any]) -> int:
    body, headers = signed_request(SECRET, payload)
    request = urllib.request.Request(f"{base}/slack/interactions", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def lifecycle_entries(settings: Settings) -> list[dict[str, Any]]:
    engine = db.make_engine(settings.database.url)
    try:
        with db.session_factory(engine)() as s:
            rows = s.scalars(select(TimelineEntry).order_by(TimelineEntry.id))
            return [r.detail for r in rows if r.detail and r.detail.get("lifecycle")]
    finally:
        engine.dispose()


def incident(settings: Settings) -> Incident:
    engine = db.make_engine(settings.database.url)
    try:
        with db.session_factory(engine)() as s:
            row = s.scalars(select(Incident)).one()
            s.expunge(row)
            return row
    finally:
        engine.dispose()


def test_from_slack_acknowledge_snooze_resolve_and_refusals(
    store: dict[str, Any], slack_emulator: SlackEmulator, pagerduty: PagerDutyEmulator
) -> None:
    emu, settings, key = slack_emulator, store["settings"], store["key"]
    assert "not acknowledged yet" in texts(root(emu))
    with serving(settings) as base:
        assert post_slack(base, menu_click(emu, "U999", "acknowledge")) == 200
        refusal = emu.wait_for(lambda e: e.ephemerals, what="an ephemeral refusal")
        assert refusal[0]["user"] == "U999" and "allow-list" in refusal[0]["text"]
        assert lifecycle_entries(settings) == []

        assert post_slack(base, menu_click(emu, "U42", "acknowledge")) == 200
        emu.wait_for(lambda e: "acknowledged by slack:U42 via slack" in texts(root(e)),
                     timeout=20, what="the root message showing who acknowledged")  # fmt: skip
        pagerduty_wait(pagerduty, 2)
        assert pagerduty.actions()[1] == ("acknowledge", key)

        assert post_slack(base, menu_click(emu, "U42", "snooze")) == 200
        emu.wait_for(lambda e: "replies snoozed until" in texts(root(e)), timeout=20,
                     what="the root message showing the snooze")  # fmt: skip

        assert post_slack(base, menu_click(emu, "U42", "resolve")) == 200
        emu.wait_for(lambda e: "RESOLVED" in json.dumps(root(e)), timeout=20,
                     what="the root message resolved")  # fmt: skip
        pagerduty_wait(pagerduty, 3)
        assert pagerduty.actions()[2] == ("resolve", key)
        assert not [b for b in root(emu)["blocks"] if "accessory" in b
                    and b["accessory"].get("type") == "overflow"]  # fmt: skip
    acts = [(d["lifecycle"], d["by"], d["via"]) for d in lifecycle_entries(settings)]
    assert acts == [
        ("acknowledged", "slack:U42", "slack"),
        ("snoozed", "slack:U42", "slack"),
        ("resolved", "slack:U42", "slack"),
    ]
    assert incident(settings).stage == "resolved"


def pagerduty_wait(pagerduty: PagerDutyEmulator, count: int) -> None:
    deadline = time.monotonic() + 20
    while len(pagerduty.events) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pagerduty.events) >= count, pagerduty.actions()


def login(web: httpx.Client, token: str) -> None:
    page = web.get("/login").text
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    assert web.post("/login", data={"token": token, "csrf": found[1]}).status_code == 303


def test_from_the_page_and_the_api_with_the_same_checks(store: dict[str, Any]) -> None:
    settings, ref = store["settings"], str(store["id"])
    page = f"/incidents/{ref}"
    with serving(settings) as base, httpx.Client(base_url=base) as web:
        assert web.post(f"{page}/lifecycle/acknowledge", data={"csrf": "x"}).status_code == 401
        login(web, EVE)  # a token, not on the allow-list
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', web.get(page).text)
        assert csrf
        refused = web.post(f"{page}/lifecycle/acknowledge", data={"csrf": csrf[1]})
        assert refused.status_code == 403
        web.cookies.clear()
        login(web, ALICE)
        shown = web.get(page).text
        assert "not acknowledged yet" in shown and "/lifecycle/resolve" in shown
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', shown)
        assert csrf
        assert web.post(f"{page}/lifecycle/acknowledge", data={"csrf": "stale"}).status_code == 403
        done = web.post(f"{page}/lifecycle/acknowledge", data={"csrf": csrf[1]})
        assert done.status_code == 303
        assert "acknowledged by alice via web" in web.get(page).text
        again = web.post(f"{page}/lifecycle/acknowledge", data={"csrf": csrf[1]})
        assert again.status_code == 409  # acknowledged already: nothing changed

        api = f"{base}/api/incidents/{ref}"
        no_reason = httpx.post(
            f"{api}/resolve", json={}, headers={"Authorization": f"Bearer {ALICE}"}
        )
        assert no_reason.status_code == 400 and "reason" in no_reason.text
        eve = httpx.post(f"{api}/resolve", json={"reason": "x"},
                         headers={"Authorization": f"Bearer {EVE}"})  # fmt: skip
        assert eve.status_code == 403
        assert httpx.post(f"{api}/resolve", json={"reason": "x"}).status_code == 401
        ok = httpx.post(f"{api}/resolve", json={"reason": "rolled back the bad release"},
                        headers={"Authorization": f"Bearer {ALICE}"})  # fmt: skip
        assert ok.status_code == 200, ok.text
        assert ok.json()["stage"] == "resolved"
        twice = httpx.post(f"{api}/resolve", json={"reason": "again"},
                           headers={"Authorization": f"Bearer {ALICE}"})  # fmt: skip
        assert twice.status_code == 409
        assert "/lifecycle/resolve" not in web.get(page).text  # resolved: no forms
    resolved = lifecycle_entries(settings)[-1]
    assert (resolved["lifecycle"], resolved["by"], resolved["via"], resolved["reason"]) == (
        "resolved", "alice", "http", "rolled back the bad release"
    )  # fmt: skip


def test_a_new_victim_reopens_an_incident_a_person_resolved(store: dict[str, Any]) -> None:
    settings = store["settings"]
    api = "/api/incidents/" + str(store["id"])
    with serving(settings) as base:
        ok = httpx.post(f"{base}{api}/resolve", json={"reason": "looks fine"},
                        headers={"Authorization": f"Bearer {ALICE}"})  # fmt: skip
        assert ok.status_code == 200
    engine = db.make_engine(settings.database.url)
    try:
        with db.session_factory(engine)() as s:
            row = s.scalars(select(Incident)).one()
            victims = len(row.victims)
            later = row.updated_at.timestamp() + 60
            decision = VictimAdded(row.key, "vllm-llama-new-pod", later, victims + 1)
            IncidentRecorder().record(decision, session=s, contexts=lambda _: None)
            s.commit()
    finally:
        engine.dispose()
    row = incident(settings)
    assert (row.stage, row.resolved_at) == ("cascading", None)
    assert lifecycle_entries(settings)[-1]["lifecycle"] == "reopened"
