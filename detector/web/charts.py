"""Charts of an incident on one time axis, as geometry the page's template draws in SVG.

Pure: from the incident's time series (``detector.report.series``: ``metric``, ``label``,
``time``, ``value``, ``detail``) and its markers (deaths, stage changes, steps applied or
lifted), ``charts`` returns two ``Chart``s over the same time span: the load balancer's
request, 5xx and 429 rates (per second, from 5 s buckets) and each pod's memory or KV-cache
pressure (used/total) with the ceiling. Coordinates are numbers; every label goes through the
template's autoescaping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

WIDTH, HEIGHT = 960.0, 220.0
LEFT, RIGHT, TOP, BOTTOM = 56.0, 12.0, 14.0, 28.0
RATIO = "used / total"
LB_METRICS = (("requests", "requests/s"), ("errors_5xx", "5xx/s"), ("shed_429", "429/s"))


@dataclass(frozen=True, slots=True)
class Line:
    """One series drawn as a polyline: ``points`` is SVG ``x,y`` pairs."""

    label: str
    css: str
    points: str
    last: float


@dataclass(frozen=True, slots=True)
class Marker:
    """A vertical line at ``x``: a death, a stage change or a step."""

    x: float
    kind: str
    label: str


@dataclass
class Chart:
    """One panel: title, lines, markers, horizontal rules (``(y, label)``), axis ticks."""

    title: str
    unit: str
    lines: list[Line] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    rules: list[tuple[float, str]] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    width: float = WIDTH
    height: float = HEIGHT
    top: float = 1.0  # the value at the top of the panel

    @property
    def empty(self) -> bool:
        """Return True when there is nothing to draw."""
        return not self.lines


def charts(
    series: Sequence[Mapping[str, Any]],
    markers: Iterable[tuple[datetime, str, str]],
    ceiling: float,
    bucket_s: float = 5.0,
) -> list[Chart]:
    """Return the load-balancer chart and the pressure chart on one shared time axis.

    ``series``: rows with ``time`` (datetime), ``metric``, ``label``, ``value``, ``detail``;
    LB metrics are counts per ``bucket_s`` bucket (drawn as rates per second), ``pressure``
    is a ratio and ``ceiling`` the ratio it was judged against (drawn as rules). ``markers``:
    (time, kind, label). ``ceiling``: the configured ceiling, drawn when no series has one.
    """
    marks = list(markers)
    times = [r["time"] for r in series] + [m[0] for m in marks]
    if not times:
        return []
    t0, t1 = min(times).timestamp(), max(times).timestamp()
    t1 = max(t1, t0 + bucket_s)
    lb: list[Raw] = []
    for metric, label in LB_METRICS:
        rows = [r for r in series if r["metric"] == metric and not r["label"]]
        if rows:
            lb.append(
                (label, metric, [(r["time"].timestamp(), r["value"] / bucket_s) for r in rows])
            )
    pressure: list[Raw] = []
    pods = sorted({r["label"] for r in series if r["metric"] == "pressure"})
    for n, pod in enumerate(pods):
        rows = [r for r in series if r["metric"] == "pressure" and r["label"] == pod]
        detail = rows[-1].get("detail") or "pressure"
        points = [(r["time"].timestamp(), r["value"]) for r in rows]
        pressure.append((f"{pod} ({detail})", f"pod{n % 8}", points))
    found = []
    if lb:
        found.append(_chart("Load balancer", "per second", lb, marks, (t0, t1), 1.0))
    if pressure:
        chart = _chart("Memory / KV-cache pressure", RATIO, pressure, marks, (t0, t1),
                       max(1.0, ceiling))  # fmt: skip
        # the ceilings the readings were judged against (a pre-reserving engine's reservation
        # plus margin, per pod), else the configured one
        judged = sorted({round(r["value"], 3) for r in series if r["metric"] == "ceiling"})
        for value in judged or [ceiling]:
            chart.rules.append((_y(value, chart.top), f"ceiling {value:.0%}"))
        found.append(chart)
    return found


Raw = tuple[str, str, list[tuple[float, float]]]  # label, css class, (t, value) points


def _chart(
    title: str,
    unit: str,
    raw: list[Raw],
    marks: list[tuple[datetime, str, str]],
    span: tuple[float, float],
    floor: float,
) -> Chart:
    """Scale ``raw`` lines and ``marks`` into one panel over ``span`` (Unix seconds)."""
    t0, t1 = span
    top = _nice(max([floor, *(v for _, _, pts in raw for _, v in pts)]))
    chart = Chart(title, unit, top=top)
    for label, css, pts in raw:
        xy = " ".join(f"{_x(t, t0, t1):.1f},{_y(v, top):.1f}" for t, v in pts)
        chart.lines.append(Line(label, css, xy, pts[-1][1]))
    chart.markers = [Marker(_x(w.timestamp(), t0, t1), kind, label) for w, kind, label in marks]
    percent = unit == RATIO
    chart.y_ticks = [
        (_y(top * k / 4, top), f"{top * k / 4:.0%}" if percent else f"{top * k / 4:g}")
        for k in range(5)
    ]
    step = (t1 - t0) / 6
    chart.x_ticks = [
        (_x(t0 + k * step, t0, t1), datetime.fromtimestamp(t0 + k * step, UTC).strftime("%H:%M:%S"))
        for k in range(7)
    ]
    return chart


def _x(t: float, t0: float, t1: float) -> float:
    return LEFT + (t - t0) / (t1 - t0) * (WIDTH - LEFT - RIGHT)


def _y(v: float, top: float) -> float:
    return TOP + (1 - min(v, top) / top) * (HEIGHT - TOP - BOTTOM)


def _nice(top: float) -> float:
    """Round a maximum up to 1, 2 or 5 times a power of ten."""
    if top <= 0:
        return 1.0
    scale = 10 ** len(str(int(top))) / 10 if top >= 1 else 1.0
    for m in (1, 2, 5, 10):
        if top <= m * scale:
            return m * scale
    return top
