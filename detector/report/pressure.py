"""An incident's pressure as lines to draw, for every face that draws it: the web page's
charts (``detector.web.charts``) and the postmortem's plots (``detector.postmortem.plots``).

Pure. A pressure reading (``detector.report.series``, metric ``pressure``) is a pod's highest
used/total ratio in one bucket, its ``detail`` naming the measure: "GPU memory" (the
framebuffer: dcgm-exporter, nvidia-smi, NVML) or "KV cache" (the engine's KV-cache usage).
They are different quantities: a line is one pod and one measure, never two measures merged.
A line is drawn in segments, broken:

- over each span its pod was down (``detector.report.now.down_spans``: pod, death, ready again
  or None): from the death to its first reading after it is ready again. A reading whose
  bucket starts after the death and ends by the readiness is not drawn; with no readiness
  recorded after the death, the break runs to the pod's next reading;
- wherever two consecutive readings are more than ``MAX_GAP_INTERVALS`` of the line's own
  interval apart (the median spacing of its readings not across a death, at least one
  bucket): a scrape that stopped is not drawn as a straight line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from statistics import median
from typing import TypeVar

MAX_GAP_INTERVALS = 3  # a pressure line breaks where readings are further apart than this
DownSpan = tuple[str, datetime, datetime | None]  # pod, death, ready again (None: not seen)
Reading = tuple[str, str, datetime, float]  # pod, detail (the measure), bucket start, value
Point = tuple[datetime, float]  # bucket start, value
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PressureLine:
    """One pod's readings of one measure (``detail``; "" when the rows name none), split into
    ``segments`` of (bucket start, value) in time order, each drawn as one polyline."""

    pod: str
    detail: str
    segments: tuple[tuple[Point, ...], ...]

    @property
    def points(self) -> int:
        """Return how many readings are drawn."""
        return sum(len(segment) for segment in self.segments)


def pressure_lines(
    readings: Iterable[Reading], down: Iterable[DownSpan], bucket_s: float
) -> list[PressureLine]:
    """Return one line per pod and measure, by pod then measure, broken as the module doc says.

    ``readings``: (pod, detail, bucket start, used/total) of the ``pressure`` rows; a naive
    time is taken as UTC. ``down``: the incident's down spans. ``bucket_s``: the series'
    bucket, seconds. A line whose every reading falls inside a down span is left out.
    """
    spans = [
        (pod, _seconds(death), None if up is None else _seconds(up)) for pod, death, up in down
    ]
    by_line: dict[tuple[str, str], list[tuple[float, Point]]] = {}
    for pod, detail, time, value in readings:
        point = (time, float(value))
        by_line.setdefault((pod, detail or ""), []).append((_seconds(time), point))
    found = []
    for (pod, detail), pts in sorted(by_line.items()):
        pts.sort(key=lambda p: (p[0], p[1][1]))
        mine = [(death, up) for p, death, up in spans if p == pod]
        cut = segments(pts, mine, bucket_s)
        if cut:
            found.append(PressureLine(pod, detail, tuple(tuple(pt for _, pt in s) for s in cut)))
    return found


def segments(
    pts: Sequence[tuple[float, T]], spans: Sequence[tuple[float, float | None]], bucket_s: float
) -> list[list[tuple[float, T]]]:
    """Split one line's (bucket start in Unix seconds, value) points, in time order, at its
    pod's down spans (death, ready again or None; Unix seconds) and at gaps over
    ``MAX_GAP_INTERVALS`` of its interval (the module doc's rule); no points, no segment."""
    kept = [
        (t, v) for t, v in pts
        if not any(death < t and up is not None and t + bucket_s <= up for death, up in spans)
    ]  # fmt: skip
    deaths = [death for death, _ in spans]
    pairs = list(pairwise(kept))
    died = [any(a[0] <= d < b[0] for d in deaths) for a, b in pairs]
    steps = [b[0] - a[0] for (a, b), dead in zip(pairs, died, strict=True) if not dead]
    max_gap_s = MAX_GAP_INTERVALS * max(bucket_s, median(steps) if steps else bucket_s)
    found: list[list[tuple[float, T]]] = [kept[:1]] if kept else []
    for (a, b), dead in zip(pairs, died, strict=True):
        if dead or b[0] - a[0] > max_gap_s:
            found.append([])
        found[-1].append(b)
    return found


def _seconds(moment: datetime) -> float:
    """Return ``moment`` in Unix seconds; a naive time is taken as UTC."""
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()
