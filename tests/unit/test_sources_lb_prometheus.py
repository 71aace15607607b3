"""Load-balancer request counters (exposition lines, adapter samples) -> LB_RESPONSE."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.dcgm import signals_from_exposition_line
from detector.events.sources.lb_prometheus import series_id
from detector.events.sources.prom_kafka_adapter import signals_from_adapter_sample

FIXTURES = Path(__file__).parent / "fixtures"
SRC = SourcePos("metrics", 1)
SCRAPE = 1734429601.0


def counter(text: str, source: SourcePos, default_time: float | None = None) -> Signal | None:
    """Read one counter exposition line the way bare records are read; None if it says nothing."""
    signals = signals_from_exposition_line(text, source, default_time=default_time)
    return signals[0] if signals else None


def _rows() -> list[dict[str, Any]]:
    path = FIXTURES / "sources_lb_prometheus.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["text"].split("{")[0] + "-" + r["expect"])
def test_real_samples(row: dict[str, Any]) -> None:
    text = row["text"]
    if row["expect"].startswith("series_only"):
        text += " 17 1734429600000"  # the UI showed the series alone: give it a value and time
    sig = counter(text, SRC, SCRAPE)
    if row["expect"] in ("none", "series_only_skipped"):
        assert sig is None
        return
    assert sig is not None and sig.kind is SignalKind.LB_RESPONSE
    for key in ("status", "status_class", "upstream", "counter_total", "response_flags"):
        if key in row:
            assert sig.attrs[key] == row[key], key
    if row["expect"] == "series_only":
        assert sig.attrs["counter_total"] == 17.0 and sig.time == 1734429600.0
    else:
        assert sig.time == SCRAPE  # no timestamp on the line: the scrape time
    assert sig.attrs["series"].startswith(sig.attrs["metric"] + "{")
    assert "count" not in sig.attrs  # the correlator counts from successive totals


def test_series_identity_is_stable_and_label_order_free() -> None:
    a = counter(
        'nginx_ingress_controller_requests{namespace="llm",service="vllm",status="503"} 5 '
        "1734429600000",
        SRC,
    )
    b = counter(
        'nginx_ingress_controller_requests{status="503",service="vllm",namespace="llm"} 9 '
        "1734429615000",
        SRC,
    )
    assert a is not None and b is not None
    assert a.attrs["series"] == b.attrs["series"]
    assert a.attrs["series"] == series_id(
        "nginx_ingress_controller_requests",
        {"status": "503", "namespace": "llm", "service": "vllm"},
    )
    assert (a.attrs["upstream"], a.attrs["status"], a.time) == ("llm-vllm-0", 503, 1734429600.0)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (  # Istio's Envoy stats use cluster_name / response_code_class
            'envoy_cluster_upstream_rq_xx{cluster_name="outbound|8000||vllm-llama.llm.svc.cluster.'
            'local",response_code_class="5"} 12',
            {"status": 503, "status_class": "5xx", "upstream": "llm-vllm-llama-8000"},
        ),
        (
            'envoy_cluster_upstream_rq{envoy_response_code="504",envoy_cluster_name="outbound|8000|'
            '|vllm-llama.llm.svc.cluster.local"} 3',
            {"status": 504, "upstream": "llm-vllm-llama-8000"},
        ),
        (  # an inbound cluster is the pod's own sidecar: the target labels name the pod
            'envoy_cluster_upstream_rq{response_code="503",cluster_name="inbound|8000||",'
            'namespace="llm",pod="vllm-llama-7d9f8b6c5d-x2k4p"} 3',
            {"status": 503, "upstream": None, "sidecar": True},
        ),
        (
            'istio_requests_total{destination_service_name="vllm-llama",'
            'destination_service_namespace="llm",reporter="source",response_code="503",'
            'response_flags="UH"} 40',
            {"status": 503, "upstream": "llm-vllm-llama-0", "response_flags": "UH"},
        ),
        (  # a ServiceEntry host: no Kubernetes namespace, no upstream
            'istio_requests_total{destination_service_name="api.example.com",'
            'destination_service_namespace="unknown",response_code="502"} 1',
            {"status": 502, "upstream": None},
        ),
    ],
)
def test_counter_shapes(line: str, expected: dict[str, Any]) -> None:
    sig = counter(line, SRC, SCRAPE)
    assert sig is not None
    for key, value in expected.items():
        assert sig.attrs.get(key) == value, key
    if expected.get("sidecar"):
        assert (sig.namespace, sig.pod) == ("llm", "vllm-llama-7d9f8b6c5d-x2k4p")


@pytest.mark.parametrize(
    "line",
    [
        'nginx_ingress_controller_requests{namespace="llm",service="vllm",status="503"} NaN',
        'istio_requests_total{reporter="destination",response_code="503"} 4',
        'istio_requests_total{reporter="source",response_code="-"} 4',
        'envoy_cluster_upstream_rq_xx{envoy_response_code_class="x"} 1',
        'envoy_cluster_upstream_rq_time_bucket{le="1"} 4',
        "nginx_ingress_controller_requests_total 4",
    ],
)
def test_samples_that_say_nothing(line: str) -> None:
    assert counter(line, SRC, SCRAPE) is None


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('nginx_ingress_controller_requests{status="503"} 5', "missing_timestamp"),
        ('nginx_ingress_controller_requests{status="503"} five', "bad_value"),
        ('nginx_ingress_controller_requests{status="503"} 5 soon', "bad_timestamp"),
        ("nginx_ingress_controller_requests{status=503} 5 1000", "malformed_metric"),
    ],
)
def test_broken_samples(line: str, reason: str) -> None:
    with pytest.raises(ParseError) as err:
        counter(line, SRC)
    assert err.value.reason == reason


def test_exposition_line_through_parse_record() -> None:
    line = 'nginx_ingress_controller_requests{namespace="llm",service="vllm",status="502"} 7'
    (sig,) = parse_record(line, SRC, default_time=SCRAPE)
    assert sig.attrs["counter_total"] == 7.0 and sig.time == SCRAPE


def test_adapter_samples() -> None:
    sample = {
        "timestamp": "2024-12-17T10:00:01Z",
        "value": "41",
        "name": "istio_requests_total",
        "labels": {
            "__name__": "istio_requests_total",
            "destination_service_name": "vllm-llama",
            "destination_service_namespace": "llm",
            "reporter": "source",
            "response_code": "503",
        },
    }
    (sig,) = signals_from_adapter_sample(sample, SRC)
    assert sig.attrs["counter_total"] == 41.0 and sig.attrs["status"] == 503
    assert sig.time == 1734429601.0
    exposition = counter(
        'istio_requests_total{destination_service_name="vllm-llama",'
        'destination_service_namespace="llm",reporter="source",response_code="503"} 41',
        SRC,
        SCRAPE,
    )
    assert exposition is not None and exposition.attrs["series"] == sig.attrs["series"]
    other = {**sample, "name": "DCGM_FI_DEV_FB_USED", "labels": {}}
    assert all(
        s.kind is not SignalKind.LB_RESPONSE for s in signals_from_adapter_sample(other, SRC)
    )
    assert (
        signals_from_adapter_sample(
            {**sample, "labels": {**sample["labels"], "reporter": "destination"}}, SRC
        )
        == []
    )
    with pytest.raises(ParseError) as err:
        signals_from_adapter_sample({**sample, "value": "x"}, SRC)
    assert err.value.reason == "bad_value"
    with pytest.raises(ParseError) as err:
        signals_from_adapter_sample({k: v for k, v in sample.items() if k != "timestamp"}, SRC)
    assert err.value.reason == "missing_field"
