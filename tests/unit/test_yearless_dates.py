"""Dates without a year (vLLM ``ERROR 05-01 14:39:06``, klog) and gzip files, read in a replay.

The vLLM lines are real: https://github.com/noonghunna/club-3090/issues/16 (a vLLM V1 engine
log, ``tests/unit/fixtures/vllm_yearless_oom.log``).
"""

from __future__ import annotations

import gzip
import json
import os
from calendar import timegm
from datetime import UTC, datetime
from pathlib import Path

import pytest

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import SignalKind, SourcePos
from detector.events.sources.raw_text import LogIdentity
from detector.events.sources.timeparse import (
    ZONE_SLACK_S,
    complete_month_day,
    complete_time_of_day,
)
from detector.pipeline import Parsed, merged, parse_stream

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_yearless_oom.log"
IDENTITY = LogIdentity("llm", "vllm-0", "vllm")
OOM_AT = (5, 1, 14, 39, 6, 0.0)  # the OOM line's 05-01 14:39:06


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("stamp", "near", "not_after", "expected"),
    [
        (OOM_AT, "2026-12-01", "2026-12-01", "2026-05-01T14:39:06"),  # the issue: not 2027
        (OOM_AT, "2026-03-01", "2026-03-01", "2025-05-01T14:39:06"),
        (OOM_AT, "2024-05-01T14:00:00", "2026-12-01", "2024-05-01T14:39:06"),  # the stream's year
        (OOM_AT, "2027-06-01", "2026-12-01", "2026-05-01T14:39:06"),  # near is past the bound
        ((1, 1, 0, 0, 1, 0.0), "2025-12-31T23:59:59", "2026-01-02", "2026-01-01T00:00:01"),
        ((12, 31, 23, 59, 59, 0.0), "2026-01-01T00:00:01", "2026-01-02", "2025-12-31T23:59:59"),
        ((2, 29, 12, 0, 0, 0.0), "2026-12-01", "2026-12-01", "2024-02-29T12:00:00"),
        ((12, 1, 10, 0, 0, 0.5), "2026-12-01T01:00", "2026-12-01T01:00", "2026-12-01T10:00:00.5"),
    ],
)
def test_the_year_is_the_nearest_that_is_not_after_the_file(
    stamp: tuple[int, int, int, int, int, float], near: str, not_after: str, expected: str
) -> None:
    got = complete_month_day(stamp, near=utc(near), not_after=utc(not_after))
    assert got == utc(expected)


def test_a_date_no_year_has_is_a_bad_timestamp() -> None:
    with pytest.raises(ParseError) as err:
        complete_month_day((2, 30, 0, 0, 0, 0.0), near=utc("2026-12-01"), not_after=1e10)
    assert err.value.reason == "bad_timestamp"


@pytest.mark.parametrize(
    ("near", "not_after", "expected"),
    [
        ("2026-12-01T10:00", "2026-12-01T10:00", "2026-12-01T09:00:01"),
        ("2026-12-01T00:30", "2026-12-01T00:30", "2026-11-30T23:30:01"),
        ("2026-12-03T09:00", "2026-12-01T00:30", "2026-11-30T23:30:01"),  # not after the file
    ],
)
def test_a_time_of_day_is_never_after_the_file(near: str, not_after: str, expected: str) -> None:
    seconds = 23 * 3600 + 30 * 60 + 1 if expected.endswith("23:30:01") else 9 * 3600 + 1
    got = complete_time_of_day(seconds, near=utc(near), not_after=utc(not_after))
    assert got == utc(expected)


def test_parse_record_never_puts_a_yearless_line_after_its_default_time() -> None:
    line = FIXTURE.read_text().splitlines()[0]
    (sig,) = parse_record(
        line, SourcePos("k", 1), default_time=utc("2026-12-01"), identity=IDENTITY
    )
    assert sig.kind is SignalKind.GPU_OOM and sig.time == utc("2026-05-01T14:39:06")


def _stream(lines: list[bytes], start_time: float) -> list[Parsed]:
    records = [(SourcePos("f", i), raw) for i, raw in enumerate(lines, start=1)]
    return list(parse_stream(records, start_time=start_time, identity=IDENTITY))


@pytest.mark.parametrize(("mtime", "year"), [("2026-12-01", 2026), ("2026-03-01", 2025)])
def test_a_copied_vllm_log_keeps_its_date_the_oom_line_included(mtime: str, year: int) -> None:
    parsed = _stream(FIXTURE.read_bytes().splitlines(), utc(mtime))
    assert [p.error for p in parsed] == [None] * len(parsed)
    (oom,) = [s for p in parsed for s in p.signals if s.kind is SignalKind.GPU_OOM]
    assert oom.time == timegm((year, 5, 1, 14, 39, 6))


def test_a_yearless_line_after_a_dated_envelope_line_takes_its_year() -> None:
    envelope = {"log": "INFO starting\n", "stream": "stderr", "time": "2024-05-01T14:38:00Z"}
    oom = FIXTURE.read_bytes().splitlines()[0]
    parsed = _stream([json.dumps(envelope).encode(), oom], utc("2026-12-01"))
    assert [p.error for p in parsed] == [None, None]
    assert parsed[1].signals[0].time == utc("2024-05-01T14:39:06")


def test_a_year_rolls_over_within_a_stream() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    stamps = ("12-31 23:59:59", "01-01 00:00:01", "05-01 14:39:06")
    lines = [f"ERROR {stamp} [core.py:1131] {oom}".encode() for stamp in stamps]
    parsed = _stream(lines, utc("2026-06-01"))
    expected = ("2025-12-31T23:59:59", "2026-01-01T00:00:01", "2026-05-01T14:39:06")
    assert [p.signals[0].time for p in parsed] == [utc(t) for t in expected]


def test_a_stream_without_a_dated_record_takes_the_file_year() -> None:
    lines = [b"INFO 12-31 23:59:59 [core.py:1] last", FIXTURE.read_bytes().splitlines()[0]]
    parsed = _stream(lines, utc("2026-06-01"))
    assert parsed[1].signals[0].time == utc("2026-05-01T14:39:06")


def _expected_oom_time(now: float) -> float:
    """The OOM line's true time read now: this year's 05-01, else last year's."""
    year = datetime.fromtimestamp(now, UTC).year
    this_year = timegm((year, 5, 1, 14, 39, 6))
    return float(this_year if this_year <= now + ZONE_SLACK_S else timegm((year - 1, *OOM_AT[:5])))


@pytest.mark.parametrize("compress", [False, True])
def test_a_fresh_file_plain_or_gzipped_keeps_the_oom_date(tmp_path: Path, compress: bool) -> None:
    data = FIXTURE.read_bytes()
    path = tmp_path / ("vllm.log.gz" if compress else "vllm.log")
    path.write_bytes(gzip.compress(data) if compress else data)
    now = os.stat(path).st_mtime
    parsed = list(merged([path], identity=IDENTITY))
    assert len(parsed) == len(data.splitlines())
    assert [p.error for p in parsed] == [None] * len(parsed)
    (oom,) = [s for p in parsed for s in p.signals if s.kind is SignalKind.GPU_OOM]
    assert oom.time == _expected_oom_time(now)
