"""Charts of an incident on one time axis, as geometry the page's template draws in SVG.

Pure: from the incident's time series (``detector.report.series``: ``metric``, ``label``,
``time``, ``value``, ``detail``), its markers (deaths, stage changes, steps applied or lifted)
and its pods' down spans (``detector.report.now.down_spans``), ``charts`` returns two
``Chart``s over the same time span: the load balancer's request, 5xx and 429 rates (per
second, from 5 s buckets) and the pods' pressure (used/total) with the ceilings.

Pressure is one line per pod and measure, named by the rows' ``detail`` ("pod GPU memory",
"pod KV cache"), drawn in segments (``Line.segments``, one SVG polyline each): broken while
its pod was down and wherever its readings stopped, by ``detector.report.pressure``'s rule
(its module doc), which the postmortem's plots share.

Coordinates are numbers; every label goes through the template's autoescaping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from detector.correlate.series import CEILING, GPU_MEMORY, KV_CACHE, PRESSURE
from detector.report.pressure import DownSpan, pressure_lines

WIDTH, HEIGHT = 960.0, 220.0
LEFT, RIGHT, TOP, BOTTOM = 56.0, 12.0, 14.0, 28.0
RATIO = "used / total"
LB_METRICS = (("requests", "requests/s"), ("errors_5xx", "5xx/s"), ("shed_429", "shed 429/413 /s"))
MEASURE_CSS = {KV_CACHE: "kv-cache", GPU_MEMORY: "gpu-memory"}  # detail -> CSS class


@dataclass(frozen=True, slots=True)
class Line:
    """One series drawn as polylines: each of ``segments`` is SVG ``x,y`` pairs; ``last`` is
    its latest value. A lone reading is drawn as a 2-unit tick, so that it shows."""

    label: str
    css: str
    segments: tuple[str, ...]
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
    down: Iterable[DownSpan] = (),
) -> list[Chart]:
    """Return the load-balancer chart and the pressure chart on one shared time axis.

    ``series``: rows with ``time`` (datetime, the bucket's start), ``metric``, ``label``,
    ``value``, ``detail``; LB metrics are counts per ``bucket_s`` bucket (drawn as rates per
    second), ``pressure`` is a ratio and ``ceiling`` the ratio it was judged against (drawn as
    rules). ``markers``: (time, kind, label). ``ceiling``: the configured ceiling, drawn when no
    series has one. ``down``: (pod, death, ready again or None) spans that break the pod's
    pressure lines (see the module doc for the rule).
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
            pts = [(r["time"].timestamp(), r["value"] / bucket_s) for r in rows]
            lb.append((label, metric, [pts]))
    pressure = _pressure(series, list(down), bucket_s)
    found = []
    if lb:
        found.append(_chart("Load balancer", "per second", lb, marks, (t0, t1), 1.0))
    if pressure:
        chart = _chart("Memory / KV-cache pressure", RATIO, pressure, marks, (t0, t1),
                       max(1.0, ceiling))  # fmt: skip
        chart.rules = [(_y(value, chart.top), label) for value, label in _rules(series, ceiling)]
        found.append(chart)
    return found


Raw = tuple[str, str, list[list[tuple[float, float]]]]  # label, css class, segments of (t, v)


def _pressure(
    series: Sequence[Mapping[str, Any]], down: list[DownSpan], bucket_s: float
) -> list[Raw]:
    """Return one line per pod and measure (``detail``), broken as the module doc says."""
    rows = [r for r in series if r["metric"] == PRESSURE]
    colour = {pod: f"pod{n % 8}" for n, pod in enumerate(sorted({r["label"] for r in rows}))}
    readings = ((r["label"], r.get("detail") or "", r["time"], r["value"]) for r in rows)
    found: list[Raw] = []
    for line in pressure_lines(readings, down, bucket_s):
        css = " ".join(filter(None, (colour[line.pod], MEASURE_CSS.get(line.detail))))
        segments = [[(t.timestamp(), v) for t, v in seg] for seg in line.segments]
        found.append((f"{line.pod} {line.detail or 'pressure'}", css, segments))
    return found


def _rules(series: Sequence[Mapping[str, Any]], ceiling: float) -> list[tuple[float, str]]:
    """Return (value, label) of the ceilings the readings were judged against (a pre-reserving
    engine's reservation plus margin, per pod), named by their measures ("KV cache ceiling
    95%"); with none in ``series``, the configured ``ceiling``."""
    measures: dict[float, set[str]] = {}
    for r in series:
        if r["metric"] == CEILING:
            measures.setdefault(round(r["value"], 3), set()).add(r.get("detail") or "")
    found = []
    for value, details in sorted(measures.items()) or [(ceiling, set())]:
        named = " / ".join(sorted(d for d in details if d))
        found.append((value, f"{named} ceiling {value:.0%}".lstrip()))
    return found


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
    top = _nice(max([floor, *(v for _, _, segs in raw for pts in segs for _, v in pts)]))
    chart = Chart(title, unit, top=top)
    for label, css, segments in raw:
        xy = tuple(_polyline(seg, t0, t1, top) for seg in segments)
        chart.lines.append(Line(label, css, xy, segments[-1][-1][1]))
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


def _polyline(pts: list[tuple[float, float]], t0: float, t1: float, top: float) -> str:
    """Return ``pts`` as SVG ``x,y`` pairs; a lone point as a 2-unit tick (a polyline of one
    point draws nothing)."""
    xy = [(_x(t, t0, t1), _y(v, top)) for t, v in pts]
    if len(xy) == 1:
        xy = [(xy[0][0] - 1, xy[0][1]), (xy[0][0] + 1, xy[0][1])]
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)


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
