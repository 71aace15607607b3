"""Values checked where they enter, with messages that name the setting (issue 16, item 4).

Settings and the workload mapping (``detector.config``), Kafka topic names, the bootstrap
error of an unreachable broker, ``classify``'s oversized lines and the web API's 422.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from kafka.errors import KafkaConnectionError, KafkaTimeoutError
from pydantic import ValidationError

from detector.cli.classify import MAX_LINE_BYTES, read_records
from detector.config import (
    KafkaSettings,
    Settings,
    check_topic,
    load_workload_map,
    validation_problems,
)
from detector.errors import ConfigError, StreamError
from detector.events.detect import MAX_RECORD_BYTES
from detector.stream.bootstrap import client_options, connecting
from detector.web.app import MAX_PROBLEM_CHARS, invalid_request

REQUEST = Request({"type": "http", "method": "POST", "path": "/", "headers": []})


@pytest.mark.parametrize("name", ["k8s-logs", "a", "A.b_c-9", "x" * 249])
def test_kafka_accepts_these_topic_names(name: str) -> None:
    assert check_topic(name) == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "cannot be empty"),
        (".", "not a Kafka topic name"),
        ("..", "not a Kafka topic name"),
        ("lb logs", "not a Kafka topic name"),
        ("lb/logs", "not a Kafka topic name"),
        ("x" * 250, "not a Kafka topic name"),
    ],
)
def test_kafka_refuses_these_topic_names(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_topic(name)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"topics": []}, "topics"),
        ({"topics": ["k8s-logs", ""]}, "topics"),
        ({"dead_letter_topic": "dead letters"}, "dead_letter_topic"),
        ({"bootstrap_servers": ""}, "bootstrap_servers"),
        ({"bootstrap_servers": "a:9092,"}, "bootstrap_servers"),
        ({"bootstrap_timeout_ms": 0}, "bootstrap_timeout_ms"),
    ],
)
def test_kafka_settings_refuse_values_that_make_no_sense(
    values: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        KafkaSettings.model_validate(values)
    assert validation_problems(caught.value).startswith(f"{field}: ")


def test_problems_name_the_environment_variable_and_never_the_value() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings.model_validate({"correlate": {"window_s": -1}, "web": {"tokens": {"al": "s3"}}})
    line = validation_problems(caught.value, "DETECTOR_")
    assert "DETECTOR_CORRELATE__WINDOW_S: Input should be greater than 0" in line
    assert "DETECTOR_WEB__TOKENS: tokens shorter than 16 characters: ['al']" in line
    assert "s3" not in line and "\n" not in line and "Value error" not in line


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"namespace": "", "workload": "vllm-llama"}, "upstreams.gw.namespace: '' is not a"),
        ({"namespace": "llm", "workload": ""}, "upstreams.gw.workload: '' is not a workload"),
        ({"namespace": "LLM", "workload": "x"}, "not a namespace name"),
        ({"namespace": "llm/x", "workload": "x"}, "not a namespace name"),
        ({"namespace": "llm", "workload": "a b"}, "not a workload name"),
        ({"namespace": "n" * 64, "workload": "x"}, "not a namespace name"),
        ({"namespace": "llm"}, "upstreams.gw.workload: Field required"),
    ],
)
def test_a_workload_mapping_entry_is_checked_in_one_line(
    tmp_path: Path, entry: dict[str, str], message: str
) -> None:
    path = tmp_path / "workloads.yaml"
    path.write_text(json.dumps({"upstreams": {"gw": entry}}))  # JSON is YAML
    with pytest.raises(ConfigError, match=message) as caught:
        load_workload_map(path)
    assert "\n" not in str(caught.value) and "pydantic" not in str(caught.value)


def test_a_good_workload_mapping_loads(tmp_path: Path) -> None:
    path = tmp_path / "workloads.yaml"
    path.write_text("upstreams:\n  llm-gateway-80: {namespace: llm, workload: vllm-llama.v2}\n")
    assert load_workload_map(path).upstreams["llm-gateway-80"].workload == "vllm-llama.v2"


@pytest.mark.parametrize(
    "error", [KafkaTimeoutError("Unable to bootstrap"), KafkaConnectionError()]
)
def test_an_unreachable_broker_is_one_line_naming_the_address_and_the_setting(
    error: Exception,
) -> None:
    with pytest.raises(StreamError) as caught, connecting("b1:9092,b2:9092", "consume from", 5000):
        raise error
    assert str(caught.value) == (
        "cannot consume from Kafka: no broker answered at b1:9092,b2:9092 within 5 s: check "
        "--bootstrap or DETECTOR_KAFKA__BOOTSTRAP_SERVERS (wait longer: "
        "DETECTOR_KAFKA__BOOTSTRAP_TIMEOUT_MS)"
    )


def test_clients_get_the_bootstrap_wait_only_when_given() -> None:
    assert client_options("a:1,b:2", 5000) == {
        "bootstrap_servers": ["a:1", "b:2"],
        "bootstrap_timeout_ms": 5000,
    }
    assert client_options("a:1", None) == {"bootstrap_servers": ["a:1"]}


def test_classify_calls_a_line_over_the_record_limit_too_large_as_replay_does() -> None:
    assert MAX_LINE_BYTES == MAX_RECORD_BYTES  # the same limit as replay and run
    limit = MAX_LINE_BYTES
    data = (
        b"a" * limit + b"\r\n"  # at the limit, with CRLF: kept
        + b"b" * (limit + 1) + b"\n"  # one byte over
        + b"CUDA out of memory\n"
        + b"c" * (3 * limit + 5)  # far over, last line without a newline
    )  # fmt: skip
    got = [(r.line, r.error, len(r.text or "")) for r in read_records("f", io.BytesIO(data))]
    assert got == [
        (1, None, limit),
        (2, f"too_large: {limit + 1} bytes > {limit}", 0),
        (3, None, 18),
        (4, f"too_large: {3 * limit + 5} bytes > {limit}", 0),
    ]


def test_a_422_says_what_is_wrong_without_echoing_the_input() -> None:
    body = "x" * 2000
    errors = [
        {
            "loc": ("body", "reason"),
            "msg": "String should have at most 1000 characters",
            "type": "string_too_long",
            "input": body,
            "ctx": {"max_length": 1000},
        }
    ] * 50
    response = asyncio.run(invalid_request(REQUEST, RequestValidationError(errors)))
    assert response.status_code == 422
    doc = json.loads(bytes(response.body))
    assert doc["problems"] == 50 and len(doc["detail"]) == 10
    assert doc["detail"][0] == {
        "loc": ["body", "reason"],
        "msg": "String should have at most 1000 characters",
        "type": "string_too_long",
    }
    assert body not in bytes(response.body).decode() and len(response.body) < 2000
    long = [{"loc": ("body", "k" * 5000), "msg": "m" * 5000, "type": "t"}]
    answer = asyncio.run(invalid_request(REQUEST, RequestValidationError(long)))
    cut = json.loads(bytes(answer.body))
    assert len(cut["detail"][0]["loc"][1]) == len(cut["detail"][0]["msg"]) == MAX_PROBLEM_CHARS
