"""The shared corpus of real records: parsed as its FILE_NOTES say, or rejected with a reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ParseError
from detector.events.detect import parse_record, signals_from_log
from detector.events.model import LogLine, Signal, SignalKind, SourcePos
from detector.events.reader import read_records
from detector.events.sources.timeparse import parse_iso8601
from detector.events.sources.vector import parse_vector_event

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
pytestmark = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")

REASONS = {
    "too_large",
    "not_utf8",
    "malformed_json",
    "unknown_format",
    "missing_field",
    "missing_timestamp",
    "bad_timestamp",
    "bad_value",
    "malformed_metric",
}
SCRAPE = 1734429601.0


def _parse_file(path: Path) -> list[list[Signal] | ParseError]:
    out: list[list[Signal] | ParseError] = []
    for source, raw in read_records([path]):
        try:
            out.append(parse_record(raw, source, default_time=SCRAPE))
        except ParseError as exc:
            out.append(exc)
    return out


def _signals(path: Path) -> list[Signal]:
    results = _parse_file(path)
    assert not [r for r in results if isinstance(r, ParseError)], path.name
    return [s for r in results if isinstance(r, list) for s in r]


@pytest.mark.parametrize("folder", ["envelopes", "k8s", "lb", "gpu_metrics"])
def test_every_record_parses_or_is_rejected_with_a_reason(folder: str) -> None:
    for path in sorted((CORPUS / folder).iterdir()):
        for result in _parse_file(path):
            if isinstance(result, ParseError):
                assert result.reason in REASONS, (path.name, result)
            else:
                assert all(isinstance(s, Signal) for s in result)


# --- envelopes/ ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("fluentbit_kafka_record_2022_containerd.txt", "malformed_json"),  # truncated in source
        ("tgi_json_output_C_v3_router_top_level_message_TRUNCATED.log", "malformed_json"),
    ],
)
def test_envelopes_rejected(name: str, reason: str) -> None:
    results = _parse_file(CORPUS / "envelopes" / name)
    assert results
    assert all(isinstance(r, ParseError) and r.reason == reason for r in results)


@pytest.mark.parametrize(
    "name", ["vector_kubernetes_logs_2020_kubectl_prefix.log", "cri_log_lines.log"]
)
def test_envelopes_parsed(name: str) -> None:
    results = _parse_file(CORPUS / "envelopes" / name)
    assert results
    assert not any(isinstance(r, ParseError) for r in results)


def test_vector_2020_lines_once_the_kubectl_prefix_is_gone() -> None:
    path = CORPUS / "envelopes" / "vector_kubernetes_logs_2020_kubectl_prefix.log"
    for text in path.read_text().splitlines():
        event = json.loads(text.split("] ", 1)[1])
        line = parse_vector_event(event)
        assert (line.namespace, line.pod) == ("kube-system", "coredns-fd565d9f8-xdrjp")
        assert line.container == "coredns"  # no container_name in 2020: read from the file path
        assert line.node is None and line.stream == "stdout"


def test_vector_docs_sample_on_the_wire() -> None:
    """The documented sample is CUE with dotted keys; on the wire the keys are nested."""
    doc = (CORPUS / "envelopes" / "vector_kubernetes_logs_docs_sample.txt").read_text()
    message = doc.split("input:\n", 1)[1].split("\n", 1)[0].replace('\\"', '"')
    event = {
        "file": "/var/log/pods/kube-system_storage-provisioner_93bde4d0-9731-4785-a80e-"
        "cd27ba8ad7c2/storage-provisioner/1.log",
        "kubernetes": {
            "container_name": "storage-provisioner",
            "pod_labels": {"integration-test": "storage-provisioner"},
            "pod_name": "storage-provisioner",
            "pod_namespace": "kube-system",
            "pod_node_name": "minikube",
        },
        "message": message,
        "source_type": "kubernetes_logs",
        "stream": "stderr",
        "timestamp": "2020-10-15T11:01:46.499555308Z",
    }
    for value in ("minikube", "2020-10-15T11:01:46.499555308Z", "F1015 11:01:46.499073"):
        assert value in doc
    line = parse_vector_event(event)
    assert line.text.startswith("F1015 11:01:46.499073       1 main.go:39] error getting")
    assert (line.namespace, line.pod, line.container, line.node) == (
        "kube-system",
        "storage-provisioner",
        "storage-provisioner",
        "minikube",
    )
    assert line.time == pytest.approx(parse_iso8601("2020-10-15T11:01:46.499555Z"))
    assert parse_record(json.dumps(event), SourcePos("doc", 1)) == []  # a klog line, no signal


# --- k8s/ (the JSON files) -----------------------------------------------------------------------


def _one_record(path: Path) -> dict[str, Any]:
    (record,) = list(read_records([path]))[:1]
    obj: dict[str, Any] = json.loads(record[1])
    return obj


def _as_backoff(event: dict[str, Any]) -> dict[str, Any]:
    event = dict(event, reason="BackOff", type="Warning", count=4)
    event["message"] = "Back-off restarting failed container"
    return event


@pytest.mark.parametrize(
    "name",
    [
        "event_core_v1_openshift_eventrouter_envelope.jsonl",
        "event_core_v1_otel_stanza_k8s_event_input.json",
        "events_fluentbit_kubernetes_events_input.jsonl",
        "kubernetes_event_exporter_stdout_sink.jsonl",
    ],
)
def test_k8s_json_events_parse_to_no_signal(name: str) -> None:
    """Created / Pulling / Starting / Scheduled / SuccessfulCreate: Normal events, no signal."""
    assert _signals(CORPUS / "k8s" / name) == []


@pytest.mark.parametrize(
    ("name", "path", "identity"),
    [
        (
            "event_core_v1_openshift_eventrouter_envelope.jsonl",
            ("event",),
            {"pod": "redhat-operators-w8svm", "container": "registry-server", "node": "master-0"},
        ),
        (
            "event_core_v1_otel_stanza_k8s_event_input.json",
            ("body",),
            {"pod": "stanza-g6rzd", "container": "stanza", "node": "kube-master-1"},
        ),
        (
            "events_fluentbit_kubernetes_events_input.jsonl",
            (),
            {"pod": None, "namespace": None, "node": "events-exporter-test-control-plane"},
        ),
        (
            "kubernetes_event_exporter_stdout_sink.jsonl",
            (),
            {"pod": None, "namespace": "monitoring", "owner": ("Deployment", "event-exporter")},
        ),
    ],
)
def test_k8s_json_envelopes_are_understood(
    name: str, path: tuple[str, ...], identity: dict[str, Any]
) -> None:
    """The same records turned into BackOff events carry the identity of their envelope."""
    record = _one_record(CORPUS / "k8s" / name)
    target = record
    for key in path:
        target = target[key]
    target.update(_as_backoff(target))
    (sig,) = parse_record(json.dumps(record), SourcePos(name, 1))
    assert sig.kind is SignalKind.CRASH_LOOP and sig.attrs["count"] == 4
    for key, value in identity.items():
        assert getattr(sig, key) == value, key


# --- lb/ingress_nginx_access.jsonl -------------------------------------------------------------


def _lb_rows() -> list[dict[str, Any]]:
    path = CORPUS / "lb" / "ingress_nginx_access.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("row", _lb_rows(), ids=lambda r: r["expect"])
def test_ingress_nginx_corpus_lines(row: dict[str, Any]) -> None:
    """Access lines give LB_RESPONSE with their status; error_log lines give theirs, marked.

    error_log upstream failures carry ``error_log=True`` (the access line of the same request
    names the upstream; the error line only its address); limit_req rejections are 429 with
    ``rate_limited=True`` whatever status the client got. A paste fragment that starts
    mid-line (no request head, so no status of its own) is knowingly not counted; a JSON
    log-format-upstream line cut off in the source is rejected, saying so (a dead letter, never
    dropped in silence). All lb/ rows: tests/unit/test_sources_lb_corpus.py.
    """
    line = LogLine(time=SCRAPE, text=row["text"], namespace="ingress-nginx", pod="ctrl-0")
    if row["expect"] == "lb_client_abort_with_upstream_5xx":  # the JSON line cut off
        with pytest.raises(ParseError, match="cut off") as err:
            signals_from_log(line, SourcePos("lb", 1))
        assert err.value.reason == "malformed_json"
        return
    lb = [s for s in signals_from_log(line, SourcePos("lb", 1)) if s.kind is SignalKind.LB_RESPONSE]
    if row["expect"] == "lb_5xx":
        (sig,) = lb
        assert sig.attrs["status"] == row["status"]
        assert sig.attrs["upstream"] is None
    elif row["expect"] == "lb_5xx_error_log":
        (sig,) = lb
        assert sig.attrs["status"] == row["status"] and sig.attrs["error_log"] is True
    elif row["expect"] == "lb_rate_limited_not_backend_failure":
        (sig,) = lb
        assert sig.attrs["status"] == 429 and sig.attrs["rate_limited"] is True
    else:
        assert lb == []


# --- gpu_metrics/ ----------------------------------------------------------------------------


def test_mig_scrape_without_fb_metrics_gives_no_memory_signal() -> None:
    """FB metrics missing for MIG instances: absence, not 0 MiB used."""
    assert _signals(CORPUS / "gpu_metrics" / "dcgm_exporter_h100_mig_ollama_masked.prom") == []


def test_lowercase_hostname_label() -> None:
    path = CORPUS / "gpu_metrics" / "dcgm_exporter_lowercase_hostname_label_triton.prom"
    full, mig = _signals(path)
    assert full.attrs == {
        "free_bytes": 11275 * 1048576,
        "gpu": "1",
        "uuid": "GPU-fc60126e-514d-3522-2828-c5daa8e99d85",
        "metric": "DCGM_FI_DEV_FB_FREE",
    }
    assert full.node == "dcgm-exporter-wwwjh" and full.pod is None
    assert mig.attrs["uuid"] == "GPU-63bc0b91-2265-1b94-831c-15c41fe92675/mig3"
    assert (mig.pod, mig.container, mig.namespace) == (
        "triton-server-f7cb5d77-95xcf",
        "triton-server",
        "default",
    )


def test_mps_shared_gpu_repeats_one_device_value_per_pod() -> None:
    path = CORPUS / "gpu_metrics" / "dcgm_exporter_mps_shared_gpu_vllm_duplicate_fb_used.prom"
    burn, vllm = _signals(path)
    assert burn.attrs == vllm.attrs  # same device, same number: never sum them
    assert burn.attrs["used_bytes"] == 15866 * 1048576
    assert (burn.pod, vllm.pod) == (
        "gpu-burn-deployment-1-85dc8ff699-clvh5",
        "vllm-medgemma-4b-it-d599b4c99-f95nk",
    )
    assert vllm.container == "vllm" and vllm.namespace == "vllm-inference"


def test_vllm_help_type_without_samples() -> None:
    assert _signals(CORPUS / "gpu_metrics" / "vllm_metrics_help_type_without_samples.prom") == []


def test_vllm_v0_names() -> None:
    signals = _signals(CORPUS / "gpu_metrics" / "vllm_metrics_v0_model_name_only.prom")
    assert [(s.kind, s.attrs) for s in signals] == [
        (
            SignalKind.ENGINE_PRESSURE,
            {
                "engine": "vllm",
                "requests_running": 0,
                "metric": "vllm:num_requests_running",
                "model": _QWEN,
            },
        ),
        (
            SignalKind.ENGINE_PRESSURE,
            {
                "engine": "vllm",
                "requests_waiting": 0,
                "metric": "vllm:num_requests_waiting",
                "model": _QWEN,
            },
        ),
        (
            SignalKind.ENGINE_PRESSURE,
            {
                "engine": "vllm",
                "kv_cache_usage": 0.0,
                "metric": "vllm:gpu_cache_usage_perc",
                "model": _QWEN,
            },
        ),
    ]


_QWEN = "Qwen/Qwen2.5-Coder-32B-Instruct"


def test_vllm_v1_names_and_created_gauges() -> None:
    (sig,) = _signals(CORPUS / "gpu_metrics" / "vllm_metrics_v1_engine_label_kv_cache_usage.prom")
    assert sig.attrs["kv_cache_usage"] == pytest.approx(9.75010481363281e-06)
    assert sig.attrs["metric"] == "vllm:kv_cache_usage_perc"


def test_dcgm_as_shown_by_grafana_has_no_value() -> None:
    (result,) = _parse_file(CORPUS / "gpu_metrics" / "dcgm_exporter_as_scraped_by_prometheus.txt")
    assert isinstance(result, ParseError) and result.reason == "missing_field"
