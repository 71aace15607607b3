"""Fluent Bit records whose JSON line the kubernetes filter merged (Merge_Log On) -> signals.

Merge_Log puts the line's object beside the record's keys, or under Merge_Log_Key; Keep_Log Off
removes the ``log`` string once merged. Each placement reads as the ``log`` string would.
Source: https://docs.fluentbit.io/manual/pipeline/filters/kubernetes (Merge_Log, Merge_Log_Key,
Keep_Log) and filter_kubernetes/kubernetes.c ``pack_map_content`` (the record's keys first, then
the merged ones: a key of both decodes as the line's).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from access_json import Placement, json_access_line, place

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.fluentbit import merged_log, parse_fluentbit_record

SRC = SourcePos("fluent-bit", 1)
CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade" / "lb-access.jsonl"
PLACEMENTS: tuple[Placement, ...] = (
    "log", "top", "top_keep", "log_processed", "log_processed_keep",
)  # fmt: skip
K8S = {
    "pod_name": "ingress-nginx-controller-gbfq8rbfdr-j85qw",
    "namespace_name": "ingress-nginx",
    "container_name": "controller",
    "host": "cpu-node-01",
    "labels": {"app.kubernetes.io/name": "ingress-nginx"},
}
# fluent/fluent-bit#9943: the ingress-nginx controller's record after K8S-Logging.Parser (a
# custom regex parser) merged the access line at the top level, Keep_Log On. The issue's
# excerpt ends at "upstream_response_leng...": the last four fields are the line's own values.
ISSUE_9943 = {
    "time": "2025-02-26T11:03:45.796656589Z",
    "stream": "stdout",
    "_p": "F",
    "log": '10.42.1.0 - - [26/Feb/2025:11:03:45 +0000] "GET /loki-ruler?delimiter=&list-type=2'
    '&prefix=rules%2F HTTP/1.1" 200 247 "-" "aws-sdk-go/1.44.315 (go1.21.3; linux; amd64)" 504 '
    "0.009 [eole3-minio-minio-9000] [] 10.42.3.96:9000 247 0.009 200 "
    "292df5de9d6aa9479706832e9870abae",
    "host": "10.42.1.0",
    "user": "-",
    "method": "GET",
    "path": "/loki-ruler?delimiter=&list-type=2&prefix=rules%2F",
    "code": "200",
    "size": "247",
    "referer": "-",
    "agent": "aws-sdk-go/1.44.315 (go1.21.3; linux; amd64)",
    "request_length": "504",
    "request_time": "0.009",
    "proxy_upstream_name": "eole3-minio-minio-9000",
    "upstream_addr": "10.42.3.96:9000",
    "upstream_response_length": "247",
    "upstream_response_time": "0.009",
    "upstream_status": "200",
    "req_id": "292df5de9d6aa9479706832e9870abae",
    "kubernetes": {"pod_name": "ingress-nginx-controller-5d8f", "namespace_name": "ingress-nginx"},
}


def _cascade_records() -> list[dict[str, Any]]:
    """The bundled controller records that hold an access line (2 of them: a 200 and a 502)."""
    out = []
    for raw in CASCADE.read_text(encoding="utf-8").splitlines():
        record = json.loads(raw)
        if " 502 " in record["log"] or not out:
            out.append(record)
        if len(out) == 2:
            return out
    raise AssertionError("no 502 in the bundled access log")


def _lb(record: dict[str, Any]) -> Signal:
    (sig,) = parse_record(json.dumps(record), SRC)
    assert sig.kind is SignalKind.LB_RESPONSE
    return sig


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_placement_reads_as_the_log_string(placement: Placement) -> None:
    for record in _cascade_records():
        line = json_access_line(record["log"].rstrip("\n"))
        assert line is not None
        text = _lb(record)  # the default text format, as recorded
        merged = copy.deepcopy(record)
        place(merged, line, placement)
        sig = _lb(merged)
        assert sig.attrs == text.attrs
        assert (sig.time, sig.pod, sig.namespace, sig.node) == (
            text.time,
            text.pod,
            text.namespace,
            text.node,
        )


def test_a_parser_annotation_merged_line_with_and_without_keep_log() -> None:
    """fluent-bit#9943: Keep_Log On reads the text line; Keep_Log Off the merged fields."""
    kept = _lb(ISSUE_9943)
    assert kept.attrs["upstream"] == "eole3-minio-minio-9000" and kept.attrs["status"] == 200
    merged = {k: v for k, v in ISSUE_9943.items() if k != "log"}
    sig = _lb(merged)
    for key in ("status", "upstream", "upstream_addr", "upstream_status", "request_bytes"):
        assert sig.attrs[key] == kept.attrs[key], key
    assert sig.time == kept.time  # the record's time: the CRI parser's


def test_merged_application_log_and_exported_event_still_give_their_signals() -> None:
    """Any JSON line read from ``log`` reads the same merged: an OOM, an exported Event."""
    # a Python service's JSON log line (fluent-bit#1443), its message an OOM
    app = {
        "v": 0,
        "level": 40,
        "name": "root",
        "pid": 1,
        "msg": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
        "has a total capacity of 79.15 GiB of which 1.02 GiB is free.",
        "time": "2019-07-04T15:08:23.983Z",
    }
    vllm = {**K8S, "pod_name": "vllm-llama-7d9f8b6c5d-x2kqz", "namespace_name": "llm"}
    base = {"@timestamp": 1562252903.98, "stream": "stderr", "kubernetes": vllm}
    for record in (
        {**base, "log": json.dumps(app)},  # Merge_Log Off
        {**base, **app},  # Merge_Log On, Keep_Log Off
        {**base, "log_processed": app},  # Merge_Log_Key log_processed, Keep_Log Off
    ):
        (sig,) = parse_record(json.dumps(record), SRC)
        assert sig.kind is SignalKind.GPU_OOM and sig.pod == "vllm-llama-7d9f8b6c5d-x2kqz"
    # kubernetes-event-exporter's stdout sink: the Event object, its own "message" merged too
    event = {
        "metadata": {"name": "vllm-0.17a", "namespace": "llm"},
        "involvedObject": {"kind": "Pod", "name": "vllm-0", "namespace": "llm"},
        "reason": "BackOff",
        "message": "Back-off restarting failed container vllm in pod vllm-0_llm(uid)",
        "lastTimestamp": "2024-12-17T10:00:00Z",
        "count": 3,
        "type": "Warning",
    }
    exporter = {**K8S, "pod_name": "event-exporter-0", "namespace_name": "monitoring"}
    record = {"@timestamp": 1734429600.5, "stream": "stdout", "kubernetes": exporter, **event}
    (sig,) = parse_record(json.dumps(record), SRC)
    assert sig.kind is SignalKind.CRASH_LOOP and sig.pod == "vllm-0"


def test_renamed_log_still_reads_its_message() -> None:
    record = {"@timestamp": 1.0, "message": "INFO ok\n", "kubernetes": K8S, "cluster": "prod"}
    assert merged_log(record) is None
    assert parse_fluentbit_record(record).text == "INFO ok"


@pytest.mark.parametrize(
    ("record", "reason", "says"),
    [
        # Keep_Log Off after merging an empty object: nothing of the line is left
        ({"@timestamp": 1.0, "stream": "stdout", "kubernetes": K8S}, "missing_field", "Keep_Log"),
        # merged at the top level without the kubernetes filter, in no format known
        (
            {"@timestamp": 1.0, "stream": "stdout", "level": "info", "msg": "x"},
            "unknown_format",
            "Keep_Log On",
        ),
        # the merged access line with no HTTP status: rejected, not dropped
        (
            {"@timestamp": 1.0, "kubernetes": K8S, "status": "", "proxy_upstream_name": "a-b-80"},
            None,
            "",
        ),
        (
            {"@timestamp": 1.0, "kubernetes": K8S, "status": "-", "upstream_addr": "10.0.0.1:80"},
            "bad_value",
            "no HTTP status",
        ),
    ],
)
def test_records_that_still_cannot_be_read_say_what_to_change(
    record: dict[str, Any], reason: str | None, says: str
) -> None:
    if reason is None:  # an unset $status is no access line: read as any JSON line, no signal
        assert parse_record(json.dumps(record), SRC) == []
        return
    with pytest.raises(ParseError) as err:
        parse_record(json.dumps(record), SRC)
    assert err.value.reason == reason
    assert says in err.value.detail
