"""The store's health numbers that ``detector run`` exports (detector.stream.health): the Slack
outbox's backlog and oldest unsent entry, read from a real store the cascade was replayed into
with Slack on (the emulator), before and after the sender delivered."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from recordings import AWAITING_S, cascade
from slack_emulator import SlackEmulator
from sqlalchemy import func, select

from detector import db
from detector.config import DatabaseSettings, Settings, SlackSettings
from detector.notify.models import Notification
from detector.notify.slack.notifier import deliver
from detector.pipeline import replay
from detector.stream.health import StoreHealth, probe
from detector.stream.metrics import LoopMetrics


def _probe(url: str, now: datetime) -> StoreHealth:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            return probe(session, now)
    finally:
        engine.dispose()


def test_the_probe_counts_the_unsent_slack_entries_and_ages_the_oldest(
    slack_emulator: SlackEmulator, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    slack = SlackSettings(
        bot_token=slack_emulator.bot_token,  # type: ignore[arg-type]
        channel="C0INCIDENTS",
        api_url=slack_emulator.api_url,
    )
    settings = Settings(database=DatabaseSettings(url=url), slack=slack)
    replay([cascade(tmp_path / "rec", until_s=AWAITING_S)], settings, notify=True)
    engine = db.make_engine(url)
    with db.session_factory(engine)() as session:
        unsent = Notification.sent_at.is_(None)
        count, oldest = session.execute(
            select(func.count(Notification.id), func.min(Notification.time)).where(unsent)
        ).one()
    engine.dispose()
    assert count > 0
    now = oldest.replace(tzinfo=UTC) + timedelta(seconds=90)
    queued = _probe(url, now)
    assert queued == StoreHealth(outbox_pending=count, outbox_oldest_s=90.0, failed_actions=0)

    deliver(settings)
    assert _probe(url, now) == StoreHealth(0, 0.0, 0)


def test_the_metrics_say_the_store_is_down_when_the_probe_fails() -> None:
    metrics = LoopMetrics()
    metrics.set_health(StoreHealth(3, 12.5, 1))
    metrics.set_health(None)
    sample = metrics.registry.get_sample_value
    assert sample("detector_store_up") == 0
    assert sample("detector_slack_outbox_pending") == 3  # the last numbers read are kept
    metrics.set_health(StoreHealth(0, 0.0, 1))
    assert sample("detector_store_up") == 1
    assert sample("detector_actuator_failed_actions") == 1
