"""A record's JSON is decoded exactly as ``json.loads`` decodes it (msgspec first, json after)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.events.detect import _loads

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (1 is not 1.0 here; -0.0 is not 0.0; NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(value=_VALUES, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_any_json_document_decodes_as_json_loads_does(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    text = json.dumps({"v": value}, ensure_ascii=ascii_only, indent=indent)
    assert _same(_loads(text), json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',  # the last duplicate wins
        '{"v": [1e400, -1e400, 1.5e-400]}',  # past a float: inf, -inf; under it: 0.0
        '{"v": NaN}',
        '{"v": [Infinity, -Infinity]}',
        '{"v": "\\ud800"}',  # a lone surrogate (the parser rejects it later, by name)
        '{"v": 123456789012345678901234567890}',
        '{"v": [-0.0, 1E5, 0.1]}',
        '  {"v": 1}  \n',
        '{"v": "\\u00e9\\u2028"}',
        "[" * 5000 + "]" * 5000,  # deeper than msgspec's limit: json's to judge
    ],
)
def test_documents_msgspec_refuses_or_reads_differently_are_json_s(text: str) -> None:
    try:
        expected: Any = json.loads(text)
    except RecursionError:
        with pytest.raises(RecursionError):
            _loads(text)
        return
    assert _same(_loads(text), expected)


@pytest.mark.parametrize(
    "text", ['{"v": 1} x', '{"v": }', '{"v": "cut', "{'v': 1}", '{"v": 01}', '{"v": [1,]}']
)
def test_malformed_json_raises_json_s_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        _loads(text)
    assert str(got.value) == str(expected.value)
