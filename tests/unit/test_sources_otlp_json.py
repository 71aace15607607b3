"""OpenTelemetry Collector ``otlp_json`` logs requests: container lines and Kubernetes objects.

Cases in ``fixtures/shippers_otlp_json.jsonl``, each with its source: opentelemetry-proto's
own logs example, a container line as the filelog receiver's container operator and the
k8sattributes processor leave it, a k8sobjects watch record of an Event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.correlate.identity import WorkloadResolver
from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import LogLine, SourcePos
from detector.events.sources.otlp_json import any_value, otlp_log_records

FIXTURE = Path(__file__).parent / "fixtures" / "shippers_otlp_json.jsonl"
CASES = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
SOURCE = SourcePos("k8s-logs", 7, 0)


@pytest.mark.parametrize("case", CASES, ids=[c["case"][:40] for c in CASES])
def test_each_documented_shape_gives_its_signals(case: dict[str, Any]) -> None:
    signals = parse_record(json.dumps(case["record"]).encode(), SOURCE)
    expected = case["expect"]["signals"]
    assert len(signals) == len(expected)
    for sig, want in zip(signals, expected, strict=True):
        assert sig.kind.value == want["kind"] and sig.source == SOURCE
        for field, value in want.items():
            if field == "time":
                assert sig.time == pytest.approx(value, abs=1e-6)
            elif field != "kind":
                assert getattr(sig, field) == value, field
    assert case["source"].startswith("https://")


def test_the_proto_example_reads_every_value_type() -> None:
    (record,) = [c["record"] for c in CASES if "opentelemetry-proto" in c["source"]]
    (line,) = list(otlp_log_records(record))
    assert isinstance(line, LogLine)
    assert (line.text, line.time, line.pod) == ("Example log record", 1544712660.3, None)
    attrs = record["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["attributes"]
    values = {a["key"]: any_value(a["value"]) for a in attrs}
    assert values == {
        "string.attribute": "some string",
        "boolean.attribute": True,
        "int.attribute": 10,
        "double.attribute": 637.704,
        "array.attribute": ["many", "values"],
        "map.attribute": {"some.map.key": "some value"},
    }


def test_the_owner_and_labels_name_the_workload() -> None:
    (record,) = [c["record"] for c in CASES if "k8sattributes" in c["source"]]
    (line,) = list(otlp_log_records(record))
    assert isinstance(line, LogLine)
    assert line.owner == ("ReplicaSet", "vllm-llama-t4pz2q9s6")
    assert line.labels == {"pod-template-hash": "t4pz2q9s6"}
    (sig,) = parse_record(json.dumps(record).encode(), SOURCE)
    ref = WorkloadResolver().resolve(sig)
    assert ref is not None and (ref.namespace, ref.name, ref.kind) == (
        "llm", "vllm-llama", "Deployment"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"resourceLogs": ["x"]}, "unknown_format"),
        ({"resourceLogs": [{"scopeLogs": [{"logRecords": [7]}]}]}, "unknown_format"),
        (
            {"resourceLogs": [{"scopeLogs": [{"logRecords": [
                {"timeUnixNano": "soon", "body": {"stringValue": "x"}}
            ]}]}]},
            "bad_timestamp",
        ),
    ],
)  # fmt: skip
def test_a_malformed_request_is_a_clear_error(record: dict[str, Any], reason: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_record(json.dumps(record).encode(), SOURCE)
    assert caught.value.reason == reason


def test_values_nested_too_deep_are_refused() -> None:
    value: dict[str, Any] = {"stringValue": "x"}
    for _ in range(40):
        value = {"arrayValue": {"values": [value]}}
    with pytest.raises(ParseError, match="nested too deep"):
        any_value(value)
