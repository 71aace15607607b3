"""Coerce numbers read from logs, settings and step parameters: None when not a number."""

from __future__ import annotations

import math
from typing import Any


def coerce_int(value: Any) -> int | None:
    """Return ``value`` as an int (from int, integral float or digit string), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    number = coerce_float(value)
    return int(number) if number is not None and number.is_integer() else None


def coerce_float(value: Any) -> float | None:
    """Return ``value`` as a finite float (from a number or numeric string), else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
