"""The pipeline: parse -> correlate -> record -> contain -> notify; replay of recorded streams.

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
from operator import attrgetter
from pathlib import Path

from sqlalchemy.orm import Session

from detector import db
from detector.config import (
    GrafanaSettings,
    PagerDutySettings,
    Settings,
    SlackSettings,
    load_workload_map,
)
from detector.correlate.correlator import Correlator
from detector.correlate.coverage import SignalCoverage, of_workloads
from detector.correlate.identity import WorkloadRef
from detector.correlate.state import Decision, IncidentOpened, StageChanged
from detector.errors import ConfigError, ParseError
from detector.events.detect import parse_record
from detector.events.model import Signal, SourcePos, slot_init
from detector.events.reader import iter_files, read_records
from detector.events.sources.raw_text import LogIdentity, dated_time
from detector.events.streams import Stream
from detector.incidents import service
from detector.incidents.flows import IncidentRecorder, answer, decision_time
from detector.incidents.models import DeadLetter, Incident
from detector.notify import flows as notify_flows
from detector.report.document import EventCounts, ReplayResult
from detector.report.read import load_incidents, load_verdicts
from detector.runbooks.bindings.registry import step_actuators
from detector.runbooks.flows import ContainmentFlows
from detector.runbooks.loader import load_runbook

log = logging.getLogger(__name__)

COMMIT_EVERY = 5000  # records per database transaction
MAX_JUMP_S = 3600.0  # a record this far ahead of its own stream has a broken clock
JUMP_VOTES = 2  # records that must disagree with a jump before it is called broken
DATED_LOOKS = 1000  # records without signals looked at for a date before a stream has a clock
MIN_TIME = 946_684_800.0  # 2000-01-01T00:00:00Z: anything earlier is a broken clock


@slot_init
@dataclass(frozen=True, slots=True)
class Parsed:
    """One record after parsing: its signals, or the parse error that rejected it."""

    time: float
    source: SourcePos
    raw: bytes
    signals: list[Signal]
    error: ParseError | None = None


def parse_checked(
    raw: bytes,
    source: SourcePos,
    *,
    default_time: float | None,
    max_time: float,
    identity: LogIdentity | None = None,
    not_after: float | None = None,
) -> list[Signal]:
    """Parse one record and check its event time (Unix seconds) lies in 2000..``max_time``.

    ``not_after`` bounds the year or date completed for stamps without one (``parse_record``).
    Raises ParseError (``parse_record``'s reasons, or ``timestamp_out_of_range``).
    """
    signals = parse_record(
        raw, source, default_time=default_time, identity=identity, not_after=not_after
    )
    if signals and not MIN_TIME <= signals[0].time <= max_time:
        raise ParseError("timestamp_out_of_range", f"event time {signals[0].time:.0f}")
    return signals


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

    ``start_time`` (e.g. the file's modification time) dates records that carry no time until
    the stream has a clock. A stamp without a year (or date) takes it from the clock (the
    stream's own dated records: a shipper's envelope, the lines before it; until the stream has
    a clock, also the first of its first ``DATED_LOOKS`` records without signals that carries a
    date), else from ``start_time``, and is never put after ``start_time`` (nor ``max_time``):
    the year that keeps it at or before. ``identity`` names the pod of plain-text lines.
    """
    not_after = min(start_time, max_time) if start_time is not None else max_time
    dated: float | None = None  # the first dated record's time, while the stream has no clock
    looks = DATED_LOOKS
    clock = 0.0
    held: Parsed | None = None
    against = 0  # records since ``held`` that fell far behind it
    for source, raw in records:
        try:
            signals = parse_checked(
                raw,
                source,
                default_time=clock or dated or start_time,
                max_time=max_time,
                identity=identity,
                not_after=not_after,
            )
        except ParseError as exc:
            yield Parsed(clock, source, raw, [], exc)
            continue
        if not signals:
            if not clock and dated is None and looks:  # a dated record without signals
                dated, looks = dated_time(raw), looks - 1
                if dated is not None and not MIN_TIME <= dated <= max_time:
                    dated = None  # a broken clock gives no year
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
    """Merge the parsed streams of all files by event time (times up to a day from now).

    A file's records without a year or date are completed no later than its modification
    time or now, whichever is earlier (``parse_stream``'s ``start_time``).
    """
    now = time.time()
    max_time = now + 86400.0
    streams = [
        parse_stream(
            read_records([path]),
            max_time=max_time,
            start_time=min(path.stat().st_mtime, now),
            identity=identity,
        )
        for path in iter_files(paths)
    ]
    return heapq.merge(*streams, key=_parsed_time)


_parsed_time = attrgetter("time")  # the merge key, without a Python call per record


@dataclass
class Batch:
    """The decisions of one observed signal, as they pass through the stages."""

    decisions: list[Decision]
    incidents: dict[str, Incident] = field(default_factory=dict)  # touched, by key


BatchStage = Callable[[Batch, Session], None]


@dataclass
class Processor:
    """The stage shared by replay and run: correlate each signal, then pass its decisions
    through the batch stages (``record`` -> ``contain`` -> ``notify``), in the caller's
    transaction. ``notify`` queues Slack's messages, PagerDuty's events and Grafana's
    annotations in the outbox, for those configured (``notifying``).

    ``clock`` is the event time reached (the latest decision's); ``seen`` and ``verdicts``
    are the keys of the incidents and verdicts written, in order, for the replay's result;
    ``staged`` says an incident opened or changed stage since the caller last cleared it
    (the live loop then commits at once: the on-call waits for that row).

    ``checkpoint``, when set, splits the stages of decisions that open an incident or change
    its stage: ``record`` and ``notify`` run, then ``checkpoint()`` (the live loop commits, so
    the stage is stored without waiting for the runbook planning), then ``contain`` and
    ``notify`` again. The caller commits its offsets only after its own final commit, and
    every stage is idempotent, so a crash between the two commits re-processes the record.
    Replay leaves it unset: one transaction per ``COMMIT_EVERY`` records.
    """

    correlator: Correlator
    containment: ContainmentFlows
    slack: SlackSettings = field(default_factory=SlackSettings)
    drill: bool = False  # a replay: its Slack messages are labelled and mention no one
    pagerduty: PagerDutySettings = field(default_factory=PagerDutySettings)
    grafana: GrafanaSettings = field(default_factory=GrafanaSettings)
    recorder: IncidentRecorder = field(default_factory=IncidentRecorder)
    counts: EventCounts = field(default_factory=EventCounts)
    clock: float = 0.0
    seen: dict[str, None] = field(default_factory=dict)
    verdicts: dict[str, None] = field(default_factory=dict)
    staged: bool = False
    topics: tuple[str, ...] = ()  # kafka.topics: the stream of a dead letter's topic
    rejected_at: Counter[tuple[str, str]] = field(default_factory=Counter)  # (origin, reason)
    # each workload's signal coverage as of the last ``finish`` (``correlate.coverage``)
    coverage: dict[WorkloadRef, list[SignalCoverage]] = field(default_factory=dict)
    checkpoint: Callable[[], None] | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Processor:
        """Build a fresh processor; raises ConfigError/RunbookError on bad setup."""
        correlator = Correlator(
            settings.correlate, load_workload_map(settings.workloads_file), settings.cluster
        )
        runbook = load_runbook(settings.runbook_path)
        flows = ContainmentFlows.from_settings(runbook, settings, step_actuators(settings))
        return cls(correlator, flows, settings.slack, topics=tuple(settings.kafka.topics),
                   pagerduty=settings.pagerduty, grafana=settings.grafana)  # fmt: skip

    @property
    def stages(self) -> tuple[BatchStage, ...]:
        """Return the stages a batch of decisions goes through, in order."""
        if self.notifying:
            return (self.record, self.contain, self.notify)
        return (self.record, self.contain)

    @property
    def notifying(self) -> bool:
        """Return True when the notify stage runs (Slack, PagerDuty or Grafana configured)."""
        return self.slack.enabled or self.pagerduty.enabled or self.grafana.enabled

    def forget_rows(self) -> None:
        """Drop the store rows cached from the caller's session (its transaction ended in a
        failure and the session was replaced); the correlator's state is kept, the rows are
        read again by key and the series written again whole (idempotent)."""
        self.recorder = IncidentRecorder()

    def process(self, parsed: Parsed, session: Session) -> DeadLetter | None:
        """Observe one record within the caller's transaction; return its new dead letter.

        A rejected record is stored as a dead letter; the row is returned when it is new
        (None when that source position was stored before). Raises StoreError.
        """
        counts = self.counts
        counts.read += 1
        if parsed.error is not None:
            self.rejected_at[parsed.source.origin, parsed.error.reason] += 1
            return _reject(parsed, counts, session)
        counts.parsed += 1
        counts.signals += len(parsed.signals)
        for signal in parsed.signals:
            decisions = self.correlator.observe(signal)
            if decisions:
                self._run(Batch(decisions), session)
        return None

    def _run(self, batch: Batch, session: Session) -> None:
        """Pass ``batch`` through the stages; a staged one around ``checkpoint`` when set."""
        checkpoint = self.checkpoint
        if checkpoint is None or not any(_opens_or_stages(d) for d in batch.decisions):
            for stage in self.stages:
                stage(batch, session)
            return
        self.record(batch, session)
        if self.notifying:
            self.notify(batch, session)
        checkpoint()
        self.contain(batch, session)
        if self.notifying:
            self.notify(batch, session)

    def record(self, batch: Batch, session: Session) -> None:
        """Write each decision to the incident store (incidents, verdicts, timeline), then
        the touched incidents' series buckets that changed (charts, postmortem)."""
        for d in batch.decisions:
            self.clock = max(self.clock, decision_time(d))
            if _opens_or_stages(d):
                self.staged = True
            incident = self.recorder.record(d, session=session, contexts=self.correlator.context)
            if incident is None:
                self.verdicts[d.dedupe_key] = None  # type: ignore[union-attr]
            else:
                batch.incidents[incident.key] = incident
                self.seen[incident.key] = None
        for incident in batch.incidents.values():
            self.recorder.record_series(incident, self.correlator, session=session)

    def contain(self, batch: Batch, session: Session) -> None:
        """Plan or re-plan the runbooks the decisions call for, then advance their steps."""
        context = self.correlator.context
        for d in batch.decisions:
            incident = batch.incidents.get(getattr(d, "key", ""))
            if incident is not None:
                self.containment.follow(d, incident, context(incident.key), session=session)
        for key, incident in batch.incidents.items():
            self._advance(key, incident, session)

    def notify(self, batch: Batch, session: Session) -> None:
        """Queue what the batch added to the incidents' timelines for Slack (the outbox)."""
        for incident in batch.incidents.values():
            notify_flows.queue(incident, session=session, slack=self.slack, drill=self.drill,
                               pagerduty=self.pagerduty, grafana=self.grafana)  # fmt: skip

    def finish(self, session: Session) -> None:
        """Advance containment, answer the questions and store the signal coverage of every
        incident still held.

        The correlator's clock moves the event time reached forward even when no decision
        did (a resolved incident's lifts need time to pass). Raises StoreError.
        """
        self.clock = max(self.clock, self.correlator.now or 0.0)
        self.coverage = self.workload_coverage()
        for key, incident in list(self.recorder.incidents.items()):
            ctx = self.correlator.context(key)
            if ctx is not None:
                self._advance(key, incident, session)
                answer(incident, ctx, session=session)
                self._cover(incident)
                self.recorder.record_series(incident, self.correlator, session=session)
                notify_flows.queue(incident, session=session, slack=self.slack,
                                   drill=self.drill, pagerduty=self.pagerduty,
                                   grafana=self.grafana)  # fmt: skip
        self.recorder.forget_settled(self.correlator.context)
        self.counts.unattributed = self.correlator.unattributed
        self.counts.unattributed_by_reason = self.correlator.unattributed_by_reason.reasons()

    def workload_coverage(self) -> dict[WorkloadRef, list[SignalCoverage]]:
        """Return each workload's coverage of the four signals (``correlate.coverage``): the
        dead letters of a topic count for its stream's signals, those of a file for all."""
        streams = {topic: Stream(i) for i, topic in enumerate(self.topics[: len(Stream)])}
        rejected: Counter[tuple[Stream | None, str]] = Counter()
        for (origin, reason), count in self.rejected_at.items():
            rejected[streams.get(origin), reason] += count
        c = self.correlator
        reasons = c.unattributed_by_reason.reasons()
        return of_workloads(c.workloads, reasons, rejected, c.retired)

    def _cover(self, incident: Incident) -> None:
        """Store the coverage of the incident's workload on its row, when it changed."""
        found = self.coverage.get(WorkloadRef(incident.namespace, incident.workload,
                                              cluster=incident.cluster))  # fmt: skip
        if found is None:
            return
        entries = [c.to_dict() for c in found]
        if incident.coverage != entries:
            incident.coverage = entries

    def _advance(self, key: str, incident: Incident, session: Session) -> int:
        ctx = self.correlator.context(key)
        if ctx is None:
            return 0
        latest = max((s.time for s in ctx.signals), default=ctx.opened_at)
        return self.containment.advance(incident, ctx, max(self.clock, latest), session=session)

    def result(self, session: Session) -> ReplayResult:
        """Return the counts and the incidents and verdicts written, read from the store."""
        return ReplayResult(
            self.counts,
            load_incidents(session=session, keys=list(self.seen)),
            load_verdicts(session=session, dedupe_keys=list(self.verdicts)),
        )


def replay(
    paths: list[Path],
    settings: Settings,
    *,
    progress: Callable[[int], None] | None = None,
    identity: LogIdentity | None = None,
    notify: bool = False,
    page: bool = False,
    annotate: bool = False,
) -> ReplayResult:
    """Run recorded files through the pipeline and store the result.

    ``progress`` is called with the byte size of each record read; ``identity`` names the
    pod of plain-text log lines (files that are one pod's raw log); ``notify`` queues Slack's
    messages, labelled as a drill, in the outbox (``detector.notify.slack.notifier.deliver``
    sends them); ``page`` and ``annotate`` queue PagerDuty's events and Grafana's annotations
    (a drill pages no one and annotates nothing unless asked). Raises FileNotFoundError for a
    missing path, ConfigError/RunbookError/StoreError on bad setup.
    """
    processor = Processor.from_settings(settings)
    if not page:
        processor.pagerduty = PagerDutySettings()  # a drill pages no one unless asked
    elif not settings.pagerduty.enabled:
        raise ConfigError("--page needs PagerDuty: set DETECTOR_PAGERDUTY__ROUTING_KEY")
    if not annotate:
        processor.grafana = GrafanaSettings()  # nor annotates dashboards
    elif not settings.grafana.enabled:
        raise ConfigError("--annotate needs Grafana: set DETECTOR_GRAFANA__URL and __TOKEN")
    if not notify:
        processor.slack = SlackSettings()  # a replay is quiet unless asked
    elif not settings.slack.enabled:
        raise ConfigError(
            "--notify needs Slack: set DETECTOR_SLACK__BOT_TOKEN and DETECTOR_SLACK__CHANNEL"
        )
    processor.drill = True
    db.upgrade(settings.database.url)
    engine = db.make_engine(settings.database.url)
    make_session = db.session_factory(engine)
    try:
        session = make_session()
        for parsed in merged(paths, identity):
            if progress is not None:
                progress(len(parsed.raw) + 1)
            processor.process(parsed, session)
            if processor.counts.read % COMMIT_EVERY == 0:
                session.commit()
        processor.finish(session)
        session.commit()
        result = processor.result(session)
        session.close()
        return result
    finally:
        engine.dispose()


def _opens_or_stages(d: Decision) -> bool:
    return isinstance(d, IncidentOpened | StageChanged)


def _reject(parsed: Parsed, counts: EventCounts, session: Session) -> DeadLetter | None:
    error = parsed.error
    assert error is not None
    counts.rejected += 1
    counts.rejected_by_reason[error.reason] += 1
    log.info("rejected record source=%s reason=%s", parsed.source, error.reason)
    return service.add_dead_letter(
        session=session,
        source=parsed.source,
        reason=error.reason,
        detail=error.detail[:500],
        raw=parsed.raw,
    )
