"""Field parsing shared by the source parsers: times (ISO-8601, epoch, nginx) and string maps.

Time functions return Unix seconds (float, UTC) or raise ``ParseError("bad_timestamp")``.
"""

from __future__ import annotations

import math
import re
from calendar import timegm
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from detector.errors import ParseError

# Epoch numbers above these bounds are taken as milli-, micro- or nanoseconds.
_MS_FROM = 1e11  # 1e11 s is the year 5138; 1e11 ms is 1973
_US_FROM = 1e14
_NS_FROM = 1e17
# No source these parsers read (Kubernetes, vLLM, dcgm-exporter, ingress-nginx) wrote a record
# before 2014: a number read as ms, us or ns that lands before 2010-01-01 is a wrong unit or a
# wrong field (1e12 is 2001 in milliseconds, and 31,688 years in seconds), not a time.
_SCALED_FLOOR = 1262304000.0  # 2010-01-01T00:00:00Z
_MAX_SECONDS = 253402300799.0  # 9999-12-31T23:59:59Z, the last time datetime can show
# A stamp without a zone is the writer's local time, up to UTC+14:00 ahead of UTC
# (https://www.iana.org/time-zones , Pacific/Kiritimati): the slack of ``not_after``.
ZONE_SLACK_S = 14 * 3600.0
_DAY_S = 86400.0
_LEAP_CYCLE_YEARS = 8  # a 02-29 stamp finds a leap year within 8 years back (1896..1904)

_MONTHS = {
    "Jan": 1,
    "Feb": 2,
    "Mar": 3,
    "Apr": 4,
    "May": 5,
    "Jun": 6,
    "Jul": 7,
    "Aug": 8,
    "Sep": 9,
    "Oct": 10,
    "Nov": 11,
    "Dec": 12,
}
_NGINX_TIME = re.compile(
    r"\[?(\d{2})/([A-Z][a-z]{2})/(\d{4}):(\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})\]?"
)


def parse_iso8601(text: str) -> float:
    """Parse an ISO-8601 / RFC 3339 time ("2022-09-30T09:27:40.954726766Z") to Unix seconds.

    Accepts ``Z`` or numeric offsets, a space instead of ``T`` and any number of fractional
    digits (kept to microseconds); a time without an offset is UTC.
    Format: https://www.rfc-editor.org/rfc/rfc3339 . Raises ``ParseError("bad_timestamp")``.
    """
    try:
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        seconds = parsed.timestamp()
    except (ValueError, OverflowError, TypeError) as exc:
        raise ParseError("bad_timestamp", f"not an ISO-8601 time: {text[:64]!r}") from exc
    if seconds < 0:
        raise ParseError("bad_timestamp", f"time before 1970: {text[:64]!r}")
    return seconds


def parse_epoch(value: float) -> float:
    """Convert an epoch number in seconds, ms, us or ns (told apart by size) to Unix seconds.

    Fluent Bit's ``timestamp_format double`` writes seconds with a fraction; Prometheus
    sample timestamps are milliseconds (https://prometheus.io/docs/instrumenting/exposition_formats/).
    Raises ``ParseError("bad_timestamp")`` for negative, NaN or infinite values, for a time
    after 9999, and for a number that only ms, us or ns would make a time but lands before
    2010 (``_SCALED_FLOOR``: a unit no source of these records writes).
    """
    try:
        seconds = float(value)
    except (OverflowError, TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ParseError("bad_timestamp", f"not an epoch time: {str(value)[:40]}")
    if seconds >= _NS_FROM:
        seconds /= 1e9
    elif seconds >= _US_FROM:
        seconds /= 1e6
    elif seconds >= _MS_FROM:
        seconds /= 1e3
    if seconds > _MAX_SECONDS or (seconds < _SCALED_FLOOR and float(value) >= _MS_FROM):
        raise ParseError(
            "bad_timestamp",
            f"epoch time out of range: {str(value)[:40]} (seconds up to 9999-12-31, or ms, "
            "us or ns from 2010)",
        )
    return seconds


@lru_cache(maxsize=4096)
def parse_nginx_time(text: str) -> float:
    """Parse nginx's ``$time_local`` ("17/Dec/2024:10:00:01 +0000", brackets optional).

    Format: http://nginx.org/en/docs/http/ngx_http_log_module.html#log_format .
    Raises ``ParseError("bad_timestamp")`` (never cached). Cached by the exact text: every
    access line of one second carries the same one, and the regex and ``timegm`` cost ten
    times the lookup.
    """
    m = _NGINX_TIME.fullmatch(text)
    month = _MONTHS.get(m.group(2)) if m else None
    if m is None or month is None:
        raise ParseError("bad_timestamp", f"not an nginx time: {text[:64]!r}")
    day, year, hour, minute, second = (int(m.group(i)) for i in (1, 3, 4, 5, 6))
    if not (1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        raise ParseError("bad_timestamp", f"not an nginx time: {text[:64]!r}")
    offset_s = int(m.group(8)) * 3600 + int(m.group(9)) * 60
    if m.group(7) == "-":
        offset_s = -offset_s
    return float(timegm((year, month, day, hour, minute, second)) - offset_s)


def parse_time(value: Any) -> float:
    """Parse a JSON time value: an ISO-8601 string, an epoch number, or a numeric string.

    Raises ``ParseError("bad_timestamp")`` for anything else (null, bool, object ...).
    """
    if isinstance(value, str):
        if value[4:5] == "-":  # the common case: "2022-09-30T..."
            return parse_iso8601(value)
        try:
            number = float(value)
        except ValueError:
            return parse_iso8601(value)
        return parse_epoch(number)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return parse_epoch(value)
    raise ParseError("bad_timestamp", f"not a time value: {type(value).__name__}")


def complete_month_day(
    stamp: tuple[int, int, int, int, int, float], *, near: float, not_after: float
) -> float:
    """Return the Unix time of a year-less (month, day, hour, minute, second, fraction) stamp.

    The year is the one that puts the stamp nearest ``near`` (the stream's own dated records)
    among those not after ``not_after`` + ``ZONE_SLACK_S`` (the file's modification time or the
    wall clock: a log line is written before its file); when none is, the latest year that
    keeps it at or before ``not_after``. So ``05-01`` read against 2026-12-01 is 2026-05-01,
    against 2026-03-01 2025-05-01. Stamps without a zone are taken as UTC.
    Raises ``ParseError("bad_timestamp")`` for a month-day no year has or a time before 1970.
    """
    bound = not_after + ZONE_SLACK_S
    near_year = _year_of(near)
    best: float | None = None
    for year in (near_year - 1, near_year, near_year + 1):
        seconds = _utc(year, stamp)
        closer = best is None or (seconds is not None and abs(seconds - near) < abs(best - near))
        if seconds is not None and seconds <= bound and closer:
            best = seconds
    if best is None:
        top = _year_of(bound)
        for year in range(top, top - _LEAP_CYCLE_YEARS - 1, -1):
            best = _utc(year, stamp)
            if best is not None and best <= bound:
                break
            best = None
    if best is None or best < 0:
        month, day, hour, minute = stamp[:4]
        raise ParseError("bad_timestamp", f"not a date: {month:02d}-{day:02d} {hour}:{minute}")
    return best


def complete_time_of_day(seconds_of_day: float, *, near: float, not_after: float) -> float:
    """Return the Unix time of a date-less time of day (seconds after midnight, UTC).

    The day is the one nearest ``near`` among those not after ``not_after`` +
    ``ZONE_SLACK_S``, else the latest one at or before it (as ``complete_month_day``).
    """
    bound = not_after + ZONE_SLACK_S
    midnight = near - near % _DAY_S
    candidates = [midnight + k * _DAY_S + seconds_of_day for k in (-1, 0, 1)]
    allowed = [t for t in candidates if t <= bound]
    if allowed:
        best = min(allowed, key=lambda t: abs(t - near))
    else:
        best = bound - bound % _DAY_S + seconds_of_day
        if best > bound:
            best -= _DAY_S
    return max(best, 0.0)


def _year_of(seconds: float) -> int:
    """Return the UTC year of a Unix time, clamped to what ``datetime`` can show."""
    if not seconds < _MAX_SECONDS:  # also NaN
        return 9999
    return datetime.fromtimestamp(max(seconds, 0.0), UTC).year


def _utc(year: int, stamp: tuple[int, int, int, int, int, float]) -> float | None:
    """Return the Unix time of ``stamp`` in ``year``, or None when that year has no such day."""
    month, day, hour, minute, second, fraction = stamp
    if not 1 <= year <= 9999:
        return None
    try:
        moment = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
    return moment.timestamp() + fraction


def str_map(value: Any) -> dict[str, str]:
    """Return a JSON object of string values (Kubernetes labels) as a dict; drop other values.

    Returns the object itself when it is already clean (no copy), ``{}`` for a non-object.
    """
    if not isinstance(value, dict):
        return {}
    for key, item in value.items():
        if not isinstance(item, str) or not isinstance(key, str):
            return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
    return value


def str_or_none(value: Any) -> str | None:
    """Return a non-empty string as is; anything else (null, "", numbers, objects) as None."""
    return value if isinstance(value, str) and value else None


def first_time(record: dict[str, Any], keys: tuple[str, ...], default_time: float | None) -> float:
    """Parse the first of ``keys`` present (not null) in ``record``, else ``default_time``.

    Raises ``ParseError("bad_timestamp")`` for an unparseable value and
    ``ParseError("missing_field")`` when no key is present and there is no default.
    """
    for key in keys:
        value = record.get(key)
        if value is not None:
            if type(value) is float and 0.0 <= value < _MS_FROM:
                return value  # seconds already: what parse_time returns for it, per record
            return parse_time(value)
    if default_time is None:
        raise ParseError("missing_field", f"no time field ({', '.join(keys)})")
    return default_time


def first_label(labels: dict[str, str], keys: tuple[str, ...]) -> str | None:
    """Return the first non-empty value of ``keys`` in ``labels``, or None."""
    for key in keys:
        value = labels.get(key)
        if value:
            return value
    return None
