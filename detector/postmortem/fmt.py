"""The one way the postmortem writes numbers and times (pure): ISO 8601 UTC, ``HH:MM:SS``,
rounded JSON-stable floats, durations."""

from __future__ import annotations

import math
from datetime import datetime

import pandas as pd


def iso(ts: pd.Timestamp | datetime | None) -> str | None:
    """Return ``ts`` as ISO 8601 UTC ending in ``Z`` (microseconds only when not zero)."""
    if ts is None or (isinstance(ts, float) and math.isnan(ts)) or pd.isna(ts):
        return None
    t = pd.Timestamp(ts).tz_convert("UTC")
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if t.microsecond else "%Y-%m-%dT%H:%M:%SZ")


def hms(ts: pd.Timestamp | datetime) -> str:
    """Return ``ts`` as ``HH:MM:SS`` UTC."""
    return pd.Timestamp(ts).tz_convert("UTC").strftime("%H:%M:%S")


def num(value: float, digits: int = 2) -> float:
    """Return ``value`` rounded to ``digits`` (a JSON-stable float; -0.0 becomes 0.0)."""
    return round(float(value), digits) + 0.0


def duration(seconds: float) -> str:
    """Return ``seconds`` as ``3 min 23 s`` (whole seconds) or ``45 s``."""
    total = round(seconds)
    minutes, rest = divmod(total, 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"
