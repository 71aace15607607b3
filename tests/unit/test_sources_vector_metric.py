"""Vector metric events (``prometheus_scrape`` through a JSON sink) -> Signal.

Fixture: ``fixtures/sources_vector_metrics.jsonl``, events in the shape of Vector's metric data
model (https://vector.dev/docs/architecture/data-model/metric) as its ``prometheus_scrape``
source emits them for dcgm-exporter and vLLM targets, each row with its source URL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import SignalKind, SourcePos
from detector.events.sources.vector_metric import is_vector_metric, signals_from_vector_metric

FIXTURES = Path(__file__).parent / "fixtures"
SRC = SourcePos("gpu-metrics", 7, 0)


def _rows() -> list[dict[str, Any]]:
    text = (FIXTURES / "sources_vector_metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["note"][:30])
def test_real_shaped_events(row: dict[str, Any]) -> None:
    record = row["record"]
    assert is_vector_metric(record)
    signals = signals_from_vector_metric(record, SRC)
    # the format dispatch reaches the same parser (a Kafka record's bytes)
    assert parse_record(json.dumps(record).encode(), SRC) == signals
    expect = row["expect"]
    if expect is None:
        assert signals == []
        return
    (sig,) = signals
    assert sig.kind is SignalKind(expect["kind"])
    assert (sig.pod, sig.namespace) == (expect["pod"], expect["namespace"])
    for key, value in expect["attrs"].items():
        assert sig.attrs[key] == value


def test_time_is_the_event_timestamp() -> None:
    (sig,) = signals_from_vector_metric(_rows()[0]["record"], SRC)
    assert sig.time == pytest.approx(1734429601.123456789)
    assert sig.attrs["gpu"] == "0" and sig.node == "gpu-node-1"


def test_namespace_prefixes_the_name() -> None:
    event = {
        "name": "FB_USED",
        "namespace": "DCGM_FI_DEV",
        "tags": {"pod": "p", "namespace": "llm", "gpu": "0"},
        "timestamp": "2024-12-17T10:00:01Z",
        "kind": "absolute",
        "gauge": {"value": 10.0},
    }
    (sig,) = signals_from_vector_metric(event, SRC)
    assert sig.attrs["used_bytes"] == 10 * 1024 * 1024


def test_default_time_without_timestamp() -> None:
    event = {"name": "vllm:num_requests_waiting", "kind": "absolute", "gauge": {"value": 3}}
    (sig,) = signals_from_vector_metric(event, SRC, default_time=5.0)
    assert sig.time == 5.0 and sig.attrs["requests_waiting"] == 3
    with pytest.raises(ParseError) as exc:
        signals_from_vector_metric(event, SRC)
    assert exc.value.reason == "missing_field"


@pytest.mark.parametrize(
    ("gauge", "reason"),
    [({}, "missing_field"), ({"value": True}, "bad_value"), ({"value": "x"}, "bad_value")],
)
def test_bad_values(gauge: dict[str, Any], reason: str) -> None:
    event = {"name": "DCGM_FI_DEV_FB_USED", "kind": "absolute", "gauge": gauge, "timestamp": 1}
    with pytest.raises(ParseError) as exc:
        signals_from_vector_metric(event, SRC)
    assert exc.value.reason == reason


def test_not_a_metric_event() -> None:
    assert not is_vector_metric({"name": "x", "kind": "Pod", "metadata": {}})
    assert not is_vector_metric({"metric": 1})
