"""The database goes away under ``detector run`` (Tansu broker, PostgreSQL store).

While PostgreSQL refuses the detector's connections, the loop must not commit past a record whose
writes failed, nor exit: it rolls back, backs off and re-reads from its commits. When the
database is back, it catches up, and the incident is the one a straight replay gives.
"""

from __future__ import annotations

import time
from pathlib import Path

from kafka_helpers import (
    CASCADE,
    STREAMS,
    committed_sums,
    core_of,
    incidents_in,
    produce,
    start_detector,
    stop,
    topics_of,
    unique_prefix,
    wait_consumed,
)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from detector.config import Settings
from detector.pipeline import replay
from detector.report.document import to_document
from detector.stream.producer import ensure_topics

SECOND_VICTIM_MS = 1741943046_002
TERMINATE = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"
OUTAGE_S = 4.0  # long enough for several failed batches and back-offs


def _allow_connections(db_url: str, allowed: bool) -> None:
    """Open or close the test database to new connections, and drop the open ones."""
    url = make_url(db_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS {allowed}'))
            if not allowed:
                conn.execute(text(TERMINATE), {"d": url.database})
    finally:
        admin.dispose()


def test_a_database_outage_commits_nothing_and_the_loop_catches_up(
    kafka_bootstrap: str, postgres_url: str, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    topics = topics_of(prefix)
    ensure_topics(kafka_bootstrap, topics)
    log = tmp_path / "run.log"
    first = {
        topic: produce(kafka_bootstrap, topic, CASCADE / name, before_ms=SECOND_VICTIM_MS)
        for name, topic in zip(STREAMS, topics, strict=True)
    }
    proc = start_detector(kafka_bootstrap, prefix, postgres_url, log)
    try:
        wait_consumed(kafka_bootstrap, prefix, first, 1, [proc])
        _allow_connections(postgres_url, False)
        try:
            total = {
                topic: first[topic]
                + produce(kafka_bootstrap, topic, CASCADE / name, skip=first[topic])
                for name, topic in zip(STREAMS, topics, strict=True)
            }
            time.sleep(OUTAGE_S)
            assert proc.poll() is None, log.read_text()
            # Records that need no write may still go through; the first one that needs the
            # database stops the partition's commits until the database is back.
            stuck = committed_sums(kafka_bootstrap, prefix, topics, 1)
            time.sleep(1.0)
            assert committed_sums(kafka_bootstrap, prefix, topics, 1) == stuck != total
            failures = log.read_text().count("batch failed")
        finally:
            _allow_connections(postgres_url, True)
        wait_consumed(kafka_bootstrap, prefix, total, 1, [proc])
    finally:
        status = stop(proc)
    assert status == 0, log.read_text()
    assert failures >= 2, "the loop should have retried while the database was down"
    settings = Settings()
    settings.database.url = f"sqlite:///{tmp_path / 'replay.db'}"
    straight = to_document(replay([CASCADE], settings))["incidents"]
    live = incidents_in(postgres_url)
    assert [i["key"] for i in live] == [straight[0]["key"]]
    assert core_of(live[0]) == core_of(straight[0])
