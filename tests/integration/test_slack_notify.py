"""Slack end to end against the emulator, with the real slack_sdk: the incident message, its
thread, exactly-once delivery, and Approve/Deny over signed HTTP and Socket Mode.

The generated cascade is replayed near the wall clock (approvals are decided in wall-clock
time): cut after the first death it is ``suspected``; cut after the fourth it is
``cascading`` with its staggered-restart step waiting for approval.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from http_helpers import announce_oversized, serving
from recordings import AWAITING_S, awaiting_in_2025, cascade
from slack_emulator import SlackEmulator, block_actions_payload, signed_request
from sqlalchemy import select

from detector import db
from detector.config import (
    ContainmentSettings,
    DatabaseSettings,
    Settings,
    SlackSettings,
    WebSettings,
)
from detector.lab.recording import DEATHS
from detector.notify import outbox
from detector.notify.models import Notification, NotificationThread
from detector.notify.slack.notifier import Notifier, deliver
from detector.pipeline import replay
from detector.runbooks.models import StepApproval

CHANNEL = "C0INCIDENTS"
SECRET = "test-signing-secret-0123456789"
MENTION = "<!subteam^S0ONCALL>"


def _settings(emu: SlackEmulator, url: str, *, app_token: bool = False) -> Settings:
    slack = SlackSettings(
        bot_token=emu.bot_token,  # type: ignore[arg-type]
        signing_secret=SECRET,  # type: ignore[arg-type]
        app_token=emu.app_token if app_token else None,  # type: ignore[arg-type]
        channel=CHANNEL,
        api_url=emu.api_url,
        mention=MENTION,
        lease_s=1.0,
    )
    return Settings(
        database=DatabaseSettings(url=url),
        containment=ContainmentSettings(approvers=["slack:U42", "alice@example.com"]),
        web=WebSettings(base_url="https://detector.example"),
        slack=slack,
    )


def _roots(emu: SlackEmulator) -> list[dict[str, Any]]:
    """Return the channel's root messages (not the replies also sent to the channel)."""
    return [m for m in emu.root_messages(CHANNEL) if m.get("thread_ts") in (None, m["ts"])]


def _texts(message: dict[str, Any]) -> str:
    return json.dumps(message.get("blocks") or [], ensure_ascii=False)


def _waiting_store(emu: SlackEmulator, tmp_path: Path, **kw: Any) -> tuple[Settings, str]:
    """Replay the cascade cut while its restart step waits, near now; deliver; return the key."""
    settings = _settings(emu, f"sqlite:///{tmp_path / 'store.db'}", **kw)
    start = time.time() - AWAITING_S - 30.0
    result = replay([cascade(tmp_path / "rec", start=start, until_s=AWAITING_S)], settings,
                    notify=True)  # fmt: skip
    deliver(settings)
    return settings, result.incidents[0].key


def test_one_root_message_updated_in_place_with_the_story_threaded(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    emu = slack_emulator
    settings = _settings(emu, f"sqlite:///{tmp_path / 'store.db'}")
    start = time.time() - AWAITING_S - 30.0
    first = cascade(tmp_path / "first", start=start, until_s=DEATHS[0] + 5)
    replay([first], settings, notify=True)
    assert deliver(settings).messages >= 2  # the root and at least one reply
    [root] = _roots(emu)
    assert "SUSPECTED" in _texts(root) and MENTION not in _texts(root)
    assert root["metadata"]["event_type"] == "gpu_oom_incident"
    suspected_replies = emu.replies(CHANNEL, root["ts"])
    assert suspected_replies and all(MENTION not in _texts(r) for r in suspected_replies)

    whole = cascade(tmp_path / "whole", start=start, until_s=AWAITING_S)
    result = replay([whole], settings, notify=True)
    deliver(settings)
    [root] = _roots(emu)  # still one: updated in place
    assert root["metadata"]["event_payload"]["incident"] == result.incidents[0].key
    assert "CASCADING" in _texts(root)
    assert emu.calls_to("chat.update")
    actions = [b for b in root["blocks"] if b["type"] == "actions"]
    assert [e["action_id"] for e in actions[0]["elements"]] == ["approve_step", "deny_step"]
    replies = emu.replies(CHANNEL, root["ts"])
    assert 4 <= len(replies) <= 15, [r["text"] for r in replies]  # coalesced, not one per line
    story = "\n".join(_texts(r) for r in replies)
    for n in (1, 2, 3, 4):
        assert f"victim #{n}" in story
    # a replay is a drill: labelled, and it pages no one (detector run does: test_slack_live)
    assert _texts(root).count("DRILL") == 1 and root["text"].startswith("🧪 DRILL")
    assert not [r for r in replies if MENTION in _texts(r)]
    assert not [c for c in emu.calls_to("chat.postMessage") if c.get("reply_broadcast")]
    assert "approval_requested" in story or "asks sre-oncall" in story

    posts, updates = len(emu.calls_to("chat.postMessage")), len(emu.calls_to("chat.update"))
    replay([whole], settings, notify=True)  # the same replay again: nothing new to say
    assert deliver(settings).messages == 0
    assert len(emu.calls_to("chat.postMessage")) == posts
    assert len(emu.calls_to("chat.update")) == updates


def test_rate_limits_and_outages_are_retried_and_nothing_is_lost(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    emu = slack_emulator
    emu.fail("chat.postMessage", status=429, times=1, retry_after=0)
    emu.fail("chat.postMessage", status=503, times=1)
    _waiting_store(emu, tmp_path)
    assert len(emu.failed_calls) == 2
    assert len(_roots(emu)) == 1


def test_a_failed_delivery_stays_in_the_outbox_until_slack_answers(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    emu = slack_emulator
    emu.fail("chat.postMessage", status=200, times=1, error="channel_not_found")
    with pytest.raises(Exception, match="channel_not_found"):
        _waiting_store(emu, tmp_path)
    settings = _settings(emu, f"sqlite:///{tmp_path / 'store.db'}")
    assert deliver(settings).messages >= 2  # the next try sends everything
    assert len(_roots(emu)) == 1
    engine = db.make_engine(settings.database.url)
    with db.session_factory(engine)() as session:
        assert not session.scalars(select(Notification).where(Notification.sent_at.is_(None))).all()
    engine.dispose()


def _approval(settings: Settings) -> StepApproval:
    engine = db.make_engine(settings.database.url)
    try:
        with db.session_factory(engine)() as session:
            return session.scalars(select(StepApproval).where(StepApproval.position == 4)).one()
    finally:
        engine.dispose()


def _click(emu: SlackEmulator, user: str, action: str = "approve_step") -> dict[str, Any]:
    [root] = _roots(emu)
    [actions] = [b for b in root["blocks"] if b["type"] == "actions"]
    value = actions["elements"][0]["value"]
    return block_actions_payload(user_id=user, action_id=action, value=value, channel=CHANNEL,
                                 message_ts=root["ts"], block_id=actions["block_id"])  # fmt: skip


def _post(base: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(f"{base}/slack/interactions", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_signed_http_clicks_go_through_the_decide_flow(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    emu = slack_emulator
    settings, _ = _waiting_store(emu, tmp_path)
    click = _click(emu, "U42")  # the buttons go once the step is decided
    with serving(settings) as base:
        body, headers = signed_request(SECRET, click)
        assert _post(base, body, {**headers, "X-Slack-Signature": "v0=" + "0" * 64}) == 401
        assert _post(base, body, {"Content-Type": headers["Content-Type"]}) == 401  # unsigned
        assert announce_oversized(base + "/slack/interactions", headers, 2 << 20) == 413
        stale, stale_headers = signed_request(SECRET, _click(emu, "U42"),
                                              timestamp=int(time.time()) - 400)  # fmt: skip
        assert _post(base, stale, stale_headers) == 401
        assert _approval(settings).status == "pending"

        body, headers = signed_request(SECRET, _click(emu, "U999"))
        assert _post(base, body, headers) == 200
        refusal = emu.wait_for(lambda e: e.ephemerals, what="an ephemeral refusal")
        assert refusal[0]["user"] == "U999" and "allow-list" in refusal[0]["text"]
        assert _approval(settings).status == "pending"

        body, headers = signed_request(SECRET, click)
        assert _post(base, body, headers) == 200
        emu.wait_for(lambda e: "approved by `slack:U42`" in _texts(_roots(e)[0]),
                     timeout=15, what="the root message showing the approval")  # fmt: skip
    row = _approval(settings)
    assert (row.status, row.decided_by, row.via) == ("approved", "slack:U42", "slack")

    body, headers = signed_request(SECRET, click)
    with serving(settings) as base:  # a second click on the decided step: refused
        assert _post(base, body, headers) == 200
        emu.wait_for(lambda e: len(e.ephemerals) == 2, what="a second refusal")
    assert "nothing changed" in emu.ephemerals[1]["text"]


def test_an_expired_step_is_refused_with_nothing_changed(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    emu = slack_emulator
    settings = _settings(emu, f"sqlite:///{tmp_path / 'store.db'}")
    replay([awaiting_in_2025(tmp_path / "rec")], settings, notify=True)
    deliver(settings)
    [root] = _roots(emu)
    assert not [b for b in root["blocks"] if b["type"] == "actions"]  # expired: no buttons
    notifier = Notifier(settings, db.session_factory(db.make_engine(settings.database.url)))
    value = json.dumps({"incident": root["metadata"]["event_payload"]["incident"], "step": 4,
                        "plan": _approval(settings).plan_digest})  # fmt: skip
    payload = block_actions_payload(user_id="U42", action_id="approve_step", value=value,
                                    channel=CHANNEL, message_ts=root["ts"])  # fmt: skip
    why = notifier.interactions.handle(payload)
    assert why is not None and "expired" in why
    assert emu.ephemerals[0]["user"] == "U42"
    assert _approval(settings).status == "pending"


def test_an_approver_listed_by_e_mail_is_found_with_users_info(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    emu = slack_emulator
    emu.add_user("U77", "Alice@Example.com")
    emu.add_user("U78", "mallory@example.com")
    settings = _settings(emu, f"sqlite:///{tmp_path / 'store.db'}")
    notifier = Notifier(settings, lambda: None)  # type: ignore[arg-type,return-value]
    assert notifier.interactions.approver("U77") == "alice@example.com"
    assert notifier.interactions.approver("U78") is None
    assert notifier.interactions.approver("U42") == "slack:U42"


def test_socket_mode_clicks_are_acknowledged_then_decided(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    emu = slack_emulator
    settings, _ = _waiting_store(emu, tmp_path, app_token=True)
    engine = db.make_engine(settings.database.url)
    notifier = Notifier(settings, db.session_factory(engine))
    notifier.start()
    try:
        emu.wait_socket_connected(timeout=10)
        refused = emu.send_interactive(_click(emu, "U999"))
        emu.wait_ack(refused, timeout=10)
        emu.wait_for(lambda e: e.ephemerals, what="a refusal over socket mode")
        assert _approval(settings).status == "pending"
        envelope = emu.send_interactive(_click(emu, "U42", "deny_step"))
        assert emu.wait_ack(envelope, timeout=10)["envelope_id"] == envelope
        emu.wait_for(lambda e: "denied by `slack:U42`" in _texts(_roots(e)[0]),
                     timeout=15, what="the root message showing the denial")  # fmt: skip
    finally:
        notifier.stop()
        engine.dispose()
    row = _approval(settings)
    assert (row.status, row.decided_by, row.via) == ("denied", "slack:U42", "slack")


def test_socket_mode_says_connected_only_when_it_is(
    slack_emulator: SlackEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """slack_sdk's connect() returns quietly when the WebSocket fails: the log was "connected"."""
    emu = slack_emulator
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead_url = f"ws://127.0.0.1:{closed.getsockname()[1]}/link/"
    real_open = emu._methods["apps.connections.open"]
    emu._methods["apps.connections.open"] = lambda params: {"url": dead_url}
    settings = _settings(emu, f"sqlite:///{tmp_path / 'store.db'}", app_token=True)
    caplog.set_level("INFO", logger="detector.notify.slack.notifier")
    notifier = Notifier(settings, db.session_factory(db.make_engine(settings.database.url)))
    notifier.start()
    try:
        emu.wait_for(lambda e: "not connected" in caplog.text, what="the failure in the log")
        assert "socket mode connected" not in caplog.text
        emu._methods["apps.connections.open"] = real_open  # Slack is back: slack_sdk reconnects
        emu.wait_for(lambda e: "socket mode connected" in caplog.text, timeout=30,
                     what="the connection in the log")  # fmt: skip
        assert emu.socket_connects >= 1
    finally:
        notifier.stop()


def test_a_sender_that_died_after_slack_got_the_message_does_not_post_it_twice(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    """A crash between Slack's receipt and the stored ts: the next sender finds the message."""
    emu = slack_emulator
    settings, _ = _waiting_store(emu, tmp_path)
    engine = db.make_engine(settings.database.url)
    with db.session_factory(engine)() as session:  # as if the ts had never been stored
        thread = session.scalars(select(NotificationThread)).one()
        thread.ts, thread.digest = None, None
        for row in session.scalars(select(Notification)):
            row.sent_at, row.ts = None, None
        session.commit()
    engine.dispose()
    before = len(emu.calls_to("chat.postMessage"))
    deliver(settings)
    assert len(emu.calls_to("chat.postMessage")) == before  # every message was found
    assert len(_roots(emu)) == 1
    assert emu.calls_to("conversations.history") and emu.calls_to("conversations.replies")


@pytest.mark.postgres
def test_on_postgresql_one_sender_at_a_time_and_each_message_once(
    slack_emulator: SlackEmulator, postgres_url: str, tmp_path: Path
) -> None:
    emu = slack_emulator
    settings = _settings(emu, postgres_url)
    start = time.time() - AWAITING_S - 30.0
    replay([cascade(tmp_path / "rec", start=start, until_s=AWAITING_S)], settings, notify=True)
    engine = db.make_engine(postgres_url)
    sessions = db.session_factory(engine)
    try:
        with sessions() as one, sessions() as two:
            incident_id = outbox.pending_incidents(session=one)[0]
            held = outbox.take(session=one, incident_id=incident_id, lease_s=60, coalesce_s=15)
            assert held is not None and held.batches
            assert outbox.take(session=two, incident_id=incident_id, lease_s=60,
                               coalesce_s=15) is None  # fmt: skip
            outbox.release(session=one, thread=held.thread)
        assert deliver(settings).messages >= 2
        assert deliver(settings).messages == 0
        assert len(_roots(emu)) == 1
        with sessions() as session:
            unsent = select(Notification).where(Notification.sent_at.is_(None))
            assert not session.scalars(unsent).all()
    finally:
        engine.dispose()


def test_a_hostile_log_line_reaches_slack_as_literal_text(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    emu = slack_emulator
    settings = _settings(emu, f"sqlite:///{tmp_path / 'store.db'}")
    rec = cascade(tmp_path / "rec", start=time.time() - AWAITING_S - 30.0, until_s=AWAITING_S)
    logs = rec / "container-logs.jsonl"
    hostile = "<!channel> <@U123> <http://x|y> & \\u001b[2J"
    lines = logs.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if "CUDA out of memory" in line)
    lines[first] = lines[first].replace("CUDA out of memory.", f"CUDA out of memory. {hostile}")
    logs.write_text("\n".join(lines) + "\n")
    replay([rec], settings, notify=True)
    deliver(settings)
    [root] = _roots(emu)
    shown = json.dumps(root["blocks"], ensure_ascii=False)
    assert "&lt;!channel&gt; &lt;@U123&gt; &lt;http://x|y&gt; &amp; \\\\x1b[2J" in shown
    for message in emu.messages(CHANNEL):
        body = json.dumps(message.get("blocks"), ensure_ascii=False) + message["text"]
        assert "<!channel>" not in body and "<@U123>" not in body and "<http://x" not in body
        assert "\x1b" not in body


def test_socket_mode_that_cannot_connect_leaves_the_process_serving(tmp_path: Path) -> None:
    settings = Settings(
        database=DatabaseSettings(url=f"sqlite:///{tmp_path / 'store.db'}"),
        slack=SlackSettings(
            bot_token="xoxb-unreachable",  # type: ignore[arg-type]
            app_token="xapp-unreachable",  # type: ignore[arg-type]
            channel=CHANNEL,
            api_url="http://127.0.0.1:9/api/",  # nothing listens on the discard port
        ),
    )
    db.upgrade(settings.database.url)
    engine = db.make_engine(settings.database.url)
    notifier = Notifier(settings, db.session_factory(engine))
    notifier.start()  # connects in the background: no exception here
    notifier.stop()
    engine.dispose()


def test_a_bot_token_given_as_the_app_token_is_a_setting_error() -> None:
    with pytest.raises(ValueError, match="app-level token"):
        SlackSettings(app_token="xoxb-123")  # type: ignore[arg-type]
