"""The closed loop: the model's streams through the real detector, its containment back.

Every model step (the scenario's ``step_s``, 0.5 s by default), the model
(``detector.sim.model.Endpoint``) advances and hands over the records it wrote, in the four
streams' real formats; each goes through the production parser and the same
``pipeline.Processor`` as ``detector run`` (correlate, record, contain), into a SQLite store
of its own. Containment acts through the real actuators: the Kubernetes
actuator patches the Deployment and evicts pods through the real ``kubernetes`` client against
the local API stand-in (``detector.sim.kube_api``), and the plain-nginx actuator writes the
gateway's ``limit_req``/``limit_conn`` include files (``detector.sim.gateway``: an aggregate
rate and concurrency bound, 429 beyond); ``detector.sim.cluster.SimCluster`` hands both back to
the model. There is no other path from the detector into the model.

Containment modes: ``off`` (the detector watches; dry-run, nothing acts), ``on`` (the
workload is armed and the runbook acts; a simulated on-call engineer approves each step
waiting for a person ``approve_after_s`` after it asked, through the one decide flow), and
``predictive`` (``on`` plus the gateway limit at ``suspected`` when the next-victim forecast
says a survivor reaches its ceiling before a restarted pod could serve again).

Event time 0 is ``START`` (Unix seconds), as in the bundled recordings; a person's decision is
stamped with the simulated time at which it is made.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from sqlalchemy.orm import Session

from detector import db
from detector.config import (
    ContainmentSettings,
    DatabaseSettings,
    KubernetesSettings,
    Settings,
    SlackSettings,
)
from detector.errors import ConfigError, ParseError
from detector.events.model import SourcePos
from detector.notify import flows as notify_flows
from detector.pipeline import Parsed, Processor, parse_checked
from detector.report.listing import list_incidents
from detector.report.read import load_verdicts
from detector.runbooks.flows import DecisionKind, DecisionRequest
from detector.sim.cluster import SimCluster
from detector.sim.gateway import NginxStandIn
from detector.sim.kube_api import KubeStandIn, serving, write_kubeconfig
from detector.sim.model import Endpoint
from detector.sim.outcome import ClientOutcome, Outcome, client_outcome
from detector.sim.scenario import Scenario

FINISH_EVERY_S = 5.0  # how often the held incidents' steps are advanced with no new record
AFTER_S = 900.0  # the most the run goes on after the scenario for the detector to lift
APPROVER = "sim-oncall"
STORE = "sim.db"  # the store's file in the work folder
START = 1_741_942_800.0  # 2025-03-14T09:00:00Z, as the bundled recordings: event time 0


class Containment(StrEnum):
    """What the detector may do in a run: watch, act, or act early on the forecast."""

    OFF = "off"
    ON = "on"
    PREDICTIVE = "predictive"


@dataclass(frozen=True)
class SimOutcome:
    """What happened in one run: what the clients felt, the endpoint's figures, the detector's.

    Per client request (a request and its retries, ``detector.sim.outcome.ClientOutcome``):
    ``client_requests``, ``client_failed`` (the last attempt failed; shed ones included),
    ``shed_requests`` (the last attempt refused by the gateway itself: 429; 413/400 from an
    admission rule), ``client_unfinished``, ``goodput_tokens_per_s``,
    ``latency_p50_s``/``latency_p99_s``. Per attempt, over the whole run (the scenario and the
    run on after it): ``attempts``, ``attempts_5xx``, ``attempts_429``, ``attempts_413``.
    ``answered_in_span``: the answers the simulator logged in the span of the incident's
    postmortem (its ``impact.span``: whole load-balancer buckets, ISO 8601): ``responses``,
    ``answers_5xx`` and ``shed`` (429 and 413), which the postmortem's ``requests``,
    ``failed_5xx`` and ``shed_429`` count from the streams; they differ from the whole run's
    by the answers outside the span and the attempts never answered (None without an
    incident). ``pods_lost`` counts the replicas that died of GPU OOM at least once
    (``victims``: the first pod of each, in order; ``oom_causes``: what each GPU OOM death
    allocated for); ``non_oom_deaths``: faults, liveness kills, failed starts; ``preemptions``:
    vLLM's preemptions and SGLang's retractions over the run. Times are seconds from the first GPU
    OOM (None when it did not happen): ``detect_s`` to the incident's ``cascading`` stage,
    ``contain_s`` to the first write of the real actuators that reached the cluster,
    ``recover_s`` until every replica serves again and keeps serving to the end of the run.
    ``incidents``: how many the detector opened; ``actions``: the writes that reached the
    cluster, in order (``METHOD path`` for the Kubernetes API, ``nginx: ...`` for the
    gateway); ``left_in_force``: what they left changed at the end of the run, which goes on
    after the scenario (traffic at its last rate, clients no longer counted) until the
    detector lifted what it applied and its incident resolved, at most ``AFTER_S`` more:
    ``ran_on_s``. ``verdict``: the reason of
    a "not this pattern" verdict.
    """

    scenario: str
    containment: Containment
    seed: int
    client_requests: int
    client_failed: int
    shed_requests: int
    client_unfinished: int
    goodput_tokens_per_s: float
    latency_p50_s: float | None
    latency_p99_s: float | None
    pods_total: int
    pods_lost: int
    victims: list[str]
    oom_causes: list[str]
    non_oom_deaths: int
    preemptions: int
    attempts: int
    attempts_5xx: int
    attempts_429: int
    attempts_413: int
    detect_s: float | None
    contain_s: float | None
    recover_s: float | None
    incidents: int
    incident: str | None
    stage: str | None
    verdict: str | None = None
    actions: list[str] = field(default_factory=list)
    left_in_force: list[str] = field(default_factory=list)
    ran_on_s: float = 0.0
    answered_in_span: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return the outcome as JSON-ready data."""
        return asdict(self)


def sim_settings(
    base: Settings, scenario: Scenario, mode: Containment, work: Path, gateway: NginxStandIn
) -> Settings:
    """Return ``base`` with the simulation's store, cluster, gateway, arming and approver.

    Slack is off (the console is the face); the correlation settings and the runbook stay the
    caller's.
    """
    key = f"{scenario.namespace}/{scenario.workload}"
    kube = KubernetesSettings(
        kubeconfig=work / "kubeconfig", rollout="unavailable", request_timeout_s=5.0
    )
    containment = ContainmentSettings(
        armed_workloads=[key] if mode is not Containment.OFF else [],
        approvers=[APPROVER],
        kubernetes=kube,
        nginx=gateway.settings(),
        rate_limit_gateway="nginx",
        predictive=mode is Containment.PREDICTIVE,
    )
    return base.model_copy(
        update={
            "database": DatabaseSettings(url=f"sqlite:///{work / STORE}"),
            "dry_run": mode is Containment.OFF,
            "containment": containment,
            "slack": SlackSettings(),
        }
    )


def simulate(
    scenario: Scenario,
    base: Settings,
    *,
    mode: Containment,
    seed: int | None = None,
    record: Path | None = None,
    workdir: Path | None = None,
    approve_after_s: float = 60.0,
) -> SimOutcome:
    """Run ``scenario`` in a closed loop with the detector and return its outcome.

    ``record`` writes the streams as files ``detector replay`` reads (one per stream, the
    model's file names); ``workdir`` keeps the store, the kubeconfig and the gateway's files
    (default: a temporary directory removed at the end; one that holds a store already is
    refused: two runs would merge into one incident). Raises ConfigError/RunbookError/
    StoreError on bad setup, OSError when ``record`` or ``workdir`` cannot be written.
    """
    if workdir is not None and (workdir / STORE).exists():
        raise ConfigError(
            f"{workdir} holds a simulation's store already ({STORE}): choose a new folder"
        )
    with ExitStack() as stack:
        work = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        kube = stack.enter_context(serving(KubeStandIn()))
        write_kubeconfig(work, kube.url)
        endpoint = Endpoint(scenario, start=START, seed=seed)
        gateway = NginxStandIn(work / "nginx")
        cluster = SimCluster(endpoint, kube, gateway, scenario)
        settings = sim_settings(base, scenario, mode, work, gateway)
        sinks = stack.enter_context(_sinks(record))
        found = _run(endpoint, cluster, settings, sinks, approve_after_s)
        return _outcome(endpoint, cluster, settings, found, mode, seed)


def _more(t: float, endpoint: Endpoint, cluster: SimCluster, processor: Processor) -> bool:
    """Return whether the run goes on at ``t``: the scenario's time, then until what the
    detector applied is lifted and its incident resolved (at most ``AFTER_S`` more)."""
    duration = endpoint.scenario.duration_s
    if t < duration:
        return True
    waiting = cluster.in_force() or (cluster.writes and processor.correlator.open_incidents)
    return t < duration + AFTER_S and bool(waiting)


def _run(
    endpoint: Endpoint,
    cluster: SimCluster,
    settings: Settings,
    sinks: Sinks | None,
    approve_after_s: float,
) -> tuple[list[str], str | None, ClientOutcome, float]:
    """Advance the model to its end, feeding the detector, then on until the detector's
    measures are lifted (``_more``).

    Returns the keys of the incidents the run opened, the reason of its first "not this
    pattern" verdict (None when there was none), the clients' outcome at the scenario's end
    and the offset the run ended at.
    """
    processor = Processor.from_settings(settings)
    db.upgrade(settings.database.url)
    engine = db.make_engine(settings.database.url)
    session = db.session_factory(engine)()
    asked: dict[tuple[str, int], float] = {}  # (incident, position) -> when first seen waiting
    lines: dict[str, int] = {}
    duration, start, step = endpoint.scenario.duration_s, START, endpoint.scenario.step_s
    next_finish, t, clients = FINISH_EVERY_S, 0.0, None
    try:
        while _more(t, endpoint, cluster, processor):
            t = min(t + step, duration) if t < duration else t + step
            cluster.sync()
            endpoint.advance(t)
            for name, _offset, text in endpoint.recorder.drain(t):
                lines[name] = lines.get(name, 0) + 1
                if sinks is not None:
                    sinks.write(name, text)
                processor.process(_parse(text, SourcePos(name, lines[name])), session)
            cluster.apply()  # what the step's records made the detector do, at the step's time
            if t >= next_finish:
                next_finish += FINISH_EVERY_S
                processor.finish(session)
                cluster.apply()
                _approve(session, settings, start + t, asked, approve_after_s)
            session.commit()
            if clients is None and t >= duration:  # what the clients felt in the scenario's time
                clients = client_outcome(endpoint.arrivals.clients, duration)
        processor.finish(session)
        session.commit()
        verdicts = load_verdicts(session=session, dedupe_keys=list(processor.verdicts)[:1])
        assert clients is not None
        return list(processor.seen), verdicts[0].reason if verdicts else None, clients, t
    finally:
        session.close()
        engine.dispose()


def _parse(text: str, source: SourcePos) -> Parsed:
    """Parse one record as replay does (no year completion needed: every stamp is dated)."""
    raw = text.encode()
    try:
        signals = parse_checked(raw, source, default_time=None, max_time=float("inf"))
    except ParseError as exc:
        return Parsed(0.0, source, raw, [], exc)
    return Parsed(signals[0].time if signals else 0.0, source, raw, signals)


def _approve(
    session: Session,
    settings: Settings,
    now: float,
    asked: dict[tuple[str, int], float],
    after_s: float,
) -> None:
    """Approve, as the on-call engineer, each step that has waited ``after_s`` for a person."""
    at = datetime.fromtimestamp(now, UTC)
    for row in list_incidents(session=session, now=at):
        for position in row.waiting:
            since = asked.setdefault((row.key, position), now)
            if now - since < after_s:
                continue
            request = DecisionRequest(
                DecisionKind.APPROVE,
                via="sim",
                actor=APPROVER,
                reason="simulated on-call",
                incident=row.key,
                step=str(position),
            )
            notify_flows.decide(
                request,
                session=session,
                approvers=settings.containment.approvers,
                slack=settings.slack,
                now=now,
            )


def _outcome(
    endpoint: Endpoint,
    cluster: SimCluster,
    settings: Settings,
    found: tuple[list[str], str | None, ClientOutcome, float],
    mode: Containment,
    seed: int | None,
) -> SimOutcome:
    (keys, verdict, clients, ended), o, s = found, endpoint.outcome, endpoint.scenario
    key = keys[0] if keys else None
    first = o.first_oom_at
    for sim in endpoint.fleet.pods:
        if sim.engine is not None:
            o.preemptions += sim.engine.preemptions
    milestones = _milestones(settings, key) if key is not None else {}

    def since_first(at: float | None) -> float | None:
        return None if first is None or at is None else round(at - first, 2)

    return SimOutcome(
        scenario=s.name,
        containment=mode,
        seed=s.seed if seed is None else seed,
        **asdict(clients),
        pods_total=o.pods_total,
        pods_lost=o.pods_lost,
        victims=list(o.victims),
        oom_causes=list(o.oom_causes),
        non_oom_deaths=o.non_oom_deaths + endpoint.fleet.start_failures,
        preemptions=o.preemptions,
        attempts=o.attempts,
        attempts_5xx=o.attempts_5xx,
        attempts_429=o.attempts_429,
        attempts_413=o.attempts_413,
        detect_s=milestones.get("cascading"),
        contain_s=since_first(cluster.writes[0][0] if cluster.writes else None),
        recover_s=since_first(o.all_serving_at),
        incidents=len(keys),
        incident=key,
        stage=milestones.get("stage"),
        verdict=verdict,
        actions=[what for _, what in cluster.writes],
        left_in_force=cluster.in_force(),
        ran_on_s=round(ended - s.duration_s, 1),
        answered_in_span=_in_span(o, milestones.get("span")),
    )


def _in_span(o: Outcome, span: dict[str, Any] | None) -> dict[str, Any] | None:
    """Return the answers the simulator logged in a postmortem's ``span`` (ISO 8601 start
    and end; None: the postmortem has no series)."""
    if not span or span.get("start") is None or span.get("end") is None:
        return None
    start, end = (datetime.fromisoformat(span[k]).timestamp() for k in ("start", "end"))
    got = o.answered(start, end)
    return {"start": span["start"], "end": span["end"], "responses": got.responses,
            "answers_5xx": got.answers_5xx, "shed": got.shed}  # fmt: skip


def _milestones(settings: Settings, key: str) -> dict[str, Any]:
    """Return the incident's stage, its detection milestones' delays and its impact's span
    from the postmortem."""
    from detector.postmortem.export import export_postmortem  # pandas: not for `detector run`

    engine = db.make_engine(settings.database.url)
    try:
        with db.session_factory(engine)() as session:
            export = export_postmortem(session=session, ref=key, fmt="json", settings=settings)
    finally:
        engine.dispose()
    doc = json.loads(export.text)
    out: dict[str, Any] = {m["milestone"]: m["delay_s"] for m in doc.get("detection") or []}
    out["stage"] = (doc.get("incident") or {}).get("stage")
    out["span"] = (doc.get("impact") or {}).get("span")
    return out


@contextmanager
def _sinks(record: Path | None) -> Iterator[Sinks | None]:
    """Yield the files of ``record`` (None: nothing is recorded); close them at the end."""
    if record is None:
        yield None
        return
    sinks = Sinks(record)
    try:
        yield sinks
    finally:
        for handle in sinks.files.values():
            handle.close()


@dataclass
class Sinks:
    """One file per stream under ``folder``, opened when its first record comes."""

    folder: Path
    files: dict[str, IO[str]] = field(default_factory=dict)

    def write(self, name: str, text: str) -> None:
        """Append one record (a line) to the stream's file."""
        handle = self.files.get(name)
        if handle is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle = self.files[name] = (self.folder / name).open("w", encoding="utf-8")
        handle.write(text + "\n")
