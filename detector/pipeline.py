"""Replay recorded streams through the whole pipeline: parse, correlate, record.

Each file is one stream, roughly in event-time order; the streams are merged by event
time (a k-way merge, so memory stays bounded by the number of files), as a Kafka consumer
would see them interleaved.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from detector import db
from detector.config import Settings, load_workload_map
from detector.correlate.engine import Correlator
from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import Signal, SourcePos
from detector.events.reader import iter_files, read_records
from detector.events.sources.raw_text import LogIdentity
from detector.incidents import service
from detector.incidents.flows import IncidentFlows
from detector.incidents.schemas import IncidentOut, VerdictOut
from detector.runbooks.loader import load_runbook

log = logging.getLogger(__name__)

COMMIT_EVERY = 5000  # records per database transaction
MAX_JUMP_S = 3600.0  # a record this far ahead of its own stream has a broken clock
JUMP_VOTES = 2  # records that must disagree with a jump before it is called broken
MIN_TIME = 946_684_800.0  # 2000-01-01T00:00:00Z: anything earlier is a broken clock


@dataclass
class EventCounts:
    """How many records were read, parsed and rejected (by reason)."""

    read: int = 0
    parsed: int = 0
    rejected: int = 0
    signals: int = 0
    unattributed: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)


@dataclass
class ReplayResult:
    """What one replay found and stored."""

    events: EventCounts
    incidents: list[IncidentOut]
    verdicts: list[VerdictOut]


@dataclass(frozen=True, slots=True)
class Parsed:
    """One record after parsing: its signals, or the parse error that rejected it."""

    time: float
    source: SourcePos
    raw: bytes
    signals: list[Signal]
    error: ParseError | None = None


def parse_stream(
    records: Iterable[tuple[SourcePos, bytes]],
    *,
    max_time: float = float("inf"),
    start_time: float | None = None,
    identity: LogIdentity | None = None,
) -> Iterator[Parsed]:
    """Parse one stream's records in order, keyed for the merge by the stream's clock.

    The clock is the stream's latest event time, so a late record keeps its place and the
    merge stays ordered. A time before 2000 or after ``max_time`` (Unix seconds) is rejected
    (``timestamp_out_of_range``). A record more than ``MAX_JUMP_S`` ahead of the clock is held:
    when the next ``JUMP_VOTES`` records with signals all fall back far behind it, it had a
    broken clock and is rejected (``timestamp_jump``) instead of stalling the whole stream;
    as soon as one follows it, the stream really moved on and it is kept.

    ``start_time`` (e.g. the file's modification time) dates records that carry no date or
    year until the stream has a clock; ``identity`` names the pod of plain-text lines.
    """
    clock = 0.0
    held: Parsed | None = None
    against = 0  # records since ``held`` that fell far behind it
    for source, raw in records:
        try:
            default = clock or start_time
            signals = parse_record(raw, source, default_time=default, identity=identity)
            if signals and not MIN_TIME <= signals[0].time <= max_time:
                raise ParseError("timestamp_out_of_range", f"event time {signals[0].time:.0f}")
        except ParseError as exc:
            yield Parsed(clock, source, raw, [], exc)
            continue
        if not signals:
            yield Parsed(clock, source, raw, signals)
            continue
        t = signals[0].time
        if held is not None:
            if t >= held.time - MAX_JUMP_S:  # the stream followed: the jump was real
                clock = max(clock, held.time)
                yield held
                held = None
            elif (against := against + 1) >= JUMP_VOTES:
                ahead = f"{held.time - t:.0f} s ahead of the records after it"
                yield Parsed(clock, held.source, held.raw, [], ParseError("timestamp_jump", ahead))
                held = None
        if held is None and clock and t - clock > MAX_JUMP_S:
            held, against = Parsed(t, source, raw, signals), 0
            continue
        clock = max(clock, t) if held is None else clock
        yield Parsed(clock, source, raw, signals)
    if held is not None:
        yield held


def merged(paths: Iterable[str | Path], identity: LogIdentity | None = None) -> Iterator[Parsed]:
    """Merge the parsed streams of all files by event time (times up to a day from now)."""
    max_time = time.time() + 86400.0
    streams = [
        parse_stream(
            read_records([path]),
            max_time=max_time,
            start_time=path.stat().st_mtime,
            identity=identity,
        )
        for path in iter_files(paths)
    ]
    return heapq.merge(*streams, key=lambda p: p.time)


def replay(
    paths: list[Path],
    settings: Settings,
    *,
    progress: Callable[[int], None] | None = None,
    identity: LogIdentity | None = None,
) -> ReplayResult:
    """Run recorded files through the pipeline and store the result.

    ``progress`` is called with the byte size of each record read; ``identity`` names the
    pod of plain-text log lines (files that are one pod's raw log). Raises
    FileNotFoundError for a missing path, ConfigError/RunbookError/StoreError on bad setup.
    """
    correlator = Correlator(
        settings.correlate, load_workload_map(settings.workloads_file), settings.cluster
    )
    flows = IncidentFlows(load_runbook(settings.runbook_path), dry_run=settings.dry_run)
    counts = EventCounts()
    db.upgrade(settings.database.url)
    engine = db.make_engine(settings.database.url)
    make_session = db.session_factory(engine)
    try:
        session = make_session()
        for parsed in merged(paths, identity):
            counts.read += 1
            if progress is not None:
                progress(len(parsed.raw) + 1)
            if parsed.error is not None:
                _reject(parsed, counts, session)
            else:
                counts.parsed += 1
                counts.signals += len(parsed.signals)
                for signal in parsed.signals:
                    decisions = correlator.observe(signal)
                    if decisions:
                        flows.apply(decisions, session=session, contexts=correlator.context)
            if counts.read % COMMIT_EVERY == 0:
                session.commit()
        flows.finish(session=session, contexts=correlator.context)
        session.commit()
        counts.unattributed = correlator.unattributed
        result = ReplayResult(
            counts,
            [IncidentOut.model_validate(i) for i in flows.incidents.values()],
            [VerdictOut.model_validate(v) for v in flows.verdicts.values()],
        )
        session.close()
        return result
    finally:
        engine.dispose()


def _reject(parsed: Parsed, counts: EventCounts, session: Session) -> None:
    error = parsed.error
    assert error is not None
    counts.rejected += 1
    counts.rejected_by_reason[error.reason] += 1
    log.info("rejected record source=%s reason=%s", parsed.source, error.reason)
    service.add_dead_letter(
        session=session,
        source=parsed.source,
        reason=error.reason,
        detail=error.detail[:500],
        raw=parsed.raw,
    )
