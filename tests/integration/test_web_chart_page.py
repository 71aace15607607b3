"""The incident page's pressure chart over real HTTP, for the whole bundled cascade (four deaths,
then the four restarts): each pod's line breaks over the minutes it was down, and the DCGM
framebuffer readings, when the store holds them, are drawn as GPU memory, not as KV cache.

The bundled replay stores each pod's KV cache alone (the correlator charts a pod by it once it
has seen one). A writer that wrote a pod's buckets before it saw the pod's first KV-cache
reading leaves GPU-memory rows beside the KV-cache ones (``write_series`` keeps a bucket's
measure until a reading of the other replaces it): the second test writes the recording's
framebuffer readings into the buckets with no KV-cache row, as such a writer would.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from http_helpers import serving
from recordings import cascade

from detector import db
from detector.config import DatabaseSettings, Settings
from detector.correlate.series import SeriesPoint
from detector.incidents.flows import write_series
from detector.incidents.models import Incident
from detector.pipeline import replay
from detector.report.series import load_series

POLYLINE = re.compile(r'<polyline class="line ([^"]*)" points="([^"]*)"><title>([^<]*)</title>')
DEATH = re.compile(r'<line class="marker death" x1="([^"]*)"[^>]*><title>victim #\d')


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, int, Path]]:
    """Return the settings of a store holding the whole cascade, its incident and recording."""
    folder = tmp_path_factory.mktemp("chart")
    settings = Settings(database=DatabaseSettings(url=f"sqlite:///{folder / 'store.db'}"))
    rec = cascade(folder / "rec")
    [incident] = replay([rec], settings).incidents
    yield settings, incident.id, rec


def pressure_chart(settings: Settings, incident_id: int) -> tuple[dict[str, list[list[float]]],
                                                                  list[float]]:  # fmt: skip
    """Return the pressure chart's segments (x of each point) by label, and the deaths' x."""
    with serving(settings) as base, httpx.Client(base_url=base) as web:
        page = web.get(f"/incidents/{incident_id}")
    assert page.status_code == 200
    figure = page.text.split('<figure class="chart">')[-1]
    assert "Memory / KV-cache pressure" in figure
    lines: dict[str, list[list[float]]] = {}
    for _, points, title in POLYLINE.findall(figure):
        xs = [float(p.split(",")[0]) for p in points.split()]
        lines.setdefault(html.unescape(title), []).append(xs)
    return lines, [float(x) for x in DEATH.findall(figure)]


def test_each_pods_line_breaks_over_the_minutes_it_was_down(
    store: tuple[Settings, int, Path],
) -> None:
    settings, incident_id, _ = store
    lines, deaths = pressure_chart(settings, incident_id)
    assert len(lines) == 4 and all(label.endswith(" KV cache") for label in lines)
    assert len(deaths) == 4
    for segments in lines.values():
        assert len(segments) == 2  # before its death, after its restart
        before, after = segments
        assert sum(max(before) < x < min(after) for x in deaths) >= 1  # its own death between


def test_framebuffer_readings_are_drawn_as_gpu_memory(store: tuple[Settings, int, Path]) -> None:
    settings, incident_id, rec = store
    engine = db.make_engine(settings.database.url)
    try:
        with db.session_factory(engine)() as session:
            held = {(r.label, db.to_timestamp(r.time))
                    for r in load_series(session=session, incident_id=incident_id)
                    if r.metric == "pressure"}  # fmt: skip
            points = [
                SeriesPoint(t, metric, pod, value, "GPU memory")
                for (pod, t), ratio in framebuffer(rec / "gpu-metrics.jsonl").items()
                if (pod, t) not in held
                for metric, value in (("pressure", ratio), ("ceiling", 0.93))
            ]
            incident = session.get(Incident, incident_id)
            assert incident is not None and points
            write_series(incident, points, session=session)
            session.commit()
    finally:
        engine.dispose()
    lines, _ = pressure_chart(settings, incident_id)
    pods = {label.rsplit(" ", 2)[0] for label in lines}
    assert len(pods) == 4
    assert set(lines) == {f"{p} {m}" for p in pods for m in ("GPU memory", "KV cache")}


def framebuffer(path: Path) -> dict[tuple[str, float], float]:
    """Return dcgm-exporter's used/total of each pod's GPU by 5 s bucket start."""
    used: dict[tuple[str, float], float] = {}
    free: dict[tuple[str, float], float] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        t = datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp()
        key = (r["labels"]["pod"], t // 5 * 5)
        if r["name"] == "DCGM_FI_DEV_FB_USED":
            used[key] = float(r["value"])
        elif r["name"] == "DCGM_FI_DEV_FB_FREE":
            free[key] = float(r["value"])
    return {k: u / (u + free[k]) for k, u in used.items() if k in free and u + free[k]}
