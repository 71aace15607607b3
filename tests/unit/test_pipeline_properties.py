"""Property-based tests of the pure pipeline: parse_stream + Correlator on any input."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from detector.config import CorrelateSettings
from detector.correlate.correlator import Correlator
from detector.events.model import SourcePos
from detector.lab import fuzz
from detector.pipeline import parse_stream

REAL = [raw for seeds in fuzz.families().values() for raw in seeds]

record = st.one_of(
    st.sampled_from(REAL),
    st.binary(max_size=512),
    st.text(max_size=512).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.tuples(st.sampled_from(REAL), st.integers(0, 2**32)).map(
        lambda pair: fuzz.mutate(pair[0], random.Random(pair[1]))
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(record, max_size=60))
def test_any_stream_is_parsed_and_correlated_without_raising(records: list[bytes]) -> None:
    stream = [(SourcePos("s", i + 1), raw) for i, raw in enumerate(records)]
    correlator = Correlator(CorrelateSettings())
    seen = 0
    for parsed in parse_stream(stream):
        seen += 1
        assert (parsed.error is None) or not parsed.signals
        for signal in parsed.signals:
            correlator.observe(signal)
    assert seen == len(records)  # every record comes out: parsed or rejected, never lost


@settings(max_examples=100, deadline=None)
@given(st.permutations(REAL[:40]))
def test_merge_keys_stay_ordered_whatever_the_record_order(records: list[bytes]) -> None:
    keys = [p.time for p in parse_stream([(SourcePos("s", i), r) for i, r in enumerate(records)])]
    assert keys == sorted(keys)
