"""Live: the root message's state of now is the incident's state in the store (pods serving
and down, the endpoint, the load balancer's request and 5xx rates over the window
``detector.report.now`` uses), and the thread repeats no text (Tansu + the Slack emulator).

The detector is caught up when its store tells the whole input (the incident's load-balancer
series reach the bucket of the last access-log line produced) and its outbox is delivered.
The store changes no more; the root message must then show its state, also when that state
changed with nothing left to tell in the thread (the sender redraws an open incident's root,
``detector.notify.slack.sender.REDRAW_S``): waited for, at most ``WAIT_S``.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

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
from recordings import AWAITING_S, cascade
from slack_emulator import SlackEmulator, block_actions_payload
from sqlalchemy import select

from detector import db
from detector.config import Settings
from detector.lab.recording import CASCADE_END, DEATHS, START
from detector.notify.models import Notification, NotificationThread
from detector.report.now import LB_WINDOW_S, state_now
from detector.report.read import load_incidents
from detector.report.series import SERIES_BUCKET_S, load_series
from detector.stream.app import keyed_records

CHANNEL = "C0STATE"
LB_FILE = "lb-access.jsonl"
ALL_DOWN_MS = int((START + DEATHS[-1] + 12.0) * 1000)  # after the 4th death, before a restart

NOW_PODS = re.compile(
    r"\*Now:\* (?:🛑 \*endpoint down:\* all (?P<all>\d+) pods seen are down"
    r"|\*(?P<serving>\d+) pods serving\*(?:, (?P<down>\d+) down \((?P<named>[^)\n]*)\))?)"
)
DECISION = re.compile(r"\bstep (\d+) \S+ (approved|denied) by\b")
NOW_LB = re.compile(
    r"Load balancer, (?P<window>\d+) s to (?P<until>\d\d:\d\d:\d\d): (?P<rps>[\d.]+) req/s, "
    r"5xx (?P<e5xx>[\d.]+)/s"
)


def _read(url: str) -> tuple[dict[str, Any], list[dict[str, Any]], bool] | None:
    """Return the incident, its series and whether the outbox is delivered (None: no incident)."""
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            found = load_incidents(session=session)
            if not found:
                return None
            inc = found[0].model_dump(mode="json")
            stored = load_series(session=session, incident_id=inc["id"])
            threads = list(session.scalars(select(NotificationThread)))
            rows = list(session.scalars(select(Notification)))
    finally:
        engine.dispose()
    delivered = bool(threads) and all(t.ts for t in threads) and all(r.sent_at for r in rows)
    return inc, [s.model_dump(mode="json") for s in stored], delivered


def _last_bucket(series: list[dict[str, Any]]) -> datetime | None:
    times = [_time(s["time"]) for s in series if s["metric"] == "requests" and not s["label"]]
    return max(times, default=None)


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value).astimezone(UTC)


def _last_line_at(path: Path, before_ms: int | None) -> datetime:
    """Return the event time of the last record of ``path`` that ``produce`` sends."""
    times = [
        ts
        for _, _, ts in keyed_records([path], Settings())
        if ts is not None and (before_ms is None or ts < before_ms)
    ]
    return datetime.fromtimestamp(max(times) / 1000, UTC)


def _roots(emu: SlackEmulator) -> list[dict[str, Any]]:
    """Return the channel's root messages (not the replies also sent to the channel)."""
    return [m for m in emu.root_messages(CHANNEL) if m.get("thread_ts") in (None, m["ts"])]


def _root(emu: SlackEmulator) -> dict[str, Any]:
    [root] = _roots(emu)
    return root


def _buttons(emu: SlackEmulator) -> dict[str, Any] | None:
    """Return the root message's Approve/Deny block (None: none)."""
    found = [b for r in _roots(emu) for b in r.get("blocks", []) if b["type"] == "actions"]
    return found[0] if found else None


def _root_shows_the_store(
    emu: SlackEmulator, url: str, last_line_at: datetime
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait until the store tells the whole input and the outbox is sent, then until the root
    message shows the store's state of now (at most ``WAIT_S`` each); return both, as shown
    and as stored."""
    emu.wait_for(
        lambda e: _caught_up(url, last_line_at),
        timeout=WAIT_S,
        what="the store caught up with the input and the outbox sent",
    )
    deadline = time.monotonic() + WAIT_S
    while True:
        read = _read(url)
        assert read is not None
        shown, state = _root_facts(_root(emu)), _store_facts(*read[:2])
        if shown == state or time.monotonic() > deadline:
            return shown, state
        time.sleep(0.2)


def _caught_up(url: str, last_line_at: datetime) -> bool:
    """Tell whether the store tells the whole input and the outbox is delivered."""
    read = _read(url)
    if read is None:
        return False
    _, series, delivered = read
    last = _last_bucket(series)
    return (
        delivered and last is not None and last_line_at < last + timedelta(seconds=SERIES_BUCKET_S)
    )


def _root_facts(root: dict[str, Any]) -> dict[str, Any]:
    """Return the state of now that the root message shows."""
    body = "\n".join(b["text"]["text"] for b in root["blocks"] if b["type"] == "section")
    pods, lb = NOW_PODS.search(body), NOW_LB.search(body)
    assert pods is not None and lb is not None, body
    if pods["all"]:
        seen = down = int(pods["all"])
    else:
        down = int(pods["down"] or 0)
        seen = int(pods["serving"]) + down
    return {
        "pods seen": seen,
        "pods down": down,
        "pods named down": re.findall(r"`([^`]+)`", pods["named"] or ""),
        "endpoint down": bool(pods["all"]),
        "lb window": f"{lb['window']} s to {lb['until']}",
        "req/s": lb["rps"],
        "5xx/s": lb["e5xx"],
    }


def _store_facts(inc: dict[str, Any], series: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the incident's state of now from the read model: the pods through
    ``state_now``, the load balancer's rates summed here over the buckets of the last
    ``LB_WINDOW_S`` up to the end of the latest one."""
    now = state_now(inc, series)
    endpoint_down = bool(now.seen) and not now.serving
    lb = [s for s in series if not s["label"]]
    last = max(_time(s["time"]) for s in lb)
    since = last - timedelta(seconds=LB_WINDOW_S - SERIES_BUCKET_S)

    def rate(metric: str) -> str:
        total = sum(s["value"] for s in lb if s["metric"] == metric and _time(s["time"]) >= since)
        return f"{total / LB_WINDOW_S:.1f}"

    until = last + timedelta(seconds=SERIES_BUCKET_S)
    return {
        "pods seen": len(now.seen),
        "pods down": len(now.down),
        "pods named down": [] if endpoint_down else list(now.down[:4]),
        "endpoint down": endpoint_down,
        "lb window": f"{LB_WINDOW_S:.0f} s to {until:%H:%M:%S}",
        "req/s": rate("requests"),
        "5xx/s": rate("errors_5xx"),
    }


def _lines(reply: dict[str, Any]) -> list[str]:
    return [ln for b in reply["blocks"] for ln in b["text"]["text"].split("\n") if ln.strip()]


def _echo(line: str, words: int = 3) -> str | None:
    """Return a run of at least ``words`` words that ``line`` says twice in a row, e.g.
    "approved by X: approved by X" (None: none)."""
    tokens = [t.strip(":;,.()").lower() for t in line.split()]
    for size in range(words, len(tokens) // 2 + 1):
        for i in range(len(tokens) - 2 * size + 1):
            if tokens[i : i + size] == tokens[i + size : i + 2 * size]:
                return " ".join(tokens[i : i + size])
    return None


def _decisions(line: str) -> list[tuple[str, str]]:
    """Return the (step, decision) pairs ``line`` tells, e.g. ("4", "approved") of "step 4
    stagger_restarts approved by slack:U42 via slack" (an automatic approval is none)."""
    return DECISION.findall(line)


def _assert_the_thread_repeats_nothing(replies: list[dict[str, Any]]) -> None:
    """No two replies alike, no line told twice, no line saying a phrase twice in a row, no
    decision on a step told twice (in other words)."""
    texts = [r["text"] + "\n" + "\n".join(_lines(r)) for r in replies]
    assert len(texts) == len(set(texts)), [t for t in texts if texts.count(t) > 1]
    lines = [ln for r in replies for ln in _lines(r)]
    assert len(lines) == len(set(lines)), [ln for ln in lines if lines.count(ln) > 1]
    assert not [(ln, echo) for ln in lines if (echo := _echo(ln))]
    told = [(d, ln) for ln in lines for d in _decisions(ln)]
    decisions = [d for d, _ in told]
    assert len(decisions) == len(set(decisions)), [ln for d, ln in told if decisions.count(d) > 1]


def _env(monkeypatch: pytest.MonkeyPatch, emu: SlackEmulator, **more: str) -> None:
    settings = {"BOT_TOKEN": emu.bot_token, "CHANNEL": CHANNEL, "API_URL": emu.api_url, **more}
    for name, value in settings.items():
        monkeypatch.setenv(f"DETECTOR_SLACK__{name}", value)


@pytest.mark.parametrize(
    "before_ms", [None, ALL_DOWN_MS], ids=["whole cascade", "cut with every pod down"]
)
def test_the_root_message_tells_the_state_in_the_store_and_the_thread_repeats_nothing(
    kafka_bootstrap: str,
    slack_emulator: SlackEmulator,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    before_ms: int | None,
) -> None:
    emu = slack_emulator
    _env(monkeypatch, emu)
    prefix = unique_prefix()
    expected = {
        f"{prefix}-{suffix}": produce(
            kafka_bootstrap, f"{prefix}-{suffix}", CASCADE / name, before_ms=before_ms
        )
        for name, suffix in STREAMS.items()
    }
    last_line_at = _last_line_at(CASCADE / LB_FILE, before_ms)
    log = tmp_path / "run.log"
    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, log)
    try:
        wait_committed(kafka_bootstrap, prefix, expected, proc)
        shown, state = _root_shows_the_store(emu, sqlite_url, last_line_at)
    finally:
        status = stop(proc)
    assert status == 0, log.read_text()[-3000:]
    assert shown == state
    assert emu.calls_to("chat.update"), "the root message was never updated"
    _assert_the_thread_repeats_nothing(emu.replies(CHANNEL, _root(emu)["ts"]))


@pytest.mark.parametrize(("action_id", "decision"), [("approve_step", "approved"),
                                                    ("deny_step", "denied")])  # fmt: skip
def test_a_decision_clicked_in_slack_is_told_once_and_the_root_follows_the_store(
    kafka_bootstrap: str,
    slack_emulator: SlackEmulator,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    action_id: str,
    decision: str,
) -> None:
    """The generated cascade, ended a minute ago (a person decides in wall-clock time; its
    approvals expire 10 min after they are asked), produced up to the restart step waiting for
    approval; an approver clicks Approve (or Deny) over Socket Mode; then the rest is
    produced. The decision taken up said who made it twice ("approved by X: approved by X via
    slack"), then the thread told it twice: once when clicked, once when the step took it up
    ("step 4 ... approved by slack:U42 via slack", "... approved by slack:U42: via slack")."""
    emu = slack_emulator
    _env(monkeypatch, emu, APP_TOKEN=emu.app_token)
    monkeypatch.setenv("DETECTOR_CONTAINMENT__APPROVERS", '["slack:U42"]')
    start = time.time() - CASCADE_END - 60.0
    rec = cascade(tmp_path / "rec", start=start)
    awaiting_ms = int((start + AWAITING_S) * 1000)
    last_line_at = _last_line_at(rec / LB_FILE, None)
    prefix = unique_prefix()
    topics = {f"{prefix}-{suffix}": rec / name for name, suffix in STREAMS.items()}
    first = {
        t: produce(kafka_bootstrap, t, path, before_ms=awaiting_ms) for t, path in topics.items()
    }
    log = tmp_path / "run.log"
    proc = start_detector(kafka_bootstrap, prefix, sqlite_url, log)
    try:
        wait_committed(kafka_bootstrap, prefix, first, proc)
        emu.wait_for(lambda e: _buttons(e) is not None, timeout=WAIT_S, what="Approve/Deny")
        emu.wait_socket_connected(timeout=WAIT_S)
        actions = _buttons(emu)
        assert actions is not None
        root = _root(emu)
        click = block_actions_payload(
            user_id="U42",
            action_id=action_id,
            value=actions["elements"][0]["value"],
            channel=CHANNEL,
            message_ts=root["ts"],
            block_id=actions["block_id"],
        )
        emu.wait_ack(emu.send_interactive(click), timeout=WAIT_S)
        emu.wait_for(
            lambda e: f"{decision} by `slack:U42`" in json.dumps(_root(e)["blocks"]),
            timeout=WAIT_S,
            what=f"the root message showing the step {decision}",
        )
        rest = {t: produce(kafka_bootstrap, t, path, skip=first[t]) for t, path in topics.items()}
        wait_committed(kafka_bootstrap, prefix, {t: first[t] + rest[t] for t in topics}, proc)
        shown, state = _root_shows_the_store(emu, sqlite_url, last_line_at)
    finally:
        status = stop(proc)
    assert status == 0, log.read_text()[-3000:]
    assert shown == state
    replies = emu.replies(CHANNEL, _root(emu)["ts"])
    story = "\n".join(ln for r in replies for ln in _lines(r))
    assert [d for ln in story.split("\n") for d in _decisions(ln)] == [("4", decision)], story
    assert f"{decision} by slack:U42" in story, story
    _assert_the_thread_repeats_nothing(replies)
