"""The shipper configurations of ``deploy/shipping/``: keys, topics and documented settings.

None of Fluent Bit, Vector or the OpenTelemetry Collector installs here (not in Debian 12, not
on PyPI or npm), so the configurations are checked against the keys each tool documents (the
URL beside each set) and against the detector: the topics it reads, the record shapes it
parses (the replays in ``tests/e2e/test_replay_shippers.py``) and the key it expects. Fluent
Bit's Lua key filter runs for real, in LuaJIT (``lupa``; Fluent Bit embeds LuaJIT), and must
give every record the key ``detector produce`` gives it. Vector's VRL cannot run here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa.luajit21 import LuaRuntime

from detector.config import Settings
from detector.correlate.identity import classify_pod
from detector.events.sources.dcgm import KNOWN_METRICS
from detector.stream.app import keyed_records

REPO = Path(__file__).resolve().parents[2]
SHIPPING = REPO / "deploy" / "shipping"
TOPICS = set(Settings().kafka.topics)  # k8s-logs, k8s-events, lb-logs, gpu-metrics

# https://docs.fluentbit.io/manual/administration/configuring-fluent-bit/yaml/service-section
FLUENT_BIT_SERVICE = {
    "flush", "log_level", "http_server", "http_listen", "http_port", "health_check",
    "parsers_file", "daemon", "grace", "hot_reload",
}  # fmt: skip
# https://docs.fluentbit.io/manual/pipeline/{inputs/tail, filters/kubernetes, filters/lua,
# filters/rewrite-tag, outputs/kafka}; every plugin takes name, match / tag, and rdkafka.* for kafka
FLUENT_BIT_PLUGINS = {
    "tail": {
        "tag", "path", "exclude_path", "multiline.parser", "db", "mem_buf_limit",
        "skip_long_lines", "refresh_interval", "read_from_head", "buffer_chunk_size",
        "buffer_max_size",
    },
    "kubernetes": {
        "match", "kube_tag_prefix", "kube_url", "labels", "annotations", "merge_log",
        "merge_log_key", "keep_log", "k8s-logging.exclude", "k8s-logging.parser",
        "use_kubelet", "buffer_size",
    },
    "lua": {"match", "script", "call", "code", "time_as_table"},
    "rewrite_tag": {
        "match", "rule", "emitter_name", "emitter_storage.type", "emitter_mem_buf_limit",
    },
    "kafka": {
        "match", "brokers", "topics", "format", "message_key", "message_key_field",
        "timestamp_key", "timestamp_format", "topic_key", "dynamic_topic", "queue_full_retries",
    },
}  # fmt: skip
# https://vector.dev/docs/reference/configuration/{sources,transforms,sinks}/<type>/
VECTOR_COMPONENTS = {
    "kubernetes_logs": {
        "type", "extra_label_selector", "extra_field_selector", "glob_minimum_cooldown_ms",
    },
    "http_server": {"type", "address", "decoding", "framing", "path", "method", "encoding"},
    "prometheus_remote_write": {"type", "address", "auth", "tls"},
    "remap": {"type", "inputs", "source", "file", "drop_on_error", "drop_on_abort"},
    "route": {"type", "inputs", "route"},
    "kafka": {
        "type", "inputs", "bootstrap_servers", "topic", "key_field", "compression",
        "encoding", "librdkafka_options", "headers_key", "acknowledgements", "batch",
    },
}  # fmt: skip
# https://github.com/open-telemetry/opentelemetry-collector-contrib/blob/main/exporter/kafkaexporter/config.go
OTEL_KAFKA_EXPORTER = {
    "brokers", "logs", "metrics", "traces", "partition_logs_by_resource_attributes",
    "partition_metrics_by_resource_attributes", "partition_traces_by_id", "producer",
    "sending_queue", "retry_on_failure", "timeout", "protocol_version", "auth",
}  # fmt: skip


def _yaml(*parts: str) -> Any:
    return yaml.safe_load(SHIPPING.joinpath(*parts).read_text())


def _lua_filter(namespaces: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    monkeypatch.setenv("UPSTREAM_NAMESPACES", namespaces)
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.execute((SHIPPING / "fluent-bit" / "workload_key.lua").read_text())
    call = lua.globals().workload_key

    def key(record: dict[str, Any]) -> str | None:
        code, _, out = call("kube.x", 0.0, lua.table_from(record, recursive=True))
        return str(out["workload_key"]) if code == 2 else None

    return key


@pytest.mark.parametrize("example", ["cascade", "host-oom", "upstream-5xx"])
def test_the_lua_filter_keys_every_record_as_detector_produce(
    example: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _lua_filter("llm,default,batch,shop", monkeypatch)
    files = [p for p in (REPO / "examples" / example).glob("*.jsonl") if "logs" in p.name]
    files += [p for p in (REPO / "examples" / example).glob("lb-*.jsonl")]
    checked = 0
    for path in sorted(set(files)):
        for want, value, _ in keyed_records([path], Settings()):
            record = json.loads(value)
            if want is not None and "kubernetes" in record:
                assert key(record) == want.decode(), record["log"][:200]
                checked += 1
    assert checked >= 50


@pytest.mark.parametrize(
    ("pod", "labels"),
    [
        ("vllm-llama-t4pz2q9s6-94dgz", {"pod-template-hash": "t4pz2q9s6"}),
        ("tgi-0", {"statefulset.kubernetes.io/pod-name": "tgi-0"}),
        ("sglang-1-2", {"leaderworkerset.sigs.k8s.io/name": "sglang"}),
        ("llama-predictor-6b9c7d8f5-abcde", {"serving.kserve.io/inferenceservice": "llama"}),
        ("vllm-canary-7d9f8b6c5d-x2kqz", {"rollouts-pod-template-hash": "7d9f8b6c5d"}),
        ("dcgm-exporter-x7k2p", {"pod-template-generation": "3"}),
        ("vllm-llama-7d9f8b6c5d-x2kqz", {}),
        ("triton-3", {}),
        ("standalone", {}),
    ],
)
def test_the_lua_filter_names_the_workload_as_the_detector(
    pod: str, labels: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _lua_filter("", monkeypatch)
    record = {"log": "x", "kubernetes": {"namespace_name": "ml", "pod_name": pod, "labels": labels}}
    assert key(record) == f"ml/{classify_pod(pod, labels, None)[1]}"


def test_an_access_line_is_keyed_by_its_upstream_longest_namespace_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = _lua_filter("llm, llm-prod", monkeypatch)
    line = (
        '10.0.0.1 - - [14/Mar/2025:09:03:40 +0000] "POST /v1/completions HTTP/1.1" 502 150 "-" '
        '"openai/1.0" 2048 7.496 [llm-prod-vllm-8000] [] 10.0.1.9:8000 0 7.496 502 abc'
    )
    ingress = {
        "namespace_name": "ingress-nginx",
        "pod_name": "ingress-nginx-controller-7d9f8b6c5d-x2kqz",
    }
    assert key({"log": line, "kubernetes": ingress}) == "llm-prod/vllm"
    assert key({"log": line.replace("llm-prod-", "other-"), "kubernetes": ingress}) == (
        "ingress-nginx/ingress-nginx-controller"
    )
    assert key({"log": line}) is None  # no kubernetes metadata: no key, the record unchanged


def test_fluent_bit_uses_documented_keys_and_the_detectors_topics_and_key() -> None:
    config = _yaml("fluent-bit", "fluent-bit.yaml")
    assert set(config["service"]) <= FLUENT_BIT_SERVICE
    plugins = [p for kind in ("inputs", "filters", "outputs") for p in config["pipeline"][kind]]
    for plugin in plugins:
        extra = set(plugin) - {"name"} - FLUENT_BIT_PLUGINS[plugin["name"]]
        assert not {k for k in extra if not k.startswith("rdkafka.")}, (plugin["name"], extra)
    outputs = config["pipeline"]["outputs"]
    assert {o["topics"] for o in outputs} == {"k8s-logs", "lb-logs"} < TOPICS
    for out in outputs:
        assert out["format"] == "json" and out["timestamp_format"] == "double"
        assert out["message_key_field"] == "workload_key"
        assert out["rdkafka.partitioner"] == "murmur2_random"  # kafka-python's, as produce
    (lua,) = [f for f in config["pipeline"]["filters"] if f["name"] == "lua"]
    script = (SHIPPING / "fluent-bit" / Path(lua["script"]).name).read_text()
    assert f"function {lua['call']}(tag, timestamp, record)" in script


def test_vector_uses_documented_keys_and_the_detectors_topics_and_key() -> None:
    topics = set()
    for name in ("vector-agent.yaml", "vector-aggregator.yaml"):
        config = _yaml("vector", name)
        for section in ("sources", "transforms", "sinks"):
            for cid, component in config[section].items():
                allowed = VECTOR_COMPONENTS[component["type"]]
                assert set(component) <= allowed, (cid, set(component) - allowed)
        for remap in (t for t in config["transforms"].values() if t["type"] == "remap"):
            assert "file" not in remap or (SHIPPING / "vector" / Path(remap["file"]).name).exists()
        for sink in config["sinks"].values():
            topics.add(sink["topic"])
            assert sink["key_field"] == "workload_key" and sink["encoding"] == {"codec": "json"}
            assert sink["librdkafka_options"]["partitioner"] == "murmur2_random"
    assert topics == TOPICS


def test_the_otel_collector_writes_otlp_json_on_the_detectors_topics() -> None:
    config = _yaml("otel-collector", "otelcol.yaml")
    exporters = config["exporters"]
    assert {e["logs"]["topic"] for e in exporters.values()} == {"k8s-logs", "lb-logs", "k8s-events"}
    for exporter in exporters.values():
        assert set(exporter) <= OTEL_KAFKA_EXPORTER and exporter["logs"]["encoding"] == "otlp_json"
    defined = {*config["receivers"], *config["processors"], *config["exporters"]}
    defined |= set(config["connectors"])
    for pipeline in config["service"]["pipelines"].values():
        for part in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(part, [])) <= defined
    statements = config["processors"]["transform/workload"]["log_statements"]
    assert statements[0]["context"] == "log" and statements[1]["context"] == "resource"


def test_events_and_metrics_reach_the_vector_aggregator() -> None:
    aggregator = _yaml("vector", "vector-aggregator.yaml")["sources"]
    exporter = _yaml("event-exporter", "config.yaml")
    (receiver,) = exporter["receivers"]
    assert receiver["webhook"]["sentUpdateEvent"] is True  # a BackOff's count rises by updates
    port = aggregator["event_exporter"]["address"].rsplit(":", 1)[1]
    assert receiver["webhook"]["endpoint"].endswith(f".svc:{port}/")
    (remote,) = _yaml("prometheus", "remote-write.yaml")["remote_write"]
    assert remote["url"].endswith(
        f".svc:{aggregator['remote_write']['address'].rsplit(':', 1)[1]}/"
    )
    (keep,) = remote["write_relabel_configs"]
    kept = set(keep["regex"].split("|"))
    engine_and_gpu = {m for m in KNOWN_METRICS if re.match(r"DCGM_|vllm:|tgi_|sglang:", m)}
    assert kept == engine_and_gpu
