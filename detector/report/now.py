"""The incident's state of now, from the read model: which pods serve, whether the endpoint is
up, the load balancer's latest rates and the latest memory reading of each live pod.

Pure: input is the incident's ``IncidentOut`` JSON dump and its series
(``detector.report.series.SeriesOut`` dumps). A pod is *seen* when any evidence names it (its
engine's config, a memory reading, a death, a start); it is *down* when its latest death (a
victim's OOM, ``gpu_oom`` or ``engine_dead`` evidence) is later than its latest start
(``pod_ready`` evidence: the engine logged its KV cache ready again). The rates average the
load balancer's buckets of the last ``LB_WINDOW_S`` before the latest one's end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from detector.report.series import SERIES_BUCKET_S

LB_WINDOW_S = 30.0
DEATHS = frozenset({"gpu_oom", "engine_dead"})
STARTS = frozenset({"pod_ready"})
LB_METRICS = ("requests", "errors_5xx", "shed_429")


@dataclass(frozen=True, slots=True)
class LbNow:
    """The load balancer's rates over ``window_s`` up to ``until``, responses per second."""

    until: datetime
    window_s: float
    requests_per_s: float
    errors_5xx_per_s: float
    shed_429_per_s: float

    @property
    def error_ratio(self) -> float | None:
        """Return the share of 5xx in the responses (None: no responses)."""
        return self.errors_5xx_per_s / self.requests_per_s if self.requests_per_s else None


@dataclass(frozen=True, slots=True)
class StateNow:
    """Pods seen and down (sorted), the load balancer now (None: no series), and the latest
    memory evidence of each live pod."""

    seen: tuple[str, ...]
    down: tuple[str, ...]
    lb: LbNow | None
    readings: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def serving(self) -> int:
        """Return how many of the pods seen are not down."""
        return len(self.seen) - len(self.down)

    @property
    def endpoint_down(self) -> bool:
        """Tell whether every pod seen is down: the model endpoint answers nothing."""
        return bool(self.seen) and not self.serving


def state_now(inc: Mapping[str, Any], series: Sequence[Mapping[str, Any]]) -> StateNow:
    """Return the incident's state of now (see the module doc)."""
    died: dict[str, datetime] = {}
    started: dict[str, datetime] = {}
    seen: set[str] = set()
    for v in inc["victims"]:
        _latest(died, v["pod"], _time(v["first_oom_at"]))
    for e in inc["evidence"]:
        pod = e.get("pod")
        if not pod or e["kind"] in ("lb_errors", "request_held"):  # the gateway's pod, a client
            continue
        seen.add(pod)
        if e["kind"] in DEATHS:
            _latest(died, pod, _time(e["time"]))
        elif e["kind"] in STARTS:
            _latest(started, pod, _time(e["time"]))
    seen |= died.keys()
    down = {p for p, t in died.items() if p not in started or started[p] < t}
    readings: dict[str, Mapping[str, Any]] = {}
    for e in sorted(inc["evidence"], key=lambda e: _time(e["time"])):
        if e["kind"] == "gpu_memory" and e.get("pod") and e["pod"] not in down:
            readings[e["pod"]] = e
    return StateNow(tuple(sorted(seen)), tuple(sorted(down)), _lb_now(series), readings)


def down_spans(inc: Mapping[str, Any]) -> list[tuple[str, datetime, datetime | None]]:
    """Return each span a pod was down: (pod, death, ready again; None: no start recorded
    after it), by pod and time.

    Deaths and starts as in the module doc; the deaths of one span (the OOM, then the engine's
    death a few ms later) fold into its first; the span ends at the first start after it.
    """
    events: list[tuple[str, datetime, bool]] = []  # pod, time, True: a death
    for v in inc["victims"]:
        events.append((v["pod"], _time(v["first_oom_at"]), True))
    for e in inc["evidence"]:
        if e.get("pod") and e["kind"] in DEATHS | STARTS:
            events.append((e["pod"], _time(e["time"]), e["kind"] in DEATHS))
    spans: list[tuple[str, datetime, datetime | None]] = []
    died: tuple[str, datetime] | None = None  # the open span: pod, death
    for pod, at, death in sorted(events, key=lambda x: (x[0], x[1], not x[2])):
        if died is not None and died[0] != pod:
            spans.append((*died, None))
            died = None
        if death and died is None:
            died = (pod, at)
        elif not death and died is not None:
            spans.append((*died, at))
            died = None
    if died is not None:
        spans.append((*died, None))
    return spans


def _lb_now(series: Sequence[Mapping[str, Any]]) -> LbNow | None:
    buckets = [s for s in series if s["metric"] in LB_METRICS and not s["label"]]
    if not buckets:
        return None
    last = max(_time(s["time"]) for s in buckets)
    since = last - timedelta(seconds=LB_WINDOW_S - SERIES_BUCKET_S)
    window = [s for s in buckets if _time(s["time"]) >= since]
    sums = {m: sum(s["value"] for s in window if s["metric"] == m) for m in LB_METRICS}
    until = last + timedelta(seconds=SERIES_BUCKET_S)
    return LbNow(until, LB_WINDOW_S, *(sums[m] / LB_WINDOW_S for m in LB_METRICS))


def _latest(times: dict[str, datetime], pod: str, at: datetime) -> None:
    if pod not in times or times[pod] < at:
        times[pod] = at


def _time(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)
