"""Draw an incident's plots for the postmortem as SVG text, with matplotlib (pure, deterministic).

From the same frame the analysis uses: ``series`` has one row per bucket and series, columns
``time`` (bucket start, UTC), ``metric``, ``label``, ``value``, ``detail``
(``detector.report.series.load_series``; semantics in ``detector.correlate.series``):

- ``requests``, ``errors_5xx``, ``shed_429``: responses per ``bucket_s`` bucket at the load
  balancer, label ``""``; drawn as rates per second (value / ``bucket_s``);
- ``pressure``: per pod (label), the highest used/total ratio of the bucket, detail
  ``KV cache`` or ``GPU memory``; ``ceiling``: the ratio it was judged against. Drawn as %,
  one line per pod and measure (a pod's colour; GPU memory dashed), in segments broken while
  the pod was down and where its readings stopped: ``detector.report.pressure``'s rule, the
  one the web page's chart draws by.

``markers`` are ``(time, kind, label)`` with kind ``death``, ``stage`` or ``step``; ``down``
the incident's down spans ``(pod, death, ready again or None)``
(``detector.report.now.down_spans``).

Determinism: the same input gives the same bytes. Every figure is a ``matplotlib.figure.Figure``
(no pyplot, no global figure registry), drawn under matplotlib's default style with fixed
overrides (``svg.hashsalt``, bundled DejaVu Sans, glyphs as paths) and saved without a date
(https://matplotlib.org/stable/users/explain/customizing.html, ``savefig(metadata=...)`` in
https://matplotlib.org/stable/api/backend_svg_api.html). The style is applied with
``rc_context``, which swaps the process-wide ``rcParams`` for the duration of a call: render from
one thread at a time. Labels from the input (pod names, marker labels) are data: control
characters are shown as escapes (``detector.textsafe``) and ``$`` never starts mathtext
(``text.parse_math`` off).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

import matplotlib
import matplotlib.dates as mdates
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from detector.correlate.series import (
    CEILING,
    ERRORS_5XX,
    GPU_MEMORY,
    PRESSURE,
    REQUESTS,
    SERIES_BUCKET_S,
    SHED_429,
)
from detector.report.pressure import DownSpan, pressure_lines
from detector.textsafe import printable

__all__ = [
    "PRESSURE_FILE",
    "PRESSURE_TITLE",
    "TRAFFIC_FILE",
    "TRAFFIC_TITLE",
    "Marker",
    "describe",
    "pressure_plot",
    "traffic_plot",
]

Marker = tuple[datetime, str, str]  # (time, kind: death | stage | step, label)

TRAFFIC_TITLE: Final = "Load balancer: requests, 5xx and shed (429/413) per second"
PRESSURE_TITLE: Final = "Memory / KV-cache pressure per pod"
TRAFFIC_FILE: Final = "traffic.svg"
PRESSURE_FILE: Final = "pressure.svg"
NO_DATA: Final = "no data recorded"

# metric, legend label, colour
_LB: Final = (
    (REQUESTS, "requests/s", "#1f77b4"),
    (ERRORS_5XX, "5xx/s", "#d62728"),
    (SHED_429, "shed 429/413 /s", "#ff7f0e"),
)
# kind -> legend label, colour, line style
_MARKS: Final = {
    "death": ("death", "#d62728", "--"),
    "stage": ("stage change", "#7f7f7f", ":"),
    "step": ("step applied/lifted", "#2ca02c", "-."),
}
_POD_COLOURS: Final = ("#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
_LineStyle = str | tuple[int, tuple[int, int]]  # matplotlib's: "-", or (offset, (on, off))
_GPU_MEMORY_DASHES: Final[_LineStyle] = (0, (6, 3))  # as the web chart's gpu-memory line
_SIZE_IN: Final = (10.0, 4.0)  # inches
_EMPTY_SIZE_IN: Final = (5.0, 1.2)
_DPI: Final = 100


def traffic_plot(
    series: pd.DataFrame, markers: Sequence[Marker], *, bucket_s: float = SERIES_BUCKET_S
) -> str:
    """Return SVG text of the load balancer's request, 5xx and 429 rates per second over time.

    ``series``: the incident's frame (module docstring); rows of other metrics are ignored.
    ``markers``: every kind is drawn as a vertical line (deaths red dashed). A frame without
    load-balancer rows gives a small SVG saying "no data recorded".
    """
    lines = _traffic_lines(series, bucket_s)
    if not lines:
        return _no_data(TRAFFIC_TITLE)
    with _style():
        fig, ax = _figure(TRAFFIC_TITLE, "per second")
        for line in lines:
            _draw_line(ax, line)
        _draw_markers(ax, markers)
        ax.set_ylim(bottom=0)
        return _finish(fig, ax)


def pressure_plot(
    series: pd.DataFrame,
    markers: Sequence[Marker],
    down: Iterable[DownSpan] = (),
    *,
    bucket_s: float = SERIES_BUCKET_S,
) -> str:
    """Return SVG text of each pod's pressure (used/total, %) with its ceilings and the deaths.

    One line per pod and measure, labelled ``pod (KV cache|GPU memory)`` and broken over the
    ``down`` spans and the gaps in its readings (module docstring); one dashed horizontal line
    per distinct ``ceiling`` value (to 0.1 %). Only ``death`` markers are drawn. A frame
    without pressure rows gives a small SVG saying "no data recorded".
    """
    lines = _pressure_lines(series, down, bucket_s)
    if not lines:
        return _no_data(PRESSURE_TITLE)
    with _style():
        fig, ax = _figure(PRESSURE_TITLE, "used / total (%)")
        for line in lines:
            _draw_line(ax, line)
        for percent in _ceilings(series):
            ax.axhline(percent, color="#000000", linestyle="--", linewidth=1.0,
                       label=f"ceiling {percent:g}%")  # fmt: skip
        _draw_markers(ax, [m for m in markers if m[1] == "death"])
        top = max([100.0, *_ceilings(series), *(float(line.values().max()) for line in lines)])
        ax.set_ylim(0, top * 1.05)
        return _finish(fig, ax)


def describe(
    series: pd.DataFrame,
    markers: Sequence[Marker],
    down: Iterable[DownSpan] = (),
    *,
    bucket_s: float = SERIES_BUCKET_S,
) -> list[dict[str, Any]]:
    """Return a machine description of both plots for the JSON export.

    One dict per plot: ``title``, ``file`` (``traffic.svg``, ``pressure.svg``), ``unit``,
    ``series`` (``name``, ``metric``, ``label``, ``detail``, ``points``, ``segments`` (the
    pieces it is drawn in), ``min``, ``max`` in the unit drawn), ``markers`` (how many drawn)
    and, for pressure, ``ceilings`` (%): what ``traffic_plot`` and ``pressure_plot`` draw with
    the same ``down`` and ``bucket_s``.
    """
    traffic = [_series_info(line) for line in _traffic_lines(series, bucket_s)]
    pressure = [_series_info(line) for line in _pressure_lines(series, down, bucket_s)]
    return [
        {"title": TRAFFIC_TITLE, "file": TRAFFIC_FILE, "unit": "per second",
         "series": traffic, "markers": len(markers) if traffic else 0},
        {"title": PRESSURE_TITLE, "file": PRESSURE_FILE, "unit": "percent",
         "series": pressure, "ceilings": _ceilings(series) if pressure else [],
         "markers": sum(1 for m in markers if m[1] == "death") if pressure else 0},
    ]  # fmt: skip


# -- the frames' lines -------------------------------------------------------------------------


class _Line(NamedTuple):
    """One series as drawn: ``segments`` of (times as naive UTC ``datetime64``, values in the
    plot's unit), each one polyline; ``dashes`` a matplotlib line style."""

    name: str
    metric: str
    label: str
    detail: str
    colour: str
    segments: tuple[tuple[np.ndarray, np.ndarray], ...]
    dashes: _LineStyle = "-"

    def values(self) -> np.ndarray:
        """Return every value drawn, in time order."""
        return np.concatenate([values for _, values in self.segments])


def _traffic_lines(series: pd.DataFrame, bucket_s: float) -> list[_Line]:
    """Return one line of rates per second per load-balancer metric with rows."""
    if not len(series):
        return []
    found = []
    for metric, name, colour in _LB:
        rows = _sorted(series[(series["metric"] == metric) & (series["label"] == "")])
        if len(rows):
            values = rows["value"].to_numpy(dtype=float) / bucket_s
            segment = (_times(rows["time"]), values)
            found.append(_Line(name, metric, "", "", colour, (segment,)))
    return found


def _pressure_lines(series: pd.DataFrame, down: Iterable[DownSpan], bucket_s: float) -> list[_Line]:
    """Return one line of pressure (%) per pod and measure, named ``pod (detail)``, by pod
    then measure; a pod keeps its colour across measures."""
    if not len(series):
        return []
    rows = series[series["metric"] == PRESSURE]
    details = [d if isinstance(d, str) else "" for d in rows["detail"]]
    times = pd.to_datetime(rows["time"], utc=True)  # a naive time is UTC
    readings = zip(rows["label"].astype(str), details, times, rows["value"], strict=True)
    pods = sorted({str(p) for p in rows["label"]})
    found = []
    for line in pressure_lines(readings, down, bucket_s):
        detail = line.detail or "pressure"
        name = _legend(f"{printable(line.pod, one_line=True)} ({printable(detail, one_line=True)})")
        colour = _POD_COLOURS[pods.index(line.pod) % len(_POD_COLOURS)]
        segments = tuple(
            (_times(pd.Series([t for t, _ in seg])), np.array([v * 100.0 for _, v in seg]))
            for seg in line.segments
        )
        dashes = _GPU_MEMORY_DASHES if line.detail == GPU_MEMORY else "-"
        found.append(_Line(name, PRESSURE, line.pod, line.detail, colour, segments, dashes))
    return found


def _legend(name: str) -> str:
    """Return ``name`` as a legend label: matplotlib hides labels that start with "_"."""
    return f" {name}" if name.startswith("_") else name


def _ceilings(series: pd.DataFrame) -> list[float]:
    """Return the distinct ceilings judged against, in %, to 0.1 %, ascending."""
    if not len(series):
        return []
    values = series.loc[series["metric"] == CEILING, "value"].to_numpy(dtype=float)
    return sorted({round(float(v) * 100.0, 1) for v in values})


def _sorted(rows: pd.DataFrame) -> pd.DataFrame:
    """Return ``rows`` ordered by time (a stable sort: equal times keep their order)."""
    return rows.sort_values("time", kind="stable")


def _times(column: pd.Series) -> np.ndarray:
    """Return a time column as naive UTC ``datetime64[ns]`` (a naive input is taken as UTC)."""
    utc = pd.to_datetime(column, utc=True)
    return utc.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")


def _when(moment: datetime) -> float:
    """Return a marker's time as a matplotlib date number (naive is taken as UTC)."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return float(mdates.date2num(aware.astimezone(UTC).replace(tzinfo=None)))


def _series_info(line: _Line) -> dict[str, Any]:
    """Return one drawn series' description: points and the range of the values drawn."""
    return {
        "name": line.name,
        "metric": line.metric,
        "label": line.label,
        "detail": line.detail,
        "points": len(line.values()),
        "segments": len(line.segments),
        "min": round(float(line.values().min()), 6),
        "max": round(float(line.values().max()), 6),
    }


# -- drawing -----------------------------------------------------------------------------------


@contextmanager
def _style() -> Iterator[None]:
    """Draw under matplotlib's default style and the fixed overrides; no glyph warnings.

    A pod name with a character DejaVu Sans lacks draws a box; matplotlib's warning about it
    is silenced here (the label is data, not a fault of the drawing).
    """
    with (
        matplotlib.style.context("default"),
        matplotlib.rc_context(
            {
                "svg.hashsalt": "detector-postmortem",  # ids of clip paths: no random salt
                "svg.fonttype": "path",  # glyphs as paths: the same drawing in any viewer
                "font.family": ["DejaVu Sans"],  # bundled with matplotlib: no system font lookup
                "text.parse_math": False,  # "$" in a pod name is a dollar sign
                "text.usetex": False,
                "timezone": "UTC",
                "figure.dpi": _DPI,
                "savefig.dpi": _DPI,
                "path.simplify": False,
            }
        ),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        yield


def _figure(title: str, unit: str) -> tuple[Figure, Axes]:
    """Return a fixed-size figure and its axes with the title, labels and a UTC time axis."""
    fig = Figure(figsize=_SIZE_IN, dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel("UTC")
    ax.set_ylabel(unit)
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=UTC))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
    ax.grid(True, color="#e0e0e0", linewidth=0.6)
    return fig, ax


def _draw_line(ax: Axes, line: _Line) -> None:
    """Draw ``line``'s segments, each a polyline (a lone reading a dot); the first carries the
    legend's entry, so that a line has one however many segments it is drawn in."""
    for n, (times, values) in enumerate(line.segments):
        ax.plot(times, values, label=None if n else line.name, color=line.colour,
                linestyle=line.dashes, linewidth=1.4, marker="o" if len(values) == 1 else "",
                markersize=3)  # fmt: skip


def _draw_markers(ax: Axes, markers: Sequence[Marker]) -> None:
    """Draw each marker as a vertical line with its label; one legend entry per kind."""
    seen: set[str] = set()
    for moment, kind, label in sorted(markers, key=lambda m: (_when(m[0]), m[1], m[2])):
        legend, colour, style = _MARKS.get(kind, (kind, "#7f7f7f", ":"))
        x = _when(moment)
        entry = None if kind in seen else _legend(printable(legend, one_line=True))
        ax.axvline(x, color=colour, linestyle=style, linewidth=1.0, label=entry)
        seen.add(kind)
        ax.annotate(printable(label, one_line=True), xy=(x, 0.98),
                    xycoords=ax.get_xaxis_transform(), xytext=(-2, 0),
                    textcoords="offset points", rotation=90, va="top", ha="right",
                    fontsize=7, color=colour, parse_math=False)  # fmt: skip


def _finish(fig: Figure, ax: Axes) -> str:
    """Add the legend outside the axes and return the figure as SVG text."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return _svg(fig)


def _no_data(title: str) -> str:
    """Return a small SVG with the title and "no data recorded"."""
    with _style():
        fig = Figure(figsize=_EMPTY_SIZE_IN, dpi=_DPI)
        fig.text(0.02, 0.7, title, fontsize=10, va="center")
        fig.text(0.02, 0.3, NO_DATA, fontsize=10, va="center", color="#7f7f7f")
        return _svg(fig)


def _svg(fig: Figure) -> str:
    """Return ``fig`` as SVG text, without a date (deterministic bytes)."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()
