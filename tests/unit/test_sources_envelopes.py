"""Fluent Bit records and Vector events -> LogLine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ParseError
from detector.events.sources.fluentbit import parse_fluentbit_record
from detector.events.sources.timeparse import parse_iso8601
from detector.events.sources.vector import parse_vector_event

FIXTURES = Path(__file__).parent / "fixtures"
K8S_FB = {
    "pod_name": "vllm-llama-7d9f8b6c5d-x2kqz",
    "namespace_name": "llm",
    "container_name": "vllm",
    "host": "gpu-node-1",
    "labels": {"app": "vllm-llama", "pod-template-hash": "7d9f8b6c5d"},
    "annotations": {"prometheus.io/scrape": "true"},
    "pod_id": "32283a8b-c42f-4552-90e0-fe3cc13564d4",
    "docker_id": "c4ce823e84a7c2a55add12c97bfd0fc921167161d5dc358336ac1eb6b7cb42ab",
}
K8S_VECTOR = {
    "pod_name": "vllm-llama-7d9f8b6c5d-x2kqz",
    "pod_namespace": "llm",
    "container_name": "vllm",
    "pod_node_name": "gpu-node-1",
    "pod_labels": {"app": "vllm-llama"},
    "pod_owner": "ReplicaSet/vllm-llama-7d9f8b6c5d",
}


def _rows() -> list[dict[str, Any]]:
    path = FIXTURES / "sources_envelopes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["expect"]["format"])
def test_real_records(row: dict[str, Any]) -> None:
    expect = row["expect"]
    parse = parse_fluentbit_record if expect["format"] == "fluentbit" else parse_vector_event
    line = parse(row["record"])
    assert line.text == expect["text"]
    assert line.time == pytest.approx(parse_iso8601(expect["time"]), abs=1e-6)
    for key in ("namespace", "pod", "container", "node", "stream"):
        assert getattr(line, key) == expect[key], key


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        (1734429601.123456, 1734429601.123456),  # out_kafka default timestamp_format double
        ("2024-12-17T10:00:01.123456Z", 1734429601.123456),  # iso8601 / iso8601_ns
        ("2024-12-17T10:00:01Z", 1734429601.0),
    ],
)
def test_fluentbit_timestamp_formats(stamp: object, expected: float) -> None:
    record = {"@timestamp": stamp, "log": "CUDA out of memory\n", "kubernetes": K8S_FB}
    line = parse_fluentbit_record(record)
    assert line.time == pytest.approx(expected, abs=1e-6)
    assert line.text == "CUDA out of memory"
    assert (line.namespace, line.pod, line.container, line.node) == (
        "llm",
        "vllm-llama-7d9f8b6c5d-x2kqz",
        "vllm",
        "gpu-node-1",
    )
    assert line.labels == {"app": "vllm-llama", "pod-template-hash": "7d9f8b6c5d"}


@pytest.mark.parametrize(
    ("record", "text", "time"),
    [
        ({"time": "2024-12-17T10:00:01Z", "log": "a\r\n"}, "a", 1734429601.0),  # CRI time only
        ({"date": 1734429601.0, "log": "b"}, "b", 1734429601.0),
        ({"@timestamp": 1.0, "message": "renamed\n", "kubernetes": K8S_FB}, "renamed", 1.0),
        ({"@timestamp": 1.0, "log": "x\n\n"}, "x\n", 1.0),  # only one newline stripped
    ],
)
def test_fluentbit_variants(record: dict[str, Any], text: str, time: float) -> None:
    line = parse_fluentbit_record(record)
    assert (line.text, line.time) == (text, time)


def test_fluentbit_default_time_and_bad_metadata() -> None:
    line = parse_fluentbit_record({"log": "x", "kubernetes": "oops"}, default_time=7.0)
    assert line.time == 7.0 and line.pod is None
    labels = {"app": "a", "n": 1}
    line = parse_fluentbit_record({"log": "x", "time": 1, "kubernetes": {"labels": labels}})
    assert line.labels == {"app": "a"}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"log": 42, "@timestamp": 1.0}, "missing_field"),
        ({"@timestamp": 1.0}, "missing_field"),
        ({"log": "x"}, "missing_field"),
        ({"log": "x", "@timestamp": "not a time"}, "bad_timestamp"),
        ({"log": "x", "@timestamp": -5}, "bad_timestamp"),
        ({"log": "x", "@timestamp": True}, "bad_timestamp"),
    ],
)
def test_fluentbit_rejects(record: dict[str, Any], reason: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_fluentbit_record(record)
    assert err.value.reason == reason


def test_vector_event() -> None:
    event = {
        "message": "torch.OutOfMemoryError: CUDA out of memory.\n",
        "timestamp": "2024-12-17T10:00:01.499555308Z",
        "stream": "stderr",
        "source_type": "kubernetes_logs",
        "kubernetes": K8S_VECTOR,
    }
    line = parse_vector_event(event)
    assert line.text == "torch.OutOfMemoryError: CUDA out of memory."
    assert line.time == pytest.approx(1734429601.499555)
    assert line.owner == ("ReplicaSet", "vllm-llama-7d9f8b6c5d")
    assert (line.namespace, line.pod, line.container, line.node, line.stream) == (
        "llm",
        "vllm-llama-7d9f8b6c5d-x2kqz",
        "vllm",
        "gpu-node-1",
        "stderr",
    )


def test_vector_flattened_keys_as_in_the_docs() -> None:
    event = {f"kubernetes.{k}": v for k, v in K8S_VECTOR.items()}
    event.update({"message": "m", "timestamp": "2020-10-15T11:01:46.499555308Z"})
    line = parse_vector_event(event)
    assert (line.pod, line.namespace, line.node) == (
        "vllm-llama-7d9f8b6c5d-x2kqz",
        "llm",
        "gpu-node-1",
    )


def test_vector_message_object_after_parse_json() -> None:
    event = {"message": {"level": "error", "msg": "CUDA out of memory"}, "timestamp": 1.0}
    assert parse_vector_event(event).text == '{"level":"error","msg":"CUDA out of memory"}'


@pytest.mark.parametrize(
    ("pod_owner", "expected"),
    [("StatefulSet/llm", ("StatefulSet", "llm")), ("bogus", None), (3, None), ("/x", None)],
)
def test_vector_owner(pod_owner: object, expected: tuple[str, str] | None) -> None:
    event = {"message": "m", "timestamp": 1.0, "kubernetes": {"pod_owner": pod_owner}}
    assert parse_vector_event(event).owner == expected


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"timestamp": 1.0}, "missing_field"),
        ({"message": None, "timestamp": 1.0}, "missing_field"),
        ({"message": "m"}, "missing_field"),
        ({"message": "m", "timestamp": "2020-99-99"}, "bad_timestamp"),
    ],
)
def test_vector_rejects(event: dict[str, Any], reason: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_vector_event(event)
    assert err.value.reason == reason
