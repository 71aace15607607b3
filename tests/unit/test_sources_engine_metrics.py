"""vLLM / TGI / SGLang ``/metrics`` samples -> ENGINE_PRESSURE."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.events.detect import parse_record
from detector.events.model import SignalKind, SourcePos
from detector.events.reader import read_records
from detector.events.sources.engine_metrics import ENGINE_METRICS, engine_pressure_attrs
from detector.events.sources.prom_kafka_adapter import signals_from_adapter_sample

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "gpu_metrics"
SRC = SourcePos("metrics", 1)
SCRAPE = 1734429601.0


def _rows() -> list[dict[str, Any]]:
    path = FIXTURES / "sources_engine_metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["text"][:40])
def test_real_samples(row: dict[str, Any]) -> None:
    signals = parse_record(row["text"], SRC, default_time=SCRAPE)
    if row["expect"] is None:
        assert signals == []
        return
    (sig,) = signals
    assert sig.kind is SignalKind.ENGINE_PRESSURE and sig.time == SCRAPE
    assert {k: sig.attrs[k] for k in row["expect"]} == row["expect"]
    assert sig.attrs["metric"] == row["text"].split("{")[0].split(" ")[0]


def _corpus_signals(name: str) -> list[dict[str, Any]]:
    path = CORPUS / name
    if not path.exists():
        pytest.skip("corpus not found")
    out = []
    for source, raw in read_records([path]):
        out += [s.attrs for s in parse_record(raw, source, default_time=SCRAPE)]
    return out


def test_corpus_vllm_v0() -> None:
    model = {"engine": "vllm", "model": "Qwen/Qwen2.5-Coder-32B-Instruct"}
    assert _corpus_signals("vllm_metrics_v0_model_name_only.prom") == [
        {"requests_running": 0, "metric": "vllm:num_requests_running", **model},
        {"requests_waiting": 0, "metric": "vllm:num_requests_waiting", **model},
        {"kv_cache_usage": 0.0, "metric": "vllm:gpu_cache_usage_perc", **model},
    ]


def test_corpus_vllm_v1_engine_label_is_not_the_engine() -> None:
    """V1's ``engine="0"`` label is a data-parallel index; ``*_created`` gauges are epochs."""
    (attrs,) = _corpus_signals("vllm_metrics_v1_engine_label_kv_cache_usage.prom")
    assert attrs["engine"] == "vllm" and attrs["model"] == "zai-org/GLM-4.5"
    assert attrs["kv_cache_usage"] == pytest.approx(9.75010481363281e-06)


def test_corpus_help_and_type_without_samples() -> None:
    assert _corpus_signals("vllm_metrics_help_type_without_samples.prom") == []


@pytest.mark.parametrize(
    ("name", "value", "attrs"),
    [
        ("vllm:kv_cache_usage_perc", 0.97, {"kv_cache_usage": 0.97, "engine": "vllm"}),
        ("vllm:gpu_cache_usage_perc", 1.0, {"kv_cache_usage": 1.0, "engine": "vllm"}),
        ("vllm:num_requests_waiting", 42.0, {"requests_waiting": 42, "engine": "vllm"}),
        ("vllm:num_requests_running", 256.0, {"requests_running": 256}),
        ("vllm:num_requests_swapped", 3.0, {"requests_swapped": 3}),
        ("vllm:num_preemptions_total", 1234.0, {"preemptions": 1234}),
        ("tgi_queue_size", 7.0, {"requests_waiting": 7, "engine": "tgi"}),
        ("tgi_batch_current_size", 32.0, {"requests_running": 32, "engine": "tgi"}),
        ("tgi_batch_current_max_tokens", 12000.0, {"batch_max_tokens": 12000, "engine": "tgi"}),
        ("sglang:token_usage", 0.5, {"kv_cache_usage": 0.5, "engine": "sglang"}),
        ("sglang:num_queue_reqs", 9.0, {"requests_waiting": 9, "engine": "sglang"}),
        ("sglang:num_running_reqs", 4.0, {"requests_running": 4, "engine": "sglang"}),
    ],
)
def test_every_mapped_metric(name: str, value: float, attrs: dict[str, Any]) -> None:
    got = engine_pressure_attrs(name, {"model_name": "m"}, value)
    assert got is not None and {k: got[k] for k in attrs} == attrs
    assert got["metric"] == name and got["model"] == "m"
    assert name in ENGINE_METRICS


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0])
def test_values_that_say_nothing(value: float) -> None:
    assert engine_pressure_attrs("vllm:num_requests_waiting", {}, value) is None


def test_model_label_variants() -> None:
    assert engine_pressure_attrs("sglang:token_usage", {"name": "g"}, 0.1) == {
        "kv_cache_usage": 0.1,
        "engine": "sglang",
        "metric": "sglang:token_usage",
        "model": "g",
    }
    assert "model" not in (engine_pressure_attrs("tgi_queue_size", {}, 1.0) or {})


def test_prometheus_target_labels_name_the_pod() -> None:
    line = (
        'vllm:num_requests_waiting{model_name="m",namespace="llm",pod="vllm-0",'
        'container="vllm"} 17 1734429600500'
    )
    (sig,) = parse_record(line, SRC)
    assert (sig.namespace, sig.pod, sig.container, sig.time) == (
        "llm",
        "vllm-0",
        "vllm",
        1734429600.5,
    )


def test_adapter_samples_carry_the_engine() -> None:
    sample = {
        "timestamp": "2024-12-17T10:00:01Z",
        "value": "0.99",
        "name": "sglang:token_usage",
        "labels": {"model_name": "m", "pod": "sg-0", "namespace": "llm"},
    }
    (sig,) = signals_from_adapter_sample(sample, SRC)
    assert sig.attrs["engine"] == "sglang" and sig.attrs["kv_cache_usage"] == 0.99


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([*sorted(ENGINE_METRICS), "vllm:other", "x"]),
    st.dictionaries(
        st.sampled_from(["model_name", "model", "name", "engine"]), st.text(max_size=8)
    ),
    st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**20), 10**20).map(float),
)
def test_any_sample(name: str, labels: dict[str, str], value: float) -> None:
    attrs = engine_pressure_attrs(name, labels, value)
    if attrs is None:
        return
    assert attrs["engine"] in ("vllm", "tgi", "sglang")
    assert all(v >= 0 for k, v in attrs.items() if isinstance(v, int | float))
