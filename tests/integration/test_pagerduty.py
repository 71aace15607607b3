"""PagerDuty end to end against the Events API v2 emulator: one alert per incident, in order,
from the same outbox as Slack; retries on 429/5xx honouring Retry-After; nothing paged by a
replay unless asked; the leases of a sender that died.

The generated cascade (``detector.lab.recording``) is replayed: whole, with a short quiet
period, it is ``cascading``, then ``contained``, then ``resolved``; cut after its first death
it stays ``suspected``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from http_helpers import serving
from pagerduty_emulator import PagerDutyEmulator
from recordings import cascade
from sqlalchemy import select, update

from detector import db
from detector.config import (
    CorrelateSettings,
    DatabaseSettings,
    PagerDutySettings,
    Settings,
    WebSettings,
)
from detector.errors import ConfigError
from detector.lab.recording import DEATHS
from detector.notify import delivery
from detector.notify.models import OutboxEvent
from detector.notify.pagerduty.sender import PagerSender
from detector.notify.senders import deliver as deliver_events
from detector.pipeline import replay

BASE_URL = "https://detector.example"


@pytest.fixture
def emu() -> Iterator[PagerDutyEmulator]:
    with PagerDutyEmulator() as emulator:
        yield emulator


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cascade(tmp_path_factory.mktemp("rec") / "cascade")


def settings(url: str, emu: PagerDutyEmulator, **pagerduty: Any) -> Settings:
    values: dict[str, Any] = {"routing_key": emu.routing_key, "events_url": emu.url}
    return Settings(
        database=DatabaseSettings(url=url),
        correlate=CorrelateSettings(quiet_s=5),
        web=WebSettings(base_url=BASE_URL),
        pagerduty=PagerDutySettings(**{**values, **pagerduty}),
    )


def deliver(s: Settings) -> tuple[int, int]:
    """Send the PagerDuty events due once; return (sent, still pending)."""
    return deliver_events(s, page=True, annotate=False)["pagerduty"]


def rows(url: str) -> list[OutboxEvent]:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            found = list(s.scalars(select(OutboxEvent).order_by(OutboxEvent.id)))
            s.expunge_all()
            return found
    finally:
        engine.dispose()


def change(url: str, **values: Any) -> None:
    """Set ``values`` on every PagerDuty event row (the lease, the due time)."""
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            s.execute(update(OutboxEvent).values(**values))
            s.commit()
    finally:
        engine.dispose()


def test_one_trigger_then_a_resolve_with_the_incident_key(
    sqlite_url: str, emu: PagerDutyEmulator, recording: Path
) -> None:
    s = settings(sqlite_url, emu)
    result = replay([recording], s, page=True)
    key = result.incidents[0].key
    assert result.incidents[0].stage == "resolved"
    assert deliver(s) == (2, 0)
    assert emu.actions() == [("trigger", key), ("resolve", key)]
    assert emu.refused == []
    trigger = emu.events[0]["payload"]
    assert trigger["summary"].startswith("[drill] GPU OOM cascade in llm/vllm-llama: 4 pods")
    details = trigger["custom_details"]
    assert len(details["victims"]) == 4
    assert details["signals"]["gpu_oom"] == 4
    page = f"{BASE_URL}/incidents/{result.incidents[0].id}"
    assert (details["page"], details["postmortem"]) == (page, f"{page}/postmortem.html")
    assert [link["href"] for link in emu.events[0]["links"]] == [page, f"{page}/postmortem.html"]

    # the same records again (a restart before the offsets' commit): nothing new to page
    replay([recording], s, page=True)
    assert deliver(s) == (0, 0)
    assert len(emu.events) == 2
    assert [r.action for r in rows(sqlite_url)] == ["trigger", "resolve"]


def test_a_replay_pages_no_one_unless_asked(
    sqlite_url: str, emu: PagerDutyEmulator, recording: Path
) -> None:
    s = settings(sqlite_url, emu)
    replay([recording], s)
    assert rows(sqlite_url) == []
    assert deliver(s) == (0, 0)
    assert emu.events == []
    with pytest.raises(ConfigError, match="ROUTING_KEY"):
        replay([recording], Settings(database=DatabaseSettings(url=sqlite_url)), page=True)


@pytest.mark.parametrize(("stage", "actions"), [("cascading", []), ("suspected", ["trigger"])])
def test_the_trigger_stage_decides_who_is_paged(
    sqlite_url: str, emu: PagerDutyEmulator, tmp_path: Path, stage: str, actions: list[str]
) -> None:
    first_death = cascade(tmp_path / "cut", until_s=DEATHS[0] + 5.0)
    s = settings(sqlite_url, emu, trigger_stage=stage)
    result = replay([first_death], s, page=True)
    assert result.incidents[0].stage == "suspected"
    deliver(s)
    assert [a for a, _ in emu.actions()] == actions


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    """Return the URL of an empty store of each backend."""
    url: str = request.getfixturevalue(
        "sqlite_url" if request.param == "sqlite" else "postgres_url"
    )
    return url


def test_429_waits_for_retry_after_and_the_resolve_never_overtakes_the_trigger(
    store_url: str, emu: PagerDutyEmulator, recording: Path
) -> None:
    s = settings(store_url, emu)
    replay([recording], s, page=True)
    emu.fail(429, retry_after_s=120)
    before = datetime.now(UTC)
    assert deliver(s) == (0, 2)
    trigger, resolve = rows(store_url)
    assert "HTTP 429" in trigger.error and trigger.attempts == 1
    assert trigger.due_at >= before + timedelta(seconds=119)
    assert resolve.attempts == 0  # held behind its incident's trigger
    assert deliver(s) == (0, 2)  # not due yet: nothing sent
    assert len(emu.refused) == 1
    change(store_url, due_at=before)
    emu.fail(500)  # no Retry-After: back-off
    assert deliver(s) == (0, 2)
    trigger, _ = rows(store_url)
    assert "HTTP 500" in trigger.error and trigger.attempts == 2
    assert trigger.due_at > datetime.now(UTC)
    change(store_url, due_at=before)
    assert deliver(s) == (2, 0)
    assert [a for a, _ in emu.actions()] == ["trigger", "resolve"]


def test_an_invalid_event_is_closed_with_its_error_not_retried(
    sqlite_url: str, emu: PagerDutyEmulator, recording: Path
) -> None:
    s = settings(sqlite_url, emu, routing_key="too-short-a-key")
    replay([recording], s, page=True)
    assert deliver(s) == (0, 0)
    assert [status for status, _ in emu.refused] == [400, 400]
    assert all(r.error.startswith("refused: HTTP 400") and r.attempts == 1
               for r in rows(sqlite_url))  # fmt: skip
    assert deliver(s) == (0, 0)
    assert len(emu.refused) == 2


def test_an_event_claimed_by_a_sender_that_died_goes_once_its_lease_ran_out(
    sqlite_url: str, emu: PagerDutyEmulator, recording: Path
) -> None:
    s = settings(sqlite_url, emu)
    replay([recording], s, page=True)
    engine = db.make_engine(sqlite_url)
    try:
        make_session = db.session_factory(engine)
        with make_session() as session:  # a sender claims the trigger, then dies (kill -9)
            assert delivery.take(session=session, target="pagerduty", lease_s=60.0) is not None
        other = PagerSender(s, make_session)
        assert other.drain() == 0  # the trigger is held; the resolve waits behind it
        change(sqlite_url, claimed_at=datetime.now(UTC) - timedelta(seconds=61))
        assert other.drain() == 2
        other.close()
    finally:
        engine.dispose()
    assert [a for a, _ in emu.actions()] == ["trigger", "resolve"]
    assert [r.attempts for r in rows(sqlite_url)] == [2, 1]


def test_serve_sends_what_the_outbox_holds(
    sqlite_url: str, emu: PagerDutyEmulator, recording: Path
) -> None:
    s = settings(sqlite_url, emu)
    replay([recording], s, page=True)
    with serving(s):
        deadline = time.monotonic() + 30
        while len(emu.events) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [a for a, _ in emu.actions()] == ["trigger", "resolve"]
