"""Live: ``detector run`` posts to Slack from the outbox; while Slack does not answer the
detector goes on consuming; a kill -9 between the database commit and Slack's answer, then a
restart, neither loses nor repeats a message (Tansu + the emulator)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_helpers import (
    CASCADE,
    STREAMS,
    WAIT_S,
    produce,
    start_detector,
    stop,
    unique_prefix,
    wait_committed,
)
from slack_emulator import SlackEmulator
from sqlalchemy import select

from detector import db
from detector.notify.models import Notification, NotificationThread

CHANNEL = "C0LIVE"
MENTION = "<!subteam^S0ONCALL>"


def _outbox(url: str) -> tuple[list[NotificationThread], list[Notification]]:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            threads = list(session.scalars(select(NotificationThread)))
            return threads, list(session.scalars(select(Notification)))
    finally:
        engine.dispose()


def _delivered(url: str) -> bool:
    threads, rows = _outbox(url)
    return bool(threads) and all(t.ts for t in threads) and all(r.sent_at for r in rows)


def test_kill_9_between_the_commit_and_slack_then_a_restart_posts_each_message_once(
    kafka_bootstrap: str,
    slack_emulator: SlackEmulator,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emu = slack_emulator
    for name, value in {
        "BOT_TOKEN": emu.bot_token,
        "CHANNEL": CHANNEL,
        "API_URL": emu.api_url,
        "LEASE_S": "1",
        "MENTION": MENTION,
    }.items():
        monkeypatch.setenv(f"DETECTOR_SLACK__{name}", value)
    prefix = unique_prefix()
    expected = {
        f"{prefix}-{suffix}": produce(kafka_bootstrap, f"{prefix}-{suffix}", CASCADE / name)
        for name, suffix in STREAMS.items()
    }
    emu.pause()  # Slack holds every call: the first is the root message, sent after a commit
    log = tmp_path / "run.log"
    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, log)
    try:
        emu.wait_for(lambda e: e.held_requests >= 1, timeout=WAIT_S, what="a held Slack call")
        wait_committed(kafka_bootstrap, prefix, expected, proc)  # detection goes on meanwhile
    finally:
        proc.kill()  # kill -9 while the root message is in Slack's hands, unanswered
        proc.wait()
    threads, _ = _outbox(sqlite_url)
    assert threads and threads[0].ts is None and threads[0].attempts == 1
    emu.resume()  # Slack completes the post the detector never saw answered
    emu.wait_for(lambda e: e.root_messages(CHANNEL), what="the root message landing")

    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, log)
    try:
        wait_committed(kafka_bootstrap, prefix, expected, proc)
        emu.wait_for(lambda e: _delivered(sqlite_url), timeout=WAIT_S, what="the outbox sent")
    finally:
        status = stop(proc)
    assert status == 0, log.read_text()
    roots = [m for m in emu.root_messages(CHANNEL) if m.get("thread_ts") in (None, m["ts"])]
    assert len(roots) == 1, log.read_text()[-3000:]
    assert emu.calls_to("conversations.history"), "the restart looked the root message up"
    replies = emu.replies(CHANNEL, roots[0]["ts"])
    keys = [r["metadata"]["event_payload"]["reply"] for r in replies if r.get("metadata")]
    _, rows = _outbox(sqlite_url)
    assert len(keys) == len(set(keys)) == len({r.batch for r in rows}), keys
    story = "\n".join(r["text"] + str(r["blocks"]) for r in replies)
    for n in (1, 2, 3, 4):
        assert f"victim #{n}" in story
    # live, not a drill: the reply announcing cascading pages on-call, in the channel too
    assert "DRILL" not in story
    [paging] = [c for c in emu.calls_to("chat.postMessage") if c.get("reply_broadcast")]
    assert paging["text"].startswith(MENTION) and "cascading" in str(paging["blocks"])
