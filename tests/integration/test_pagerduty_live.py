"""Live: ``detector run`` pages PagerDuty from the outbox; a kill -9 while the trigger is in
PagerDuty's hands, unanswered, then a restart, pages once: the event is sent again with the
same ``dedup_key``, which PagerDuty folds into the one alert (Tansu + the emulator)."""

from __future__ import annotations

import time
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
from pagerduty_emulator import PagerDutyEmulator
from sqlalchemy import select

from detector import db
from detector.notify.models import OutboxEvent


def _events(url: str) -> list[OutboxEvent]:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            return list(session.scalars(select(OutboxEvent).order_by(OutboxEvent.id)))
    finally:
        engine.dispose()


def _until(check: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_kill_9_while_the_trigger_is_unanswered_then_a_restart_pages_once(
    kafka_bootstrap: str, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PagerDutyEmulator() as pd:
        monkeypatch.setenv("DETECTOR_PAGERDUTY__ROUTING_KEY", pd.routing_key)
        monkeypatch.setenv("DETECTOR_PAGERDUTY__EVENTS_URL", pd.url)
        monkeypatch.setenv("DETECTOR_PAGERDUTY__LEASE_S", "1")
        prefix = unique_prefix()
        expected = {
            f"{prefix}-{suffix}": produce(kafka_bootstrap, f"{prefix}-{suffix}", CASCADE / name)
            for name, suffix in STREAMS.items()
        }
        pd.pause()  # PagerDuty holds the trigger, sent after the commit that queued it
        log = tmp_path / "run.log"
        proc = start_detector(kafka_bootstrap, prefix, sqlite_url, log)
        try:
            _until(lambda: pd.held >= 1, "a held PagerDuty call")
            wait_committed(kafka_bootstrap, prefix, expected, proc)
        finally:
            proc.kill()  # kill -9 while the trigger is in PagerDuty's hands, unanswered
            proc.wait()
        [trigger] = [e for e in _events(sqlite_url) if e.action == "trigger"]
        assert trigger.sent_at is None and trigger.attempts == 1
        pd.resume()  # PagerDuty takes the event the detector never saw answered
        _until(lambda: pd.events, "the trigger landing")

        proc = start_detector(kafka_bootstrap, prefix, sqlite_url, log)
        try:
            wait_committed(kafka_bootstrap, prefix, expected, proc)
            _until(lambda: all(e.sent_at for e in _events(sqlite_url)), "the outbox sent")
        finally:
            status = stop(proc)
        assert status == 0, log.read_text()[-3000:]
    triggers = [key for action, key in pd.actions() if action == "trigger"]
    assert len(triggers) == 2 and len(set(triggers)) == 1  # sent again, the same key
    assert list(pd.alerts().values()) == [["triggered"]]  # one page
    [trigger] = [e for e in _events(sqlite_url) if e.action == "trigger"]
    assert trigger.attempts == 2
