"""Fluent Bit records, Vector events, plain-text lines given an identity -> LogLine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import SignalKind, SourcePos
from detector.events.reader import read_records
from detector.events.sources.fluentbit import parse_fluentbit_record
from detector.events.sources.raw_text import (
    LogIdentity,
    leading_time,
    parse_json_app_line,
    split_kubectl_prefix,
)
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
    return _fixture("sources_envelopes.jsonl")


def _fixture(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


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


# --- plain-text lines given an identity (``parse_record(..., identity=...)``) -----------------

IDENT = LogIdentity("llm", "vllm-llama-7d9f8b6c5d-x2kqz", "vllm", workload="vllm-llama")
SRC = SourcePos("/tmp/vllm.log", 1)
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"


def _time(value: str | None) -> float | None:
    return None if value is None else parse_iso8601(value)


@pytest.mark.parametrize("row", _fixture("sources_raw_text.jsonl"), ids=lambda r: r["text"][:40])
def test_real_plain_lines(row: dict[str, Any]) -> None:
    expect, default = row["expect"], _time(row["default_time"])
    if "reason" in expect:
        with pytest.raises(ParseError) as err:
            parse_record(row["text"], SRC, default_time=default, identity=IDENT)
        assert err.value.reason == expect["reason"]
        return
    signals = parse_record(row["text"], SRC, default_time=default, identity=IDENT)
    assert [s.kind.value for s in signals] == expect["kinds"]
    if "{" not in row["text"][:1]:
        assert leading_time(row["text"], default) == pytest.approx(_time(expect["time"]))
    else:
        record = json.loads(row["text"])
        line = parse_json_app_line(record, row["text"], IDENT, default_time=default)
        assert line.time == pytest.approx(_time(expect["time"]))
        assert line.text == expect["text"]
    for sig in signals:
        assert sig.time == pytest.approx(_time(expect["time"]))
        assert (sig.namespace, sig.pod, sig.container) == ("llm", IDENT.pod, "vllm")
        assert sig.owner == ("Deployment", "vllm-llama")


@pytest.mark.parametrize("row", _fixture("sources_raw_text.jsonl"), ids=lambda r: r["text"][:40])
def test_plain_lines_without_identity_are_unknown(row: dict[str, Any]) -> None:
    with pytest.raises(ParseError) as err:
        parse_record(row["text"], SRC, default_time=_time(row["default_time"]))
    assert err.value.reason == "unknown_format"


_D = "2025-03-14T10:00:00Z"  # a default time


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [
        ("2024-03-14T09:00:01.123456Z  INFO text_generation_launcher: x", None,
         "2024-03-14T09:00:01.123456Z"),
        ("2024-03-14 09:00:01,123 - vllm - ERROR - x", None, "2024-03-14T09:00:01.123Z"),
        ("2024-03-14T09:00:01+01:00 x", None, "2024-03-14T08:00:01Z"),
        ("[2024-03-14 09:00:01] x", None, "2024-03-14T09:00:01Z"),
        ("INFO 03-14 09:00:01 api_server.py:212] vLLM API server", "2025-03-20T00:00:00Z",
         "2025-03-14T09:00:01Z"),
        ("WARNING 12-31 23:59:59 [x.py:1] y", "2025-01-01T00:00:05Z", "2024-12-31T23:59:59Z"),
        ("INFO 01-01 00:00:01 [x.py:1] y", "2024-12-31T23:59:00Z", "2025-01-01T00:00:01Z"),
        ("INFO 02-29 10:00:00 [x.py:1] leap day", "2025-03-01T00:00:00Z", "2024-02-29T10:00:00Z"),
        ("(RayWorkerWrapper pid=1234, ip=10.0.0.1) INFO 03-14 09:00:01 x", _D,
         "2025-03-14T09:00:01Z"),
        ("I0314 09:00:01.123456   12345 server.go:1] x", _D, "2025-03-14T09:00:01.123456Z"),
        ("[23:59:58 TP0] Decode batch.", "2025-03-15T00:00:03Z", "2025-03-14T23:59:58Z"),
        ("Traceback (most recent call last):", _D, _D),
        ("INFO: Started server process [1]", _D, _D),
        ("2024-03-14T09:00:01.123456Zextra", _D, _D),
    ],
)  # fmt: skip
def test_leading_time(text: str, default: str | None, expected: str) -> None:
    assert leading_time(text, _time(default)) == pytest.approx(parse_iso8601(expected))


@pytest.mark.parametrize(
    ("text", "default", "reason"),
    [
        ("INFO 03-14 09:00:01 [x.py:1] y", None, "missing_timestamp"),  # no year
        ("I0314 09:00:01.123456 1 x.go:1] y", None, "missing_timestamp"),
        ("[09:00:01 TP0] y", None, "missing_timestamp"),  # no date
        ("plain", None, "missing_timestamp"),
        ("INFO 13-45 09:00:01 [x.py:1] y", 1.7e9, "bad_timestamp"),
        ("INFO 02-30 09:00:01 [x.py:1] y", 1.7e9, "bad_timestamp"),
        ("[25:61:61 TP0] y", 1.7e9, "bad_timestamp"),
        ("2024-13-01T00:00:00Z x", None, "bad_timestamp"),
        ("INFO 03-14 09:00:01 [x.py:1] y", 1e300, "bad_timestamp"),  # default out of range
    ],
)
def test_leading_time_rejects(text: str, default: float | None, reason: str) -> None:
    with pytest.raises(ParseError) as err:
        leading_time(text, default)
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("workload", "owner"),
    [
        (None, None),
        ("vllm-llama", ("Deployment", "vllm-llama")),
        ("StatefulSet/vllm", ("StatefulSet", "vllm")),
        ("/x", ("Deployment", "/x")),
    ],
)
def test_identity_owner(workload: str | None, owner: tuple[str, str] | None) -> None:
    assert LogIdentity("llm", "p", workload=workload).owner == owner


def test_known_formats_win_over_the_given_identity() -> None:
    """Given an identity, records of a known format still parse as that format."""
    access = (
        '10.0.0.9 - - [17/Dec/2024:10:00:01 +0000] "POST /v1/chat/completions HTTP/1.1" 502 150 '
        '"-" "python-requests/2.31.0" 1024 0.850 [llm-vllm-llama-8000] [] 10.244.1.7:8000 0 0.849 '
        "502 ab"
    )
    (sig,) = parse_record(access, SRC, identity=IDENT)
    assert sig.kind is SignalKind.LB_RESPONSE and sig.pod is None
    (sig,) = parse_record('vllm:num_requests_waiting{model_name="m"} 7', SRC, default_time=1.0,
                          identity=IDENT)  # fmt: skip
    assert sig.attrs["requests_waiting"] == 7 and sig.pod is None
    fluent = {"@timestamp": 1.0, "log": "x", "kubernetes": {"pod_name": "a", "namespace_name": "b"}}
    assert parse_record(json.dumps(fluent), SRC, identity=IDENT) == []
    assert parse_record("# HELP vllm:x y", SRC, identity=IDENT) == []


def test_truncated_json_stays_malformed_even_with_an_identity() -> None:
    path = CORPUS / "envelopes" / "tgi_json_output_C_v3_router_top_level_message_TRUNCATED.log"
    if not path.exists():
        pytest.skip("corpus not found")
    with pytest.raises(ParseError) as err:
        parse_record(path.read_bytes().strip(), SRC, identity=IDENT)
    assert err.value.reason == "malformed_json"


def test_tgi_json_log_line_with_an_identity() -> None:
    """TGI's JSON logs (its top-level ``message`` layout) are the pod's own lines."""
    record = {
        "timestamp": "2025-08-29T14:40:17.288163Z",
        "level": "ERROR",
        "message": "Request failed during generation: Server error: CUDA out of memory. Tried to "
        "allocate 2.00 GiB",
        "target": "text_generation_router_v3::backend",
    }
    (sig,) = parse_record(json.dumps(record), SRC, identity=IDENT)
    assert sig.time == pytest.approx(parse_iso8601("2025-08-29T14:40:17.288163Z"))
    assert sig.text.startswith("Request failed during generation")
    with pytest.raises(ParseError) as err:
        parse_record(json.dumps(record), SRC)
    assert err.value.reason == "unknown_format"
    del record["timestamp"]
    with pytest.raises(ParseError) as err:
        parse_record(json.dumps(record), SRC, identity=IDENT)
    assert err.value.reason == "missing_timestamp"


# --- kubectl logs --prefix -----------------------------------------------------------------


def test_corpus_vector_lines_behind_a_kubectl_prefix() -> None:
    """``[vector-h6qzw vector] {event}``: the prefix is the shipper pod; the event names its own."""
    path = CORPUS / "envelopes" / "vector_kubernetes_logs_2020_kubectl_prefix.log"
    if not path.exists():
        pytest.skip("corpus not found")
    for source, raw in read_records([path]):
        assert parse_record(raw, source) == []  # coredns lines: no signal
        prefix, event = raw.decode().split("] ", 1)
        record = json.loads(event)
        record["message"] = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        (sig,) = parse_record(f"{prefix}] {json.dumps(record)}", source, identity=IDENT)
        assert (sig.namespace, sig.pod, sig.container) == (
            "kube-system",
            "coredns-fd565d9f8-xdrjp",
            "coredns",
        )


@pytest.mark.parametrize(
    ("text", "pod", "container", "rest"),
    [
        ("[pod/vllm-0/vllm] INFO 03-14 09:00:01 x", "vllm-0", "vllm", "INFO 03-14 09:00:01 x"),
        ("[vllm-0 vllm] x", "vllm-0", "vllm", "x"),
        ("[pod/k8s-master-192.168.1.30/scheduler] x", "k8s-master-192.168.1.30", "scheduler", "x"),
    ],
)
def test_kubectl_prefix(text: str, pod: str, container: str, rest: str) -> None:
    assert split_kubectl_prefix(text) == (pod, container, rest)


@pytest.mark.parametrize(
    "text",
    ["[2025-01-06 02:58:11 TP0] x", "[04:40:55 TP0] x", "[debug] x", "[1, 2]", "[Pod/A/b] x"],
)
def test_not_a_kubectl_prefix(text: str) -> None:
    assert split_kubectl_prefix(text) is None


def test_kubectl_prefixed_plain_line() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    (sig,) = parse_record(f"[pod/vllm-1/vllm] {oom}", SRC, default_time=5.0)
    assert (sig.namespace, sig.pod, sig.container, sig.time) == (None, "vllm-1", "vllm", 5.0)
    line = f"[pod/vllm-1/vllm] 2024-03-14T09:00:01Z {oom}"
    (sig,) = parse_record(line, SRC, identity=IDENT)
    assert (sig.namespace, sig.pod, sig.container) == ("llm", "vllm-1", "vllm")
    assert sig.time == parse_iso8601("2024-03-14T09:00:01Z")


# --- any input: ParseError or a result, never another exception ---------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200), st.sampled_from([None, 1.7e9, 0.0, 1e300]))
def test_plain_text_any(text: str, default: float | None) -> None:
    try:
        signals = parse_record(text, SRC, default_time=default, identity=IDENT)
    except ParseError as exc:
        assert exc.reason
        return
    assert all(isinstance(s.time, float) for s in signals)


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="0123456789-:.,TZ +[]()IWEFNOAR pid=", max_size=60),
    st.sampled_from([None, 1.7e9, 0.0]),
)
def test_leading_time_any(text: str, default: float | None) -> None:
    try:
        assert leading_time(text, default) >= 0
    except ParseError as exc:
        assert exc.reason in ("missing_timestamp", "bad_timestamp")
