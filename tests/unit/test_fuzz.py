"""A short run of the fuzzer (`make fuzz` runs 100,000 mutants per family)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from detector.events.model import SourcePos
from detector.lab import fuzz
from detector.pipeline import Parsed

FAMILIES = fuzz.families()


def test_every_input_family_has_real_seeds() -> None:
    assert len(FAMILIES) >= 6


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_mutants_never_crash_and_never_cost_a_good_record(name: str) -> None:
    result = fuzz.fuzz_family(name, FAMILIES[name], records=300, seed=11)
    assert result.crashes == []
    assert result.good_lost == 0
    assert 0 < result.rejected <= result.mutants


def test_the_loss_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = FAMILIES["fluent-bit container logs"]
    real = fuzz.parse_stream

    def drop_good_signals(records: list[tuple[SourcePos, bytes]]) -> Iterator[Parsed]:
        return (p for p in real(records) if p.source.origin != "good" or not p.signals)

    monkeypatch.setattr(fuzz, "parse_stream", drop_good_signals)
    assert fuzz.fuzz_family("x", seeds, records=3000, seed=1).good_lost > 0
