"""The per-record fast paths give exactly what the plain code they stand for gives."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import FrozenInstanceError, dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.correlate.windows import SLOTS_PER_WINDOW, ClientWindow, RateWindow
from detector.errors import ParseError
from detector.events import detect
from detector.events.model import LogLine, Signal, SignalKind, SourcePos, slot_init
from detector.events.reader import read_records
from detector.events.sources.timeparse import first_time, parse_nginx_time, parse_time

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
json_texts = st.one_of(
    json_values.map(json.dumps),
    st.tuples(json_values.map(json.dumps), st.text(" \t\r\n}]x,", max_size=4)).map("".join),
    st.tuples(st.text(" \t\r\n", max_size=2), json_values.map(json.dumps)).map("".join),
    st.text(max_size=40),
    st.text('{}[]":,0123456789.eE+-tfnul \\', max_size=40),
)


def _outcome(decode: Any, text: str) -> tuple[str, Any]:
    try:
        return "ok", decode(text)
    except json.JSONDecodeError as exc:
        return "error", str(exc)


def _same(a: Any, b: Any) -> bool:
    """Compare decoded values, NaN equal to NaN (json reads it)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=500, deadline=None)
@given(json_texts)
def test_the_json_fast_path_decodes_and_fails_as_json_loads(text: str) -> None:
    if text.startswith("\ufeff"):
        return  # json.loads' own BOM message: records reach the decoder without one
    (kind, value), (want_kind, want) = _outcome(detect._loads, text), _outcome(json.loads, text)
    assert kind == want_kind
    assert value == want if kind == "error" else _same(value, want)


@slot_init
@dataclass(frozen=True, slots=True)
class _Example:
    name: str
    size: int = 3
    tags: dict[str, str] = field(default_factory=dict)


def test_slot_init_keeps_the_dataclass_contract() -> None:
    a, b = _Example("x"), _Example(name="x", size=3)
    assert a == b and a.tags == {} and a.tags is not b.tags  # a fresh default per instance
    assert _Example("y", 4, {"k": "v"}) == _Example(name="y", size=4, tags={"k": "v"})
    with pytest.raises(FrozenInstanceError):
        a.size = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        _Example()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Example("x", nope=1)  # type: ignore[call-arg]
    assert replace(a, size=9) == _Example("x", 9)
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(a) == "_Example(name='x', size=3, tags={})"


def test_slot_init_refuses_what_it_cannot_reproduce() -> None:
    @dataclass(slots=True)
    class Mutable:
        name: str

    @dataclass(frozen=True)
    class Unslotted:
        name: str

    for cls in (Mutable, Unslotted):
        with pytest.raises(TypeError):
            slot_init(cls)


def test_the_record_classes_are_still_frozen_and_default_fresh_dicts() -> None:
    src = SourcePos("f", 1)
    one, two = Signal(SignalKind.GPU_OOM, 1.0, src), Signal(SignalKind.GPU_OOM, 1.0, src)
    assert one == two and one.attrs is not two.attrs and one.labels is not two.labels
    line = LogLine(1.0, "text", pod="p")
    assert line.to_signal(SignalKind.GPU_OOM, src, {}) == Signal(
        kind=SignalKind.GPU_OOM, time=1.0, source=src, pod="p", text="text"
    )
    with pytest.raises(FrozenInstanceError):
        src.position = 2  # type: ignore[misc]
    for obj in (one, line):
        with pytest.raises(FrozenInstanceError):
            obj.time = 2.0  # type: ignore[misc]


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70))
def test_the_float_time_fast_path_is_parse_time(value: float) -> None:
    try:
        want: Any = parse_time(value)
    except ParseError as exc:
        want = exc.reason
    try:
        got: Any = first_time({"@timestamp": value}, ("@timestamp",), None)
    except ParseError as exc:
        got = exc.reason
    assert got == want or (got != got and want != want)  # NaN is NaN


def test_the_nginx_time_cache_keeps_results_and_never_keeps_errors() -> None:
    assert parse_nginx_time("14/Mar/2025:09:00:01 +0100") == 1741939201.0
    assert parse_nginx_time("14/Mar/2025:09:00:01 +0100") == 1741939201.0
    for _ in range(2):
        with pytest.raises(ParseError) as caught:
            parse_nginx_time("14/Foo/2025:09:00:01 +0000")
        assert caught.value.reason == "bad_timestamp"


@given(
    st.lists(st.tuples(st.floats(0, 100), st.sampled_from([200, 429, 502, 503, 504])), max_size=50),
    st.floats(0, 50),
    st.floats(0, 1),
)
def test_rate_window_exceeds_is_both_threshold_tests(
    responses: list[tuple[float, int]], rate: float, ratio: float
) -> None:
    lb = RateWindow(30.0)
    for t, status in sorted(responses):
        lb.add(t, status)
    assert lb.exceeds(rate, ratio) == (lb.error_rate_per_s >= rate and lb.error_ratio >= ratio)


_SLOT_EDGES = st.tuples(st.integers(0, 80), st.sampled_from([-1, 0, 1])).map(
    lambda edge: (
        math.nextafter(edge[0] * (10.0 / SLOTS_PER_WINDOW), edge[1] * math.inf)
        if edge[1]
        else edge[0] * (10.0 / SLOTS_PER_WINDOW)
    )
)  # times on and next to the slot edges of a 10 s window (slots of 1.666... s)


@given(
    st.sampled_from([30.0, 10.0]),
    st.lists(
        st.tuples(
            st.floats(0, 120) | _SLOT_EDGES,
            st.sampled_from(["a", "b", "c", "d", None]),
            st.integers(1, 3),
        ),
        max_size=60,
    ),
)
def test_client_window_current_slot_path_is_the_plain_count(
    width_s: float, records: list[tuple[float, str | None, int]]
) -> None:
    """The newest-slot fast path and the late-record walk count what a plain scan counts."""
    window = ClientWindow(width_s)
    slot_s = width_s / SLOTS_PER_WINDOW
    kept: list[tuple[int, str | None, int]] = []
    newest = None
    for t, client, count in records:  # arrival order, late records included
        window.add(t, client, "proxy", count)
        index = int(t // slot_s)
        newest = index if newest is None else max(newest, index)
        if index > newest - SLOTS_PER_WINDOW:  # older than the window when it came: dropped
            kept.append((index, client, count))
    if newest is None:
        return
    now = max(t for t, _, _ in records)
    last = int(now // slot_s)
    per_client: dict[str, int] = {}
    for index, client, count in kept:
        if last - SLOTS_PER_WINDOW < index <= last and client is not None:
            per_client[client] = per_client.get(client, 0) + count
    stats = window.stats(now)
    assert (stats.clients, stats.max_requests, stats.requests) == (
        len(per_client),
        max(per_client.values(), default=0),
        sum(per_client.values()),
    )


def test_blank_lines_are_ascii_whitespace_only(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes(b"a\n \t\x0b\x0c\r\n\n\x85\n\xc2\xa0\nb")
    assert [raw for _, raw in read_records([path])] == [b"a", b"\x85", b"\xc2\xa0", b"b"]
