"""Upstream naming rules of the load-balancer parsers, checked against the workload resolver."""

from __future__ import annotations

import json

import pytest

from detector.correlate.identity import WorkloadResolver
from detector.events.model import SourcePos
from detector.events.sources.lb_access import signals_from_lb_json
from detector.events.sources.lb_common import (
    upstream_of_cluster,
    upstream_of_gcp_backend,
    upstream_of_haproxy_backend,
)


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        ("outbound|8000||vllm-llama.llm.svc.cluster.local", ("llm-vllm-llama-8000", False)),
        ("outbound|9080|v1|reviews.default.svc.cluster.local", ("default-reviews-9080", False)),
        ("outbound_.8000_._.vllm-llama.llm.svc.cluster.local", ("llm-vllm-llama-8000", False)),
        ("outbound|443||api.github.com", ("outbound|443||api.github.com", False)),
        ("inbound|8000||", (None, True)),
        ("inbound|8080|http-8080|scrappers-service.default.svc.cluster.local", (None, True)),
        ("InboundPassthroughClusterIpv4", (None, True)),
        ("PassthroughCluster", (None, False)),
        ("BlackHoleCluster", (None, False)),
        ("httproute/llm/vllm-route/rule/0", ("httproute/llm/vllm-route/rule/0", False)),
        ("-", (None, False)),
        (None, (None, False)),
    ],
)
def test_envoy_clusters(cluster: str | None, expected: tuple[str | None, bool]) -> None:
    assert upstream_of_cluster(cluster) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("k8s1-18cca515-default-service-api-80-9719b3d2", "default-service-api-80"),
        ("k8s1-179e90eb-default-columns-8080-4cdd8a4f", "default-columns-8080"),  # ingress-gce#1601
        ("gkegw1-ta92-litellm-gw-serve404-80-j5wgjbklo38j", "litellm-gw-serve404-80"),
        ("k8s-be-30001--1a2b3c4d5e6f7a8b", "k8s-be-30001--1a2b3c4d5e6f7a8b"),  # instance groups
        ("my-backend-service", "my-backend-service"),
        ("", None),
    ],
)
def test_gcp_backend_services(name: str, expected: str | None) -> None:
    assert upstream_of_gcp_backend(name) == expected


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ("default_echoserver_8080", "default-echoserver-8080"),  # haproxy-ingress naming
        ("llm_vllm-llama_http", "llm-vllm-llama-http"),
        ("static", "static"),
        (
            "bdc5c998-878b-49f5-bba7-68cacc843b5d_443_4_backend",
            "bdc5c998-878b-49f5-bba7-68cacc843b5d_443_4_backend",
        ),
    ],
)
def test_haproxy_backends(backend: str, expected: str) -> None:
    assert upstream_of_haproxy_backend(backend) == expected


@pytest.mark.parametrize(
    ("upstream", "workload"),
    [
        ("llm-vllm-llama-8000", ("llm", "vllm-llama")),  # Envoy outbound, GKE NEG, ingress-nginx
        ("llm-vllm-llama-0", ("llm", "vllm-llama")),  # a counter without a port
        ("llm-vllm-llama-http", ("llm", "vllm-llama")),  # HAProxy ingress named port
        ("httproute/llm/vllm-route/rule/0", None),  # needs the YAML mapping
        ("k8s-llm-vllmllam-0a1b2c3d4e", None),  # AWS LB controller target group: YAML mapping
    ],
)
def test_names_resolve_to_the_workload(upstream: str, workload: tuple[str, str] | None) -> None:
    ref = WorkloadResolver().for_upstream(upstream)
    assert (None if ref is None else (ref.namespace, ref.name)) == workload


def test_gcp_entry_maps_neg_backend_to_the_workload() -> None:
    entry = {
        "httpRequest": {"status": 502, "latency": "0.003s", "requestMethod": "POST"},
        "jsonPayload": {
            "@type": "type.googleapis.com/google.cloud.loadbalancing.type.LoadBalancerLogEntry",
            "statusDetails": "failed_to_connect_to_backend",
        },
        "resource": {
            "type": "http_load_balancer",
            "labels": {"backend_service_name": "k8s1-18cca515-llm-vllm-llama-8000-9719b3d2"},
        },
        "timestamp": "2024-12-17T10:00:01.5Z",
    }
    (sig,) = signals_from_lb_json(entry, SourcePos("gcp", 1)) or []
    assert sig.attrs["status"] == 502 and sig.attrs["upstream_status"] is None
    assert sig.attrs["status_details"] == "failed_to_connect_to_backend"
    assert sig.attrs["upstream"] == "llm-vllm-llama-8000"
    assert sig.attrs["request_time_s"] == pytest.approx(0.003)
    assert sig.time == pytest.approx(1734429601.5)
    assert json.loads(sig.text)["timestamp"] == entry["timestamp"]
    ref = WorkloadResolver().resolve(sig)
    assert ref is not None and (ref.namespace, ref.name) == ("llm", "vllm-llama")
    run = {**entry, "resource": {"type": "cloud_run_revision", "labels": {}}, "jsonPayload": {}}
    assert signals_from_lb_json(run, SourcePos("gcp", 2)) is None  # not a load balancer's entry
