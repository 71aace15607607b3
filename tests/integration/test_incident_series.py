"""The bundled cascade's time series, stored per incident, against a count of the raw lines.

The access lines of ``examples/cascade/lb-access.jsonl`` are counted here on their own (json,
a regular expression for the ingress-nginx log format: status and upstream name), per 5 s
bucket of their ``@timestamp``; the replay's ``incident_series`` rows must agree, and a
second replay into the same store must leave the same rows.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from detector import db
from detector.config import DatabaseSettings, Settings
from detector.correlate.series import SeriesPoint
from detector.incidents import service
from detector.incidents.flows import write_series
from detector.incidents.models import Incident
from detector.pipeline import replay
from detector.report.series import SERIES_BUCKET_S, SeriesOut, load_series

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
UPSTREAM = "llm-vllm-llama-8000"  # ingress-nginx's upstream name of Service llm/vllm-llama
# ingress-nginx's default log format: ... "$request" $status ... [$proxy_upstream_name] ...
ACCESS = re.compile(r'\] "[^"]*" (?P<status>\d{3}) .*? \[(?P<upstream>[^\]]*)\] \[')


def raw_counts(start: float) -> dict[tuple[str, float], int]:
    """Return (metric, bucket start) -> responses of UPSTREAM's access lines from ``start``."""
    counts: Counter[tuple[str, float]] = Counter()
    first = int(start // SERIES_BUCKET_S)
    for line in (EXAMPLES / "cascade" / "lb-access.jsonl").read_text().splitlines():
        record = json.loads(line)
        match = ACCESS.search(record["log"])
        if match is None or match["upstream"] != UPSTREAM:
            continue  # the controller's error and warning lines, other upstreams
        index = int(record["@timestamp"] // SERIES_BUCKET_S)
        if index < first:
            continue
        bucket, status = index * SERIES_BUCKET_S, int(match["status"])
        counts[("requests", bucket)] += 1
        if 500 <= status <= 599:
            counts[("errors_5xx", bucket)] += 1
        elif status == 429:
            counts[("shed_429", bucket)] += 1
    return counts


def replay_and_load(url: str) -> tuple[Incident, list[SeriesOut]]:
    settings = Settings(database=DatabaseSettings(url=url))
    replay([EXAMPLES], settings)
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            incidents = list(session.scalars(select(Incident)))
            (incident,) = [i for i in incidents if i.workload == "vllm-llama"]
            return incident, load_series(session=session, incident_id=incident.id)
    finally:
        engine.dispose()


def check_cascade_series(url: str) -> None:
    incident, rows = replay_and_load(url)
    window_s = Settings().correlate.window_s
    expected = raw_counts(db.to_timestamp(incident.opened_at) - window_s)
    stored = {(r.metric, db.to_timestamp(r.time)): r.value for r in rows if r.label == ""}
    for metric in ("requests", "errors_5xx", "shed_429"):
        got = {t: v for (m, t), v in stored.items() if m == metric and v}
        want = {t: float(n) for (m, t), n in expected.items() if m == metric}
        assert got == want, metric
        assert sum(got.values()) == sum(want.values())
    assert sum(v for (m, _), v in stored.items() if m == "errors_5xx") == 827  # 502/503/504/500
    assert rows == sorted(rows, key=lambda r: (r.metric, r.label, r.time))
    pressure = [r for r in rows if r.metric == "pressure"]
    assert pressure and all(r.label and r.detail in ("GPU memory", "KV cache") for r in pressure)
    assert max(r.value for r in pressure) >= 0.95  # the victims sat at the ceiling
    ceilings = {(r.label, r.time) for r in rows if r.metric == "ceiling"}
    assert ceilings == {(r.label, r.time) for r in pressure}

    again, rows_again = replay_and_load(url)  # a second replay into the same store
    assert again.id == incident.id
    assert [r.model_dump() for r in rows_again] == [r.model_dump() for r in rows]


def test_cascade_series_match_the_access_lines_sqlite(sqlite_url: str) -> None:
    check_cascade_series(sqlite_url)


@pytest.mark.postgres
def test_cascade_series_match_the_access_lines_postgres(postgres_url: str) -> None:
    check_cascade_series(postgres_url)


T0 = 1_741_942_800.0


def check_upsert(url: str) -> None:
    db.upgrade(url)
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            incident = service.get_or_create_incident(
                session=session, key="llm/w@1", namespace="llm", workload="w",
                workload_kind="Deployment", cluster=None, stage="suspected", opened_at=T0,
            )  # fmt: skip
            pod = "w-7d9f8b6c5d-x2k4p"
            write_series(incident, [
                SeriesPoint(T0, "requests", "", 10.0),
                SeriesPoint(T0, "pressure", pod, 0.97, "GPU memory"),
            ], session=session)  # fmt: skip
            write_series(incident, [
                SeriesPoint(T0, "requests", "", 12.0),  # the bucket grew
                SeriesPoint(T0 + 5, "requests", "", 3.0),  # a new bucket
                SeriesPoint(T0, "pressure", pod, 0.6, "GPU memory"),  # part of it, re-read
            ], session=session)  # fmt: skip
            session.commit()
            got = [(db.to_timestamp(r.time) - T0, r.metric, r.label, r.value, r.detail)
                   for r in load_series(session=session, incident_id=incident.id)]  # fmt: skip
            assert got == [
                (0.0, "pressure", pod, 0.97, "GPU memory"),
                (0.0, "requests", "", 12.0, ""),
                (5.0, "requests", "", 3.0, ""),
            ]
            write_series(incident, [SeriesPoint(T0, "pressure", pod, 0.5, "KV cache")],
                         session=session)  # fmt: skip
            session.commit()
            (pressure,) = [
                r for r in load_series(session=session, incident_id=incident.id)
                if r.metric == "pressure"
            ]  # fmt: skip
            assert (pressure.value, pressure.detail) == (0.5, "KV cache")  # the measure changed
    finally:
        engine.dispose()


def test_write_series_upserts_growing_values_sqlite(sqlite_url: str) -> None:
    check_upsert(sqlite_url)


@pytest.mark.postgres
def test_write_series_upserts_growing_values_postgres(postgres_url: str) -> None:
    check_upsert(postgres_url)
