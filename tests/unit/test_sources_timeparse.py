"""Time parsing shared by the source parsers."""

from __future__ import annotations

import pytest

from detector.errors import ParseError
from detector.events.sources.timeparse import (
    first_time,
    parse_epoch,
    parse_iso8601,
    parse_nginx_time,
    parse_time,
    str_map,
    str_or_none,
)

T0 = 1664530060.954726  # 2022-09-30T09:27:40.954726Z


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2022-09-30T09:27:40.954726Z", T0),
        ("2022-09-30T09:27:40.954726766Z", T0),  # nanoseconds kept to microseconds
        ("2022-09-30T10:27:40.954726+01:00", T0),
        ("2022-09-30 09:27:40.954726", T0),  # no offset: UTC
        ("2024-03-26T16:21:04.076718973+01:00", 1711466464.076718),
        ("1970-01-01T00:00:00Z", 0.0),
        ("2020-01-01", 1577836800.0),
    ],
)
def test_parse_iso8601(text: str, expected: float) -> None:
    assert parse_iso8601(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "text",
    ["", "yesterday", "2022-13-01T00:00:00Z", "2022-09-30T25:00:00Z", "0000-01-01", "\ud800"],
)
def test_parse_iso8601_rejects(text: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_iso8601(text)
    assert err.value.reason == "bad_timestamp"


def test_parse_iso8601_rejects_before_1970() -> None:
    with pytest.raises(ParseError):
        parse_iso8601("1969-12-31T23:59:59Z")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1664530060.954726, T0),  # Fluent Bit double
        (1664530060954, 1664530060.954),  # ms (Prometheus)
        (1664530060954726, 1664530060.954726),  # us
        (1664530060954726766, 1664530060.954726766),  # ns
        (0, 0.0),
    ],
)
def test_parse_epoch(value: float, expected: float) -> None:
    assert parse_epoch(value) == pytest.approx(expected, abs=1e-3)


# 1e12 was read as milliseconds and accepted as 2001-09-09; 1e15 (us) and 1e18 (ns) are 2001 too
@pytest.mark.parametrize(
    "value", [-1, float("nan"), float("inf"), True, 10**400, 1e30, 1e12, 1e15, 1e18, "1e12"]
)
def test_parse_epoch_rejects(value: float) -> None:
    with pytest.raises(ParseError) as err:
        parse_epoch(value)
    assert err.value.reason == "bad_timestamp"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("17/Dec/2024:10:00:01 +0000", 1734429601.0),
        ("[17/Dec/2024:10:00:01 +0000]", 1734429601.0),
        ("17/Dec/2024:11:00:01 +0100", 1734429601.0),
        ("05/Jul/2026:12:19:50 +0800", 1783225190.0),
    ],
)
def test_parse_nginx_time(text: str, expected: float) -> None:
    assert parse_nginx_time(text) == expected


@pytest.mark.parametrize(
    "text", ["17/Foo/2024:10:00:01 +0000", "32/Dec/2024:10:00:01 +0000", "17/Dec/2024 10:00:01", ""]
)
def test_parse_nginx_time_rejects(text: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_nginx_time(text)
    assert err.value.reason == "bad_timestamp"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2022-09-30T09:27:40.954726Z", T0),
        (1664530060.954726, T0),
        ("1664530060.954726", T0),
        (1664530060954, 1664530060.954),
    ],
)
def test_parse_time(value: object, expected: float) -> None:
    assert parse_time(value) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("value", [None, True, {}, [], "nan", "soon"])
def test_parse_time_rejects(value: object) -> None:
    with pytest.raises(ParseError) as err:
        parse_time(value)
    assert err.value.reason == "bad_timestamp"


def test_first_time_order_default_and_missing() -> None:
    record = {"@timestamp": None, "time": "2022-09-30T09:27:40.954726Z"}
    assert first_time(record, ("@timestamp", "time"), None) == pytest.approx(T0)
    assert first_time({}, ("@timestamp",), 5.0) == 5.0
    with pytest.raises(ParseError) as err:
        first_time({}, ("@timestamp",), None)
    assert err.value.reason == "missing_field"


def test_str_map_and_str_or_none() -> None:
    clean = {"app": "vllm"}
    assert str_map(clean) is clean
    assert str_map({"app": "vllm", "n": 1, "x": None}) == {"app": "vllm"}
    assert str_map(["app"]) == {}
    assert str_or_none("") is None
    assert str_or_none(3) is None
    assert str_or_none("pod") == "pod"
