"""Replay the bundled cascade as each shipper of ``deploy/shipping/`` writes it: same incident.

Each stream's records are rewritten, every value kept, into the record shape the shipper's
configuration emits (documented at the top of each configuration file) and replayed with
``detector replay``; each replay must find what the original finds: the same incident key,
stage, victims, signals and coverage, every record read, none rejected.

- Fluent Bit (``fluent-bit/fluent-bit.yaml``): the tail input's CRI parser (``time``,
  ``stream``, ``_p``, ``log`` without its newline), the kubernetes filter's ``kubernetes``,
  out_kafka's ``@timestamp`` (double) and the Lua filter's ``workload_key``, computed by running
  ``workload_key.lua`` in LuaJIT. Sources: https://docs.fluentbit.io/manual/pipeline/outputs/kafka ,
  https://docs.fluentbit.io/manual/pipeline/filters/kubernetes , fluent/fluent-bit#6132
  (``/work/shared/corpus/envelopes/fluentbit_kafka_record_2022_containerd.txt``).
- Vector ``kubernetes_logs`` (``vector/vector-agent.yaml``): the documented output fields
  (file, kubernetes.{container_id, container_image, container_name, namespace_labels,
  pod_labels, pod_name, pod_namespace, pod_node_name, pod_owner, pod_uid}, message,
  source_type, stream, timestamp), nested as the json codec writes them. Source:
  https://github.com/vectordotdev/vector/blob/master/website/cue/reference/components/sources/kubernetes_logs.cue
- kubernetes-event-exporter -> Vector ``http_server`` (``vector/vector-aggregator.yaml``): the
  exporter's Event as it posts it, plus ``path``, ``source_type`` and ``timestamp`` (the
  source's legacy log namespace). Sources:
  https://vector.dev/docs/reference/configuration/sources/http_server/ ,
  https://github.com/resmoio/kubernetes-event-exporter/blob/master/pkg/sinks/webhook.go
- Prometheus ``remote_write`` -> Vector ``prometheus_remote_write`` (same file): every sample a
  gauge metric event (name, tags, timestamp, kind absolute, gauge.value). Sources:
  https://vector.dev/docs/reference/configuration/sources/prometheus_remote_write/ ,
  https://vector.dev/docs/architecture/data-model/metric/
- OpenTelemetry Collector (``otel-collector/otelcol.yaml``): the kafka exporter's ``otlp_json``
  requests after ``transform/workload`` (the resource keeps the namespace and the controller,
  each record every other attribute: the container operator's ``log.iostream``,
  ``log.file.path``, k8sattributes' pod, node, owner and ``k8s.pod.labels.*``), a few records
  of one pod per request; Events as the k8sobjects receiver's watch records (the body a map
  ``{type, object}``). Sources: https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding ,
  opentelemetry-collector-contrib's pkg/stanza/docs/operators/container.md,
  processor/k8sattributesprocessor and receiver/k8sobjectsreceiver READMEs.
- prometheus-kafka-adapter and kubernetes-event-exporter's own Kafka sink: the bundled
  ``gpu-metrics.jsonl`` and ``k8s-events.jsonl`` are already their shapes (the original replay).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lupa.luajit21 import LuaRuntime

from detector.config import Settings
from detector.pipeline import replay
from detector.report.document import ReplayResult, to_document
from detector.stream.app import keyed_records

REPO = Path(__file__).resolve().parents[2]
CASCADE = REPO / "examples" / "cascade"
SHIPPING = REPO / "deploy" / "shipping"
UPSTREAM_NAMESPACES = "llm,default"  # the namespaces the bundled ingress routes to

Record = dict[str, Any]


def fluentbit_key(monkeypatch: pytest.MonkeyPatch) -> Callable[[Record], Record]:
    """Return the Fluent Bit Lua filter of ``deploy/shipping``, run in LuaJIT (as Fluent Bit)."""
    monkeypatch.setenv("UPSTREAM_NAMESPACES", UPSTREAM_NAMESPACES)
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.execute((SHIPPING / "fluent-bit" / "workload_key.lua").read_text())
    call = lua.globals().workload_key

    def run(record: Record) -> Record:
        code, _, out = call(
            "kube.var.log.containers.x", 0.0, lua.table_from(record, recursive=True)
        )
        assert code in (0, 2)
        return {**record, "workload_key": out["workload_key"]} if code == 2 else record

    return run


def fluentbit_cri(record: Record, key: Callable[[Record], Record]) -> Record:
    """A bundled (docker json-file) record as Fluent Bit's CRI parser + filters + out_kafka."""
    out = {"@timestamp": record["@timestamp"], "time": record["time"], "stream": record["stream"]}
    out |= {"_p": "F", "log": record["log"].removesuffix("\n"), "kubernetes": record["kubernetes"]}
    return key(out)


def vector_log(record: Record) -> Record:
    """A bundled record as Vector's kubernetes_logs event (json codec), with its key."""
    k8s = record["kubernetes"]
    labels = k8s.get("labels", {})
    ns, pod, container = k8s["namespace_name"], k8s["pod_name"], k8s["container_name"]
    meta = {
        "container_id": f"containerd://{k8s['docker_id']}",
        "container_image": k8s["container_image"],
        "container_name": container,
        "namespace_labels": {"kubernetes.io/metadata.name": ns},
        "pod_labels": labels,
        "pod_name": pod,
        "pod_namespace": ns,
        "pod_node_name": k8s["host"],
        "pod_uid": k8s["pod_id"],
    }
    if "pod-template-hash" in labels:
        meta["pod_owner"] = f"ReplicaSet/{pod.rsplit('-', 1)[0]}"
    return {
        "file": f"/var/log/pods/{ns}_{pod}_{k8s['pod_id']}/{container}/0.log",
        "kubernetes": meta,
        "message": record["log"].removesuffix("\n"),
        "source_type": "kubernetes_logs",
        "stream": record["stream"],
        "timestamp": record["time"],
    }


def vector_http_event(record: Record) -> Record:
    """An exporter's Event as Vector's http_server source decodes the webhook's JSON body."""
    received = record.get("lastTimestamp") or record["metadata"]["creationTimestamp"]
    return {**record, "path": "/", "source_type": "http_server", "timestamp": received}


def vector_remote_write(record: Record) -> Record:
    """An adapter sample as Vector's prometheus_remote_write source makes it: a gauge."""
    tags = {k: v for k, v in record["labels"].items() if k != "__name__"}
    return {
        "name": record["name"],
        "tags": tags,
        "timestamp": record["timestamp"],
        "kind": "absolute",
        "gauge": {"value": float(record["value"])},
    }


def otlp_value(value: Any) -> dict[str, Any]:
    """Return ``value`` as an OTLP/JSON ``AnyValue`` (int64 as a decimal string)."""
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": otlp_attributes(value)}}
    if isinstance(value, list):
        return {"arrayValue": {"values": [otlp_value(v) for v in value]}}
    return {}


def otlp_attributes(values: Record) -> list[Record]:
    return [{"key": k, "value": otlp_value(v)} for k, v in values.items()]


def otlp_log_record(record: Record) -> tuple[Record, Record]:
    """Return (resource attributes, log record) of a bundled line after transform/workload."""
    k8s = record["kubernetes"]
    ns, pod, container = k8s["namespace_name"], k8s["pod_name"], k8s["container_name"]
    resource = {"k8s.namespace.name": ns}
    attrs = {
        "log.iostream": record["stream"],
        "logtag": "F",
        "log.file.path": f"/var/log/pods/{ns}_{pod}_{k8s['pod_id']}/{container}/0.log",
        "k8s.namespace.name": ns,
        "k8s.pod.name": pod,
        "k8s.pod.uid": k8s["pod_id"],
        "k8s.container.name": container,
        "k8s.container.restart_count": "0",
        "k8s.node.name": k8s["host"],
    }
    if "pod-template-hash" in k8s.get("labels", {}):
        resource["k8s.deployment.name"] = pod.rsplit("-", 2)[0]
        attrs["k8s.replicaset.name"] = pod.rsplit("-", 1)[0]
        attrs["k8s.deployment.name"] = resource["k8s.deployment.name"]
    attrs |= {f"k8s.pod.labels.{k}": v for k, v in k8s.get("labels", {}).items()}
    nanos = round(record["@timestamp"] * 1e9)
    log = {
        "timeUnixNano": str(nanos),
        "observedTimeUnixNano": str(nanos),
        "body": otlp_value(record["log"].removesuffix("\n")),
        "attributes": otlp_attributes(attrs),
    }
    return resource, log


def otlp_requests(records: list[Record], per_request: int = 8) -> Iterator[Record]:
    """Yield OTLP/JSON logs requests of up to ``per_request`` consecutive lines of one pod."""
    batch: list[Record] = []
    resource: Record | None = None
    for record in records:
        res, log = otlp_log_record(record)
        if batch and (res != resource or len(batch) == per_request):
            yield _request(resource or {}, batch)
            batch = []
        resource = res
        batch.append(log)
    if batch:
        yield _request(resource or {}, batch)


def _request(resource: Record, logs: list[Record]) -> Record:
    scope = {"scope": {}, "logRecords": logs}
    return {
        "resourceLogs": [
            {"resource": {"attributes": otlp_attributes(resource)}, "scopeLogs": [scope]}
        ]
    }


def otlp_event(record: Record) -> Record:
    """An Event as the k8sobjects receiver (watch mode) logs it: the watch event as the body."""
    change = "ADDED" if record.get("count", 1) == 1 else "MODIFIED"
    body = otlp_value({"type": change, "object": record})
    return _request({}, [{"observedTimeUnixNano": "0", "body": body}])


def _keyed(path: Path) -> Iterator[tuple[bytes | None, Record]]:
    for key, value, _ in keyed_records([path], Settings()):
        yield key, json.loads(value)


def _rewrite(folder: Path, name: str, convert: Callable[[Record], Record], keyed: bool) -> None:
    """Rewrite ``folder/name`` record by record; a keyed shape gets the workload's key."""
    lines = []
    for key, record in _keyed(CASCADE / name):
        out = convert(record)
        if keyed and key is not None and "workload_key" not in out:
            target = out.get("tags", out)
            target["workload_key"] = key.decode()
        lines.append(json.dumps(out, separators=(",", ":")))
    (folder / name).write_text("\n".join(lines) + "\n")


def _replay(folder: Path, db: Path) -> ReplayResult:
    settings = Settings()
    settings.database.url = f"sqlite:///{db}"
    return replay([folder], settings)


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return to_document(_replay(CASCADE, tmp_path_factory.mktemp("original") / "d.db"))


def _same_incident(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["events"]["rejected"] == 0, after["events"]["rejected_by_reason"]
    for key in ("read", "parsed", "signals", "unattributed"):
        assert after["events"][key] == before["events"][key], key
    (inc_before,), (inc_after,) = before["incidents"], after["incidents"]
    for key in ("key", "workload", "stage", "pods", "signals", "coverage"):
        assert inc_after[key] == inc_before[key], key
    assert inc_after["stage"] == "contained" and len(inc_after["pods"]) == 4
    assert [t["message"] for t in inc_after["timeline"]] == [
        t["message"] for t in inc_before["timeline"]
    ]


def test_fluent_bit_records_find_the_same_incident(
    original: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "fluent-bit"
    shutil.copytree(CASCADE, folder)
    key = fluentbit_key(monkeypatch)
    for name in ("container-logs.jsonl", "lb-access.jsonl"):
        _rewrite(folder, name, lambda r: fluentbit_cri(r, key), keyed=False)
    first = json.loads((folder / "container-logs.jsonl").read_text().splitlines()[0])
    assert first["_p"] == "F" and not first["log"].endswith("\n")
    assert first["workload_key"] == "llm/vllm-llama"
    _same_incident(original, to_document(_replay(folder, tmp_path / "d.db")))


def test_vector_records_find_the_same_incident(original: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "vector"
    shutil.copytree(CASCADE, folder)
    _rewrite(folder, "container-logs.jsonl", vector_log, keyed=True)
    _rewrite(folder, "lb-access.jsonl", vector_log, keyed=True)
    _rewrite(folder, "k8s-events.jsonl", vector_http_event, keyed=True)
    _rewrite(folder, "gpu-metrics.jsonl", vector_remote_write, keyed=True)
    metric = json.loads((folder / "gpu-metrics.jsonl").read_text().splitlines()[0])
    assert metric["kind"] == "absolute" and metric["tags"]["workload_key"] == "llm/vllm-llama"
    _same_incident(original, to_document(_replay(folder, tmp_path / "d.db")))


@pytest.mark.parametrize("per_request", [1, 8])
def test_otel_collector_records_find_the_same_incident(
    original: dict[str, Any], tmp_path: Path, per_request: int
) -> None:
    """One line per message replays identically; several per message give the same incident,
    stages and victims, but evidence is kept once per Kafka record (its source position), so
    lines of one message that say the same kind of thing (engine_config, request_held) keep
    fewer timeline entries."""
    folder = tmp_path / "otel"
    shutil.copytree(CASCADE, folder)
    for name in ("container-logs.jsonl", "lb-access.jsonl"):
        records = [json.loads(x) for x in (CASCADE / name).read_text().splitlines()]
        requests = [
            json.dumps(r, separators=(",", ":")) for r in otlp_requests(records, per_request)
        ]
        assert (len(requests) < len(records)) == (per_request > 1)
        (folder / name).write_text("\n".join(requests) + "\n")
    _rewrite(folder, "k8s-events.jsonl", otlp_event, keyed=False)
    after = to_document(_replay(folder, tmp_path / "d.db"))
    assert after["events"]["rejected"] == 0, after["events"]["rejected_by_reason"]
    assert after["events"]["signals"] == original["events"]["signals"]
    (inc_before,), (inc_after,) = original["incidents"], after["incidents"]
    for key in ("key", "workload", "stage", "pods", "signals", "coverage"):
        assert inc_after[key] == inc_before[key], key

    def told(doc: dict[str, Any]) -> list[str]:
        return [
            t["message"]
            for t in doc["timeline"]
            if per_request == 1 or t["kind"] == "stage" or t["message"].startswith("victim #")
        ]

    assert told(inc_after) == told(inc_before) and len(told(inc_after)) >= 6
