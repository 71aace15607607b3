"""The next-victim forecast: which surviving pod's pressure reaches its ceiling, and when (pure).

Per pod, pressure (used/total: GPU memory or KV-cache usage, 0..1) is aligned to a regular grid
of ``GRID_S`` seconds of event time (the highest reading of each bucket, empty buckets dropped,
so a gap in the scrapes is no zero), and a robust linear trend is fitted on the buckets of the
last ``window_s`` seconds: a Huber regression (scikit-learn ``HuberRegressor``,
https://scikit-learn.org/stable/modules/linear_model.html#huber-regression), which one spike
or one late scrape does not tilt as least squares would. A pod is at risk when its trend
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
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:  # annotations only: numpy comes with pandas, imported on the first forecast
    import numpy as np

GRID_S: Final = 5.0  # seconds of event time per bucket (the correlator's series buckets too)
FORECAST_EVERY_S: Final = 5.0  # the correlator fits at most this often per incident
# fewer buckets than this in the window: no trend (two points are a line through any noise;
# three are the fewest in which one bad point is outvoted)
MIN_SAMPLES: Final = 3
MIN_SLOPE_PER_S: Final = 1e-4  # a rise slower than 0.6 % of the GPU per minute is flat
REANNOUNCE_MIN_S: Final = 15.0  # an ETA that moved less than this is the same forecast
REANNOUNCE_SHARE: Final = 0.5  # ... or less than this share of the ETA expected by now


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
    # pandas and scikit-learn take about a second to import: imported here, on the first
    # forecast (an open incident), so that `detector --help` and a record's path never pay it
    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(PressureSample._fields))
    frame["bucket"] = (frame["time"] // GRID_S) * GRID_S  # the start of its grid bucket
    # the highest reading of each (pod, bucket); a bucket no scrape fell into has no row: a
    # gap is no reading (a groupby on the grid: 4x cheaper than groupby().resample())
    grid = frame.groupby(["pod", "bucket"], sort=True).agg(
        ratio=("ratio", "max"), ceiling=("ceiling", "last")
    )
    # threadpoolctl comes with scikit-learn: a fit of a few dozen points gains nothing from
    # BLAS threads, and on a small machine they contend (measured: 2.6 ms a fit on one thread,
    # 25-100 ms with the default pool on 2 cores)
    from threadpoolctl import threadpool_limits

    found = []
    with threadpool_limits(limits=1):
        for pod, buckets in grid.groupby(level="pod"):
            times = buckets.index.get_level_values("bucket").to_numpy(dtype=float) - now
            ratios = buckets["ratio"].to_numpy(dtype=float)
            ceiling = float(buckets["ceiling"].iloc[-1])
            risk = _at_risk(str(pod), times, ratios, ceiling, now, horizon_s)
            if risk is not None:
                found.append(risk)
    return sorted(found, key=lambda r: (r.eta_s, r.pod))


def _at_risk(
    pod: str, x: np.ndarray, y: np.ndarray, ceiling: float, now: float, horizon_s: float
) -> NextVictim | None:
    """Fit one pod's buckets (``x``: seconds from ``now``, ``y``: ratios, oldest first);
    return its forecast when it is at risk within ``horizon_s``."""
    if len(x) < MIN_SAMPLES:
        return None
    slope, level = _trend(x, y)
    latest = float(y[-1])
    if latest >= ceiling:
        eta = 0.0  # at its ceiling now
    elif slope < MIN_SLOPE_PER_S:
        return None  # flat or falling
    else:
        eta = max(0.0, (ceiling - level) / slope)
    if eta > horizon_s:
        return None
    return NextVictim(pod, round(eta, 1), now, latest, ceiling, slope, len(x))


def _trend(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Return the robust linear trend of ``y`` over ``x`` (seconds): (slope per s, level at 0).

    Huber's loss (scikit-learn ``HuberRegressor``, epsilon 1.35: squared for small residuals,
    linear for large ones) keeps one spike or one late scrape from tilting the line; a solver
    that does not converge falls back to least squares.
    """
    import numpy as np
    from sklearn.linear_model import HuberRegressor  # imported on the first forecast: above

    if float(y.max() - y.min()) < 1e-9:
        return 0.0, float(y[-1])  # constant: nothing to fit (and no solver converges on it)
    minutes = x / 60.0  # slope and level of one order for the solver
    try:
        model = HuberRegressor(max_iter=1000).fit(minutes.reshape(-1, 1), y)
    except ValueError:  # "HuberRegressor convergence failed": L-BFGS-B stopped abnormally
        slope, level = np.polyfit(minutes, y, 1)
        return float(slope) / 60.0, float(level)
    return float(model.coef_[0]) / 60.0, float(model.intercept_)


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


def preload() -> None:
    """Import pandas and scikit-learn now (about a second), not on an incident's first forecast.

    For a long-running process (``detector run``) at start: the first forecast comes when an
    incident opens, when detection latency counts. Replays and tests need not call it.
    """
    import pandas  # noqa: F401
    import sklearn.linear_model  # noqa: F401
    import threadpoolctl  # noqa: F401
