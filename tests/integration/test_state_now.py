"""The state of now (``detector.report.now``) and the Slack root message built from it, on the
generated cascade cut at three moments: two pods down, every pod down, every pod back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from recordings import AWAITING_S, cascade

from detector import db
from detector.config import DatabaseSettings, Settings
from detector.lab.recording import DEATHS, RESTARTS
from detector.notify.slack.blocks import Options, root_message
from detector.pipeline import replay
from detector.report.document import incident_document
from detector.report.now import state_now
from detector.report.read import load_incidents
from detector.report.series import load_series


def _read(tmp_path: Path, until_s: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    replay(
        [cascade(tmp_path / "rec", until_s=until_s)], Settings(database=DatabaseSettings(url=url))
    )
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            [inc] = [i.model_dump(mode="json") for i in load_incidents(session=session)]
            series = load_series(session=session, incident_id=inc["id"])
            return inc, [s.model_dump(mode="json") for s in series]
    finally:
        engine.dispose()


def _text(inc: dict[str, Any], series: list[dict[str, Any]]) -> str:
    now = state_now(inc, series)
    message = root_message(inc, incident_document(inc), Options("", 0.95, 0.95), now)
    return "\n".join(b["text"]["text"] for b in message.blocks if b["type"] == "section")


@pytest.mark.parametrize(
    ("until_s", "down", "endpoint_down"),
    [(DEATHS[1] + 5, 2, False), (AWAITING_S, 4, True), (RESTARTS[-1] + 60, 0, False)],
)
def test_the_root_message_tells_the_state_of_now(
    tmp_path: Path, until_s: float, down: int, endpoint_down: bool
) -> None:
    """It froze at its first facts: "2 pods down" and a dead pod's KV reading with 4 of 4 dead."""
    inc, series = _read(tmp_path, until_s)
    now = state_now(inc, series)
    assert (len(now.seen), len(now.down), now.endpoint_down) == (4, down, endpoint_down)
    assert not set(now.readings) & set(now.down)  # readings of live pods only
    text = _text(inc, series)
    assert ("endpoint down" in text) is endpoint_down
    if not endpoint_down:
        assert f"*{4 - down} pods serving*" in text
    lb = now.lb
    assert lb is not None
    last = [s for s in series if s["metric"] == "requests" and not s["label"]][-6:]
    assert lb.requests_per_s == pytest.approx(sum(s["value"] for s in last) / 30.0)
    assert f"{lb.requests_per_s:.1f} req/s" in text
