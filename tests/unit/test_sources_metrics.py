"""dcgm-exporter / vLLM exposition lines and prometheus-kafka-adapter samples -> Signal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.reader import read_records
from detector.events.sources.dcgm import parse_labels, signals_from_exposition_line
from detector.events.sources.prom_kafka_adapter import signals_from_adapter_sample

FIXTURES = Path(__file__).parent / "fixtures"
SRC = SourcePos("metrics", 1)
SCRAPE = 1734429601.0
MIB = 1024 * 1024
FB_USED = (
    'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e",'
    'device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="gpu-node-1",'
    'container="vllm",namespace="llm",pod="vllm-llama-7d9f8b6c5d-x2kqz"} 79000'
)

SERIES = FB_USED.rsplit(" ", 1)[0]


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


@pytest.mark.parametrize("row", _rows("sources_dcgm_lines.jsonl"), ids=lambda r: r["text"][:30])
def test_real_dcgm_lines(row: dict[str, Any]) -> None:
    signals = signals_from_exposition_line(row["text"], SRC, default_time=SCRAPE)
    if row["expect"] is None:
        assert signals == []
        return
    (sig,) = signals
    expect = dict(row["expect"])
    assert sig.kind.value == expect.pop("kind")
    for key in ("pod", "namespace", "container", "node"):
        if key in expect:
            assert getattr(sig, key) == expect.pop(key), key
    for key, value in expect.items():
        assert sig.attrs[key] == value, key
    assert sig.time == SCRAPE


@pytest.mark.parametrize(
    ("line", "attr", "value"),
    [
        (FB_USED, "used_bytes", 79000 * MIB),
        (FB_USED.replace("FB_USED", "FB_FREE").replace("79000", "1000"), "free_bytes", 1000 * MIB),
        (
            FB_USED.replace("FB_USED", "FB_TOTAL").replace("79000", "81920"),
            "total_bytes",
            81920 * MIB,
        ),
    ],
)
def test_gpu_memory(line: str, attr: str, value: int) -> None:
    (sig,) = signals_from_exposition_line(line, SRC, default_time=SCRAPE)
    assert sig.kind is SignalKind.GPU_MEMORY
    assert sig.attrs[attr] == value
    assert sig.attrs["uuid"] == "GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e"
    assert sig.attrs["gpu"] == "0"
    assert (sig.pod, sig.namespace, sig.container, sig.node) == (
        "vllm-llama-7d9f8b6c5d-x2kqz",
        "llm",
        "vllm",
        "gpu-node-1",
    )


@pytest.mark.parametrize(
    ("line", "attrs"),
    [
        ('vllm:gpu_cache_usage_perc{model_name="m"} 0.97', {"kv_cache_usage": 0.97, "model": "m"}),
        ('vllm:kv_cache_usage_perc{engine="0",model_name="m"} 1.0', {"kv_cache_usage": 1.0}),
        ('vllm:num_requests_waiting{model_name="m"} 42.0', {"requests_waiting": 42}),
        ('vllm:num_requests_running{model_name="m"} 256.0', {"requests_running": 256}),
        ('vllm:num_preemptions_total{model_name="m"} 1234.0', {"preemptions": 1234}),
        ("sglang:token_usage 0.5", {"kv_cache_usage": 0.5, "engine": "sglang"}),
        ("tgi_queue_size 7", {"requests_waiting": 7, "engine": "tgi"}),
    ],
)
def test_engine_pressure(line: str, attrs: dict[str, Any]) -> None:
    (sig,) = signals_from_exposition_line(line, SRC, default_time=SCRAPE)
    assert sig.kind is SignalKind.ENGINE_PRESSURE
    for key, value in attrs.items():
        assert sig.attrs[key] == value


def test_line_timestamp_wins_over_scrape_time() -> None:
    (sig,) = signals_from_exposition_line(f"{FB_USED} 1734429600500", SRC, default_time=SCRAPE)
    assert sig.time == 1734429600.5


def test_exported_labels_win() -> None:
    line = (
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",pod="dcgm-exporter-abcde",namespace="gpu-operator",'
        'exported_pod="vllm-0",exported_namespace="llm",exported_container="vllm",'
        'hostname="gpu-node-2"} 5'
    )
    (sig,) = signals_from_exposition_line(line, SRC, default_time=SCRAPE)
    assert (sig.pod, sig.namespace, sig.container, sig.node) == (
        "vllm-0",
        "llm",
        "vllm",
        "gpu-node-2",
    )


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        "# EOF",
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 45',
        'vllm:gpu_prefix_cache_queries_created{engine="0"} 1.7537953269352946e+09',
        "Priority: 0",  # a describe line that is also a valid sample of metric "Priority:"
    ],
)
def test_lines_without_signal(line: str) -> None:
    assert signals_from_exposition_line(line, SRC) == []


def test_nan_and_inf_say_nothing() -> None:
    series = SERIES
    for value in ("NaN", "+Inf", "-Inf", "1e308"):  # NaN: staleness; 1e308 MiB overflows
        assert signals_from_exposition_line(f"{series} {value}", SRC, default_time=SCRAPE) == []


@pytest.mark.parametrize(
    ("line", "reason", "default_time"),
    [
        (FB_USED, "missing_timestamp", None),
        (SERIES, "missing_field", SCRAPE),  # series without value (Grafana view)
        (f"{SERIES} lots", "bad_value", SCRAPE),
        (f"{FB_USED} soon", "bad_timestamp", SCRAPE),
        ("DCGM_FI_DEV_FB_USED{gpu=0} 5", "malformed_metric", SCRAPE),
        ("Traceback (most recent call last):", "unknown_format", SCRAPE),
        ("hello world", "unknown_format", SCRAPE),
        ("| N/A   38C    P0    50W /  350W |", "unknown_format", SCRAPE),
    ],
)
def test_rejects(line: str, reason: str, default_time: float | None) -> None:
    with pytest.raises(ParseError) as err:
        signals_from_exposition_line(line, SRC, default_time=default_time)
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("block", "labels"),
    [
        ('{a="1",b="2"}', {"a": "1", "b": "2"}),
        ('{a="1",b="2",}', {"a": "1", "b": "2"}),
        ('{ a = "x" , b="y" }', {"a": "x", "b": "y"}),
        (r'{path="C:\\dir",msg="say \"hi\"\n"}', {"path": "C:\\dir", "msg": 'say "hi"\n'}),
        ('{a="}"}', {"a": "}"}),
        ("{}", {}),
    ],
)
def test_parse_labels(block: str, labels: dict[str, str]) -> None:
    assert parse_labels(block) == labels


# --- prometheus-kafka-adapter ---------------------------------------------------------------


@pytest.mark.parametrize(
    "row", _rows("sources_prom_kafka_adapter.jsonl"), ids=lambda r: r["note"][:20]
)
def test_real_adapter_samples(row: dict[str, Any]) -> None:
    assert signals_from_adapter_sample(row["record"], SRC) == []


def test_adapter_gpu_memory() -> None:
    sample = {
        "timestamp": "2024-12-17T10:00:01Z",
        "value": "79000",
        "name": "DCGM_FI_DEV_FB_USED",
        "labels": {
            "__name__": "DCGM_FI_DEV_FB_USED",
            "gpu": "0",
            "UUID": "GPU-3bc239e1",
            "pod": "vllm-0",
            "namespace": "llm",
            "container": "vllm",
            "Hostname": "gpu-node-1",
            "instance": "10.0.0.5:9400",
            "job": "dcgm-exporter",
        },
    }
    (sig,) = signals_from_adapter_sample(sample, SRC)
    assert sig.kind is SignalKind.GPU_MEMORY
    assert sig.time == 1734429601.0
    assert sig.attrs["used_bytes"] == 79000 * MIB and sig.attrs["uuid"] == "GPU-3bc239e1"
    assert (sig.pod, sig.namespace, sig.node) == ("vllm-0", "llm", "gpu-node-1")


@pytest.mark.parametrize(
    ("sample", "attrs"),
    [
        (
            {
                "timestamp": "2024-12-17T10:00:01Z",
                "value": "0.99",
                "name": "vllm:kv_cache_usage_perc",
                "labels": {"model_name": "m", "pod": "vllm-0"},
            },
            {"kv_cache_usage": 0.99},
        ),
        (
            {
                "timestamp": "2024-12-17T10:00:01Z",
                "value": "17",
                "labels": {"__name__": "vllm:num_requests_waiting"},
            },  # name only in labels
            {"requests_waiting": 17},
        ),
        (
            {
                "__timestamp__": 1734429601000,
                "__value__": 3,
                "__name__": "vllm:num_preemptions_total",
                "pod": "vllm-0",
            },  # pre-1.0 flat shape
            {"preemptions": 3},
        ),
    ],
)
def test_adapter_engine_pressure(sample: dict[str, Any], attrs: dict[str, Any]) -> None:
    (sig,) = signals_from_adapter_sample(sample, SRC)
    assert sig.kind is SignalKind.ENGINE_PRESSURE
    assert sig.time == 1734429601.0
    for key, value in attrs.items():
        assert sig.attrs[key] == value


@pytest.mark.parametrize(
    ("sample", "reason"),
    [
        ({"timestamp": "2024-12-17T10:00:01Z", "value": "1", "labels": {}}, "missing_field"),
        ({"timestamp": "2024-12-17T10:00:01Z", "name": "x", "labels": {}}, "missing_field"),
        ({"value": "1", "name": "x", "labels": {}}, "missing_field"),
        (
            {"timestamp": "2024-12-17T10:00:01Z", "value": "many", "name": "x", "labels": {}},
            "bad_value",
        ),
        (
            {"timestamp": "2024-12-17T10:00:01Z", "value": True, "name": "x", "labels": {}},
            "bad_value",
        ),
        (
            {"timestamp": "2024-12-17T10:00:01Z", "value": 10**400, "name": "x", "labels": {}},
            "bad_value",
        ),
        ({"timestamp": "now", "value": "1", "name": "x", "labels": {}}, "bad_timestamp"),
    ],
)
def test_adapter_rejects(sample: dict[str, Any], reason: str) -> None:
    with pytest.raises(ParseError) as err:
        signals_from_adapter_sample(sample, SRC)
    assert err.value.reason == reason


# --- shared GPUs: one device, several pods (MPS, MIG) ----------------------------------------

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "gpu_metrics"


def _corpus_signals(name: str) -> list[Signal]:
    path = CORPUS / name
    if not path.exists():
        pytest.skip("corpus not found")
    return [
        s for src, raw in read_records([path]) for s in parse_record(raw, src, default_time=SCRAPE)
    ]


def test_mps_shared_gpu_signals_carry_one_device_uuid() -> None:
    """dcgm-exporter repeats the device's FB_USED once per pod under MPS: same uuid, never summed.

    The correlator keys GPU memory on ``uuid``, so the two pods' signals describe one device.
    """
    burn, vllm = _corpus_signals("dcgm_exporter_mps_shared_gpu_vllm_duplicate_fb_used.prom")
    assert burn.attrs["uuid"] == vllm.attrs["uuid"] == "GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e"
    assert burn.attrs["used_bytes"] == vllm.attrs["used_bytes"] == 15866 * MIB
    assert (burn.pod, burn.namespace) == ("gpu-burn-deployment-1-85dc8ff699-clvh5", "default")
    assert (vllm.pod, vllm.namespace, vllm.container) == (
        "vllm-medgemma-4b-it-d599b4c99-f95nk",
        "vllm-inference",
        "vllm",
    )
    assert burn.node == vllm.node == "gke-gpu-node-mps-01"


def test_mig_instances_are_devices_of_their_own() -> None:
    full, mig = _corpus_signals("dcgm_exporter_lowercase_hostname_label_triton.prom")
    assert full.attrs["uuid"] == "GPU-fc60126e-514d-3522-2828-c5daa8e99d85"
    assert mig.attrs["uuid"] == "GPU-63bc0b91-2265-1b94-831c-15c41fe92675/mig3"
    assert mig.pod == "triton-server-f7cb5d77-95xcf" and mig.node == "dcgm-exporter-wwwjh"


def test_mig_instance_uuid_in_adapter_samples() -> None:
    sample = {
        "timestamp": "2024-12-17T10:00:01Z",
        "value": "9000",
        "name": "DCGM_FI_DEV_FB_USED",
        "labels": {"UUID": "GPU-1", "GPU_I_ID": "2", "gpu": "0", "pod": "vllm-0"},
    }
    (sig,) = signals_from_adapter_sample(sample, SRC)
    assert sig.attrs["uuid"] == "GPU-1/mig2"
