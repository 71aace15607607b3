"""Format detection: one record in, its signals or a ParseError out, whatever the bytes."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.errors import ParseError
from detector.events.detect import MAX_RECORD_BYTES, parse_record, signals_from_log
from detector.events.model import LogLine, SignalKind, SourcePos
from detector.events.sources.raw_text import LogIdentity

SRC = SourcePos("topic", 7, partition=0)
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 1.02 GiB is free."
)
ACCESS = (
    '10.0.0.9 - - [17/Dec/2024:10:00:01 +0000] "POST /v1/chat/completions HTTP/1.1" 502 150 "-" '
    '"python-requests/2.31.0" 1024 0.850 [llm-vllm-llama-8000] [] 10.244.1.7:8000 0 0.849 502 ab'
)
K8S_FB = {"pod_name": "vllm-0", "namespace_name": "llm", "container_name": "vllm", "host": "n1"}
POD_STATUS = {
    "phase": "Running",
    "containerStatuses": [
        {
            "name": "vllm",
            "ready": False,
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "finishedAt": "2024-12-17T10:00:00Z",
                }
            },
        }
    ],
}
POD = {"kind": "Pod", "metadata": {"name": "vllm-0", "namespace": "llm"}, "status": POD_STATUS}
EVENT = {
    "involvedObject": {"kind": "Pod", "name": "vllm-0", "namespace": "llm"},
    "reason": "BackOff",
    "message": "Back-off restarting failed container vllm in pod vllm-0_llm(uid)",
    "lastTimestamp": "2024-12-17T10:00:00Z",
    "count": 3,
}
SAMPLE = {
    "timestamp": "2024-12-17T10:00:01Z",
    "value": "79000",
    "name": "DCGM_FI_DEV_FB_USED",
    "labels": {"__name__": "DCGM_FI_DEV_FB_USED", "UUID": "GPU-1", "pod": "vllm-0"},
}


def _kinds(record: Any, **kwargs: Any) -> list[str]:
    raw = record if isinstance(record, str | bytes) else json.dumps(record)
    return [s.kind.value for s in parse_record(raw, SRC, **kwargs)]


@pytest.mark.parametrize(
    ("record", "kinds"),
    [
        ({"@timestamp": 1734429601.5, "log": OOM + "\n", "kubernetes": K8S_FB}, ["gpu_oom"]),
        ({"@timestamp": 1734429601.5, "log": ACCESS + "\n", "kubernetes": K8S_FB}, ["lb_response"]),
        ({"@timestamp": 1734429601.5, "log": "INFO ok\n", "kubernetes": K8S_FB}, []),
        (
            {"message": OOM, "timestamp": "2024-12-17T10:00:01Z", "kubernetes": {"pod_name": "v"}},
            ["gpu_oom"],
        ),
        ({"message": ACCESS, "timestamp": 1.0, "source_type": "kubernetes_logs"}, ["lb_response"]),
        (SAMPLE, ["gpu_memory"]),
        (EVENT, ["crash_loop"]),
        (POD, ["crash_loop"]),
        ({"kind": "PodList", "items": [POD, POD]}, ["crash_loop", "crash_loop"]),
        ({"kind": "List", "items": [POD, EVENT, {"kind": "Pod"}]}, ["crash_loop", "crash_loop"]),
        ([SAMPLE, EVENT], ["gpu_memory", "crash_loop"]),
        ({"verb": "ADDED", "event": EVENT}, ["crash_loop"]),  # OpenShift eventrouter
        ({"timestamp": "x", "body": EVENT}, ["crash_loop"]),  # OpenTelemetry stanza
        ({"type": "MODIFIED", "object": POD}, ["crash_loop"]),  # kubectl get -w -o json
        # an event exporter's stdout sink collected as a container log line
        ({"@timestamp": 1.0, "log": json.dumps(EVENT), "kubernetes": K8S_FB}, ["crash_loop"]),
        ('DCGM_FI_DEV_FB_USED{UUID="GPU-1",pod="vllm-0"} 79000 1734429601000', ["gpu_memory"]),
        ("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).", []),
        (ACCESS, ["lb_response"]),  # a bare access line, timed by its own $time_local
        ("", []),
        ("  \n", []),
        ("\ufeff" + json.dumps(EVENT), ["crash_loop"]),
        # Docker json-file: a "log" record without kubernetes metadata
        ({"log": OOM + "\n", "stream": "stderr", "time": "2024-05-01T10:00:00Z"}, ["gpu_oom"]),
        (f"2024-05-01T10:00:00.123456789Z stderr F {OOM}", ["gpu_oom"]),  # CRI
        (f"2024-05-01T10:00:00.123456789+01:00 stdout P {OOM[:60]}", ["gpu_oom"]),  # partial
        ("[vector-h6qzw vector] " + json.dumps(EVENT), ["crash_loop"]),  # kubectl --prefix
        (f"[pod/vllm-0/vllm] 2024-05-01T10:00:00Z {OOM}", ["gpu_oom"]),
        ("2024/05/01 10:00:00.123, 0, GPU-1234abcd-0000, 79000 MiB, 81920 MiB", ["gpu_memory"]),
        ("timestamp, index, uuid, memory.used [MiB], memory.total [MiB]", []),
        ("[N/A], [N/A], [N/A]", []),
        ('tgi_queue_size{pod="tgi-0"} 3 1734429601000', ["engine_pressure"]),
    ],
)
def test_dispatch(record: Any, kinds: list[str]) -> None:
    assert _kinds(record) == kinds


def test_signals_keep_source_and_envelope_identity() -> None:
    record = {"@timestamp": 1734429601.5, "log": OOM, "kubernetes": K8S_FB}
    (sig,) = parse_record(json.dumps(record).encode(), SRC)
    assert sig.source == SRC and sig.time == 1734429601.5
    assert (sig.namespace, sig.pod, sig.container, sig.node) == ("llm", "vllm-0", "vllm", "n1")


def test_bare_access_line_time() -> None:
    (sig,) = parse_record(ACCESS, SRC)
    assert sig.time == 1734429601.0 and sig.attrs["status"] == 502


def test_default_time_is_used_only_when_the_record_has_none() -> None:
    line = 'vllm:num_requests_waiting{model_name="m"} 12'
    (sig,) = parse_record(line, SRC, default_time=99.0)
    assert sig.time == 99.0
    record = {"log": OOM, "kubernetes": K8S_FB}
    assert parse_record(json.dumps(record), SRC, default_time=5.0)[0].time == 5.0


def test_signals_from_log_order() -> None:
    line = LogLine(time=1.0, text=ACCESS, pod="ingress-nginx-controller-0")
    (sig,) = signals_from_log(line, SRC)
    assert sig.kind is SignalKind.LB_RESPONSE
    assert [s.kind for s in signals_from_log(LogLine(time=1.0, text=OOM), SRC)] == [
        SignalKind.GPU_OOM
    ]
    broken_event_line = LogLine(time=1.0, text='{"involvedObject": oops')
    assert signals_from_log(broken_event_line, SRC) == []


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{" + b" " * MAX_RECORD_BYTES + b"}", "too_large"),
        (b'{"log": "\xff\xfe"}', "not_utf8"),
        (b"\x00\x01\x02\xff", "not_utf8"),
        ('{"@timestamp":"2022-09-30T09:27:40.954726Z","log":"at org', "malformed_json"),
        ("[vector-h6qzw vector] {}", "unknown_format"),  # a kubectl prefix, then "{}"
        ("[vector-h6qzw vector] {", "malformed_json"),
        ("[04:40:55 TP0] Decode batch. #running-req: 2", "unknown_format"),  # no identity
        ('["truncated', "malformed_json"),
        ("[" * 100_000 + "]" * 100_000, "malformed_json"),  # deeper than the decoder recurses
        ('{"a": NaN', "malformed_json"),
        ("42", "unknown_format"),
        ('"just a string"', "unknown_format"),
        ("null", "unknown_format"),
        ('{"file": "x.log", "notes": []}', "unknown_format"),
        ('{"kind": "Deployment", "metadata": {}, "spec": {}, "status": {}}', "unknown_format"),
        ("[1, 2]", "unknown_format"),
        ("[[{}]]", "unknown_format"),
        ("{}", "unknown_format"),
        ("2024-13-26T16:21:04.076718973+01:00 stderr F x", "bad_timestamp"),  # CRI, no date
        ("Traceback (most recent call last):", "unknown_format"),
        ("INFO 03-14 09:00:01 [api_server.py:1] started", "unknown_format"),  # no identity
        ("0, 79000 MiB", "unknown_format"),  # nvidia-smi: used, free or total?
        ('{"level": "info", "msg": "x", "time": "2024-01-01T00:00:00Z"}', "unknown_format"),
        ('{"log": 5, "@timestamp": 1}', "missing_field"),
        ('{"log": "x"}', "missing_field"),
        ('{"log": "x", "@timestamp": "noon"}', "bad_timestamp"),
        ('{"log": "x", "@timestamp": 1e400}', "bad_timestamp"),  # json reads Infinity
        ('{"log": "x", "@timestamp": ' + "9" * 4000 + "}", "bad_timestamp"),
        ('{"kind": "Pod", "status": {"phase": "Pending"}}', "missing_field"),
        ('{"kind": "PodList", "items": [{"kind": "Pod"}, 5]}', "missing_field"),
        ('DCGM_FI_DEV_FB_USED{UUID="GPU-1"} 79000', "missing_timestamp"),
        ('DCGM_FI_DEV_FB_USED{UUID="GPU-1"} many 1', "bad_value"),
        (
            '{"name": "x", "value": "v", "labels": {}, "timestamp": "2024-12-17T10:00:01Z"}',
            "bad_value",
        ),
    ],
)
def test_rejects(raw: bytes | str, reason: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_record(raw, SRC)
    assert err.value.reason == reason


def test_identity_is_a_keyword_only_parameter_defaulting_to_none() -> None:
    param = inspect.signature(parse_record).parameters["identity"]
    assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is None


def test_plain_line_with_identity() -> None:
    identity = LogIdentity("llm", "vllm-0", "vllm", workload="vllm", cluster="prod")
    line = f"(EngineCore pid=112) ERROR 03-14 09:00:01 [core.py:1131] {OOM}"
    (sig,) = parse_record(line, SRC, default_time=1741942800.0, identity=identity)
    assert sig.kind is SignalKind.GPU_OOM and sig.time == 1741942801.0  # 2025-03-14T09:00:01Z
    assert (sig.namespace, sig.pod, sig.container, sig.cluster) == ("llm", "vllm-0", "vllm", "prod")
    assert sig.owner == ("Deployment", "vllm")
    with pytest.raises(ParseError) as err:
        parse_record(line, SRC, identity=identity)  # month-day needs a year
    assert err.value.reason == "missing_timestamp"


def test_pretty_printed_documents_may_exceed_max_bytes() -> None:
    document = json.dumps({"kind": "List", "items": [POD] * 3000}, indent=2)
    assert len(document) > MAX_RECORD_BYTES and document.startswith("{\n")
    assert len(parse_record(document, SRC)) == 3000
    assert len(parse_record("\n  " + document.encode().decode(), SRC)) == 3000
    assert len(parse_record(document.encode(), SRC, max_bytes=100)) == 3000
    with pytest.raises(ParseError) as err:
        parse_record(document.replace("\n", " "), SRC)
    assert err.value.reason == "too_large"


def test_max_bytes_can_be_raised_for_whole_file_documents() -> None:
    big = {"kind": "List", "items": [POD] * 5000}
    raw = json.dumps(big)
    assert len(raw) > MAX_RECORD_BYTES
    with pytest.raises(ParseError):
        parse_record(raw, SRC)
    assert len(parse_record(raw, SRC, max_bytes=len(raw))) == 5000


# --- any input: ParseError or a list of signals, never another exception -------------------

_KEYS = st.sampled_from(
    [
        "log", "message", "kubernetes", "@timestamp", "time", "timestamp", "date", "labels",
        "value", "name", "__name__", "__value__", "__timestamp__", "involvedObject", "regarding",
        "reason", "note", "count", "series", "lastTimestamp", "firstTimestamp", "eventTime",
        "metadata", "kind", "items", "status", "spec", "event", "body", "object", "source",
        "containerStatuses", "state", "lastState", "terminated", "waiting", "exitCode",
        "restartCount", "conditions", "phase", "ready", "pod_name", "namespace_name",
        "pod_owner", "file", "source_type", "ownerReferences", "controller", "fieldPath",
        "lastObservedTime", "finishedAt", "startedAt", "lastTransitionTime", "type", "host",
        "attrs", "path", "msg", "deprecatedLastTimestamp", "deprecatedSource",
        "reportingController", "reportingInstance", "deprecatedCount",
    ]
)  # fmt: skip
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(
        [
            "Pod", "List", "PodList", "Event", "Node", "BackOff", "OOMKilled", "SystemOOM",
            "CrashLoopBackOff", "Running", "Error", "kubernetes_logs", "2024-12-17T10:00:01Z",
            "1734429601.5", "Back-off restarting failed container x", "ReplicaSet/x", "79000",
            "DCGM_FI_DEV_FB_USED", "vllm:kv_cache_usage_perc", "NaN", "+Inf", OOM, ACCESS,
            json.dumps(EVENT),
        ]
    )
    | st.text(max_size=30)
)  # fmt: skip
_JSON = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=6),
    max_leaves=30,
)


def _ok(raw: bytes | str, default_time: float | None = None) -> None:
    try:
        signals = parse_record(raw, SRC, default_time=default_time)
    except ParseError as exc:
        assert exc.reason
        return
    assert isinstance(signals, list)
    for sig in signals:
        assert isinstance(sig.time, float)
        assert isinstance(sig.kind, SignalKind)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_any_bytes(raw: bytes) -> None:
    _ok(raw)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=512))
def test_any_text(raw: str) -> None:
    _ok(raw)


_IDENTITY = LogIdentity("llm", "vllm-0", "vllm", workload="StatefulSet/vllm")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text(max_size=300) | st.binary(max_size=300),
    st.sampled_from([None, 1734429601.0]),
    st.sampled_from(["topic", "/var/log/pods/llm_vllm-0_uid/vllm/0.log"]),
)
def test_any_record_with_an_identity(
    raw: str | bytes, default_time: float | None, origin: str
) -> None:
    try:
        signals = parse_record(
            raw, SourcePos(origin, 1), default_time=default_time, identity=_IDENTITY
        )
    except ParseError as exc:
        assert exc.reason
        return
    assert all(isinstance(s.time, float) for s in signals)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789-:.TZ+ stdoutrerPF[]/podvlm,MiBGPU", max_size=120))
def test_cri_and_csv_like_text(raw: str) -> None:
    _ok(raw, 1734429601.0)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON, st.sampled_from([None, 1734429601.0]))
def test_any_json(value: Any, default_time: float | None) -> None:
    _ok(json.dumps(value), default_time)


VALID = [POD, EVENT, SAMPLE, {"@timestamp": 1.0, "log": OOM, "kubernetes": K8S_FB}]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data())
def test_mutated_valid_records(base: dict[str, Any], data: st.DataObject) -> None:
    """Replace values at random depths of valid records with arbitrary JSON."""
    record = json.loads(json.dumps(base))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        target: Any = record
        while True:
            inner = list(target.values() if isinstance(target, dict) else target)
            inner = [v for v in inner if isinstance(v, dict | list) and v]
            if not inner or data.draw(st.booleans()):
                break
            target = data.draw(st.sampled_from(inner))
        if isinstance(target, dict):
            key = data.draw(st.sampled_from(sorted(target)) | _KEYS if target else _KEYS)
            target[key] = data.draw(_JSON)
        elif isinstance(target, list):
            target[data.draw(st.integers(0, len(target) - 1))] = data.draw(_JSON)
    _ok(json.dumps(record))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='abcDCGM_:{}=", 0123456789.#+-eINa\\\n', max_size=120))
def test_exposition_like_text(raw: str) -> None:
    _ok(raw, 1734429601.0)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='0123456789.:- []"/abcGETHTP', max_size=200))
def test_access_like_text(raw: str) -> None:
    _ok(raw)
    line = LogLine(time=1.0, text=raw)
    assert isinstance(signals_from_log(line, SRC), list)


def test_a_lone_surrogate_in_an_identity_field_is_rejected() -> None:
    record = (
        '{"@timestamp": 1741942800.0, "log": "torch.OutOfMemoryError: CUDA out of memory.\\n",'
        ' "kubernetes": {"pod_name": "vllm-7d9f8b6c5d-x2k4\\ud800", "namespace_name": "llm"}}'
    )
    with pytest.raises(ParseError) as info:
        parse_record(record, SourcePos("t", 1))
    assert info.value.reason == "invalid_unicode"
