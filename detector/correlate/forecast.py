"""The next-victim forecast: which surviving pod's pressure reaches its ceiling, and when (pure).

Per pod, pressure (used/total: GPU memory or KV-cache usage, 0..1) is aligned to a regular grid
of ``GRID_S`` seconds of event time (the highest reading of each bucket, empty buckets dropped,
so a gap in the scrapes is no zero), and a robust linear trend is fitted on the buckets of the
last ``window_s`` seconds: a Huber regression (``huber_trend``), which one spike or one late
scrape does not tilt as least squares would. A pod is at risk when its trend
rises by at least ``MIN_SLOPE_PER_S`` and its line crosses the ceiling within ``horizon_s``
of ``now``; one whose latest bucket is already at or over its ceiling is at risk now (ETA 0).
Flat or falling series, and pods with fewer than ``MIN_SAMPLES`` buckets in the window, are
never named.

The correlator calls ``forecast`` only while an incident of the workload is open, at most
once per ``FORECAST_EVERY_S`` of event time, after new pressure samples; ``to_announce``
keeps the timeline from repeating the same forecast.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

GRID_S: Final = 5.0  # seconds of event time per bucket (the correlator's series buckets too)
FORECAST_EVERY_S: Final = 5.0  # the correlator fits at most this often per incident
# fewer buckets than this in the window: no trend (two points are a line through any noise;
# three are the fewest in which one bad point is outvoted)
MIN_SAMPLES: Final = 3
MIN_SLOPE_PER_S: Final = 1e-4  # a rise slower than 0.6 % of the GPU per minute is flat
REANNOUNCE_MIN_S: Final = 15.0  # an ETA that moved less than this is the same forecast
REANNOUNCE_SHARE: Final = 0.5  # ... or less than this share of the ETA expected by now
HUBER_K: Final = 1.345  # Huber's tuning constant: 95 % efficiency on Gaussian noise
HUBER_ROUNDS: Final = 50  # reweighting rounds at most (a few dozen points converge in ~10)


class PressureSample(NamedTuple):
    """One pressure reading of one pod: ``ratio`` used/total (0..1, may exceed 1) at event
    ``time`` (Unix seconds), judged against ``ceiling``; readings under ``floor`` are left out
    (an engine that reserves VRAM at start: under its reservation it is loading, not pressed).
    """

    time: float
    pod: str
    ratio: float
    ceiling: float
    floor: float = 0.0


@dataclass(frozen=True, slots=True)
class NextVictim:
    """A surviving pod whose pressure reaches its ceiling ``eta_s`` seconds after ``fitted_at``.

    ``ratio`` is the latest bucket's pressure, ``slope_per_s`` the fitted trend (ratio per
    second), ``samples`` the buckets it was fitted on.
    """

    pod: str
    eta_s: float
    fitted_at: float  # event time, Unix seconds
    ratio: float
    ceiling: float
    slope_per_s: float
    samples: int

    @property
    def reaches_at(self) -> float:
        """Return the event time the pod is forecast to reach its ceiling."""
        return self.fitted_at + self.eta_s

    def summary(self) -> str:
        """Return the timeline's line: ``next victim at risk: pod X in ~N s``, or ``..., at its
        ceiling now`` for a pod whose pressure is there already (an ETA under a second)."""
        if self.eta_s < 1.0:
            return f"next victim at risk: pod {self.pod}, at its ceiling now"
        return f"next victim at risk: pod {self.pod} in ~{self.eta_s:.0f} s"


def forecast(
    samples: Iterable[PressureSample], now: float, *, window_s: float, horizon_s: float
) -> list[NextVictim]:
    """Return the pods whose pressure reaches its ceiling within ``horizon_s``, soonest first.

    ``samples``: the recent readings of the surviving pods only (the caller leaves out victims
    and pods that are down); readings after ``now`` or older than ``window_s`` are ignored.
    Times in Unix seconds of event time; ``eta_s`` counts from ``now``. Pure.
    """
    rows = [s for s in samples if now - window_s < s.time <= now and s.ratio >= s.floor]
    if len(rows) < MIN_SAMPLES:
        return []
    found = []
    for pod, buckets in _grid(rows).items():
        times = [bucket - now for bucket in buckets]
        ratios = [ratio for ratio, _ in buckets.values()]
        ceiling = next(reversed(buckets.values()))[1]
        risk = _at_risk(pod, times, ratios, ceiling, now, horizon_s)
        if risk is not None:
            found.append(risk)
    return sorted(found, key=lambda r: (r.eta_s, r.pod))


def _grid(rows: list[PressureSample]) -> dict[str, dict[float, tuple[float, float]]]:
    """Return pod -> bucket start (Unix seconds, oldest first) -> (the highest ratio, the
    ceiling of the last reading) of the readings in each ``GRID_S`` bucket; a bucket no
    reading fell into has no entry: a gap is no reading."""
    grid: dict[str, dict[float, tuple[float, float]]] = {}
    for row in rows:
        buckets = grid.setdefault(row.pod, {})
        bucket = (row.time // GRID_S) * GRID_S
        held = buckets.get(bucket)
        buckets[bucket] = (row.ratio if held is None else max(held[0], row.ratio), row.ceiling)
    return {pod: dict(sorted(buckets.items())) for pod, buckets in sorted(grid.items())}


def _at_risk(
    pod: str, x: list[float], y: list[float], ceiling: float, now: float, horizon_s: float
) -> NextVictim | None:
    """Fit one pod's buckets (``x``: seconds from ``now``, ``y``: ratios, oldest first);
    return its forecast when it is at risk within ``horizon_s``."""
    if len(x) < MIN_SAMPLES:
        return None
    slope, level = huber_trend(x, y)
    latest = y[-1]
    if latest >= ceiling:
        eta = 0.0  # at its ceiling now
    elif slope < MIN_SLOPE_PER_S:
        return None  # flat or falling
    else:
        eta = max(0.0, (ceiling - level) / slope)
    if eta > horizon_s:
        return None
    return NextVictim(pod, round(eta, 1), now, latest, ceiling, slope, len(x))


def huber_trend(x: list[float], y: list[float]) -> tuple[float, float]:
    """Return the robust linear trend of ``y`` over ``x``: (slope per unit of x, level at 0).

    Huber's M-estimator (Huber 1964; ``HUBER_K`` = 1.345 standard deviations: squared loss
    for small residuals, linear for large ones, so one spike or one late scrape does not tilt
    the line as least squares would), fitted by iteratively reweighted least squares with the
    scale re-estimated each round as MAD / 0.6745 (Holland & Welsch 1977; statsmodels' RLM
    with ``HuberT`` and ``scale_est='mad'`` does the same). Starts from least squares; stops
    when the line moves less than 1e-12 or after ``HUBER_ROUNDS`` rounds. Pure Python: a fit
    of a few dozen points costs tens of microseconds and imports nothing.
    ``x`` needs two distinct values; with fewer the slope is 0 and the level the mean of ``y``.
    """
    weights = [1.0] * len(x)
    slope, level = _weighted_line(x, y, weights)
    for _ in range(HUBER_ROUNDS):
        residuals = [yi - (level + slope * xi) for xi, yi in zip(x, y, strict=True)]
        bound = HUBER_K * _median([abs(r) for r in residuals]) / 0.6745
        weights = [1.0 if abs(r) <= bound else bound / abs(r) for r in residuals]
        fitted = _weighted_line(x, y, weights)
        moved = abs(fitted[0] - slope) + abs(fitted[1] - level)
        slope, level = fitted
        if moved < 1e-12:
            break
    return slope, level


def _weighted_line(x: list[float], y: list[float], w: list[float]) -> tuple[float, float]:
    """Return the weighted least-squares line (slope, level at x=0) through the points."""
    total = sum(w)
    if total <= 0.0:
        return 0.0, sum(y) / len(y)
    mx = sum(wi * xi for wi, xi in zip(w, x, strict=True)) / total
    my = sum(wi * yi for wi, yi in zip(w, y, strict=True)) / total
    sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x, strict=True))
    if sxx <= 0.0:
        return 0.0, my
    sxy = sum(wi * (xi - mx) * (yi - my) for wi, xi, yi in zip(w, x, y, strict=True))
    slope = sxy / sxx
    return slope, my - slope * mx


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def to_announce(found: list[NextVictim], last: NextVictim | None) -> NextVictim | None:
    """Return the forecast of ``found`` (soonest first) to put on the timeline, or None.

    ``last`` is the one announced before. Against it, an ETA "moved a lot" when it differs from
    the ETA ``last`` leads to expect by now by more than ``REANNOUNCE_MIN_S`` and
    ``REANNOUNCE_SHARE`` of it. Announced: the soonest when nothing was, when the pod of
    ``last`` is no longer at risk (it died, or its trend flattened), or when it comes a lot
    sooner than ``last``'s pod (close ETAs of two pods do not take turns on the timeline);
    else ``last``'s pod again when its ETA moved a lot (the trend changed) or halved by at
    least ``REANNOUNCE_MIN_S`` (a countdown: 200 s, 100 s, 50 s, 25 s, so that a policy
    waiting for the ETA to come inside a bound hears of it).
    """
    if not found:
        return None
    first = found[0]
    same = next((f for f in found if last is not None and f.pod == last.pod), None)
    if last is None or same is None:
        return first
    expected = max(0.0, last.eta_s - (first.fitted_at - last.fitted_at))
    margin = max(REANNOUNCE_MIN_S, REANNOUNCE_SHARE * expected)
    if first.pod != last.pod and expected - first.eta_s > margin:
        return first
    halved = same.eta_s <= last.eta_s / 2 and last.eta_s - same.eta_s >= REANNOUNCE_MIN_S
    return same if abs(same.eta_s - expected) > margin or halved else None
