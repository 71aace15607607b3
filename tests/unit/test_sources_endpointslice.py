"""EndpointSlices as a source of pod IPs (issue 11, item 6): a load-balancer line is
attributed by its upstream address even when no pod object was seen.

``fixtures/endpointslice_v1.json`` is in the shape of ``kubectl get endpointslice -o json``
(discovery.k8s.io/v1), field by field as documented in
https://kubernetes.io/docs/reference/kubernetes-api/service-resources/endpoint-slice-v1/
(and https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/), with the IP
the access line names; its first endpoint's pod is Running but not Ready.
The ingress-nginx line is real: https://github.com/kubernetes/ingress-nginx/issues/9443
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from detector.config import CorrelateSettings
from detector.correlate.correlator import Correlator
from detector.correlate.identity import WorkloadRef, WorkloadResolver
from detector.events.detect import parse_record
from detector.events.model import SignalKind, SourcePos
from detector.events.sources.endpointslice import signals_from_endpointslice
from detector.events.sources.timeparse import parse_time

SRC = SourcePos("t", 1)
SLICE_TEXT = (Path(__file__).parent / "fixtures" / "endpointslice_v1.json").read_text()
INGRESS_NGINX = (
    '203.0.113.25 - - [08/Mar/2023:16:02:45 +0000] "GET / HTTP/1.1" 504 562 "-" '
    '"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) '
    'Chrome/109.0.0.0 Safari/537.36" 1100 14.998 [pc-dev-example-web-service-80] [] '
    "192.168.215.1:80, 192.168.215.1:80, 192.168.215.1:80 0, 0, 0 5.000, 5.000, 5.000 "
    "504, 504, 504 a7c98d98ac870f64981a997cd2f373a1"
)
WEB = WorkloadRef("pc-dev", "example-web", "Deployment")


def _slice() -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(SLICE_TEXT)
    return obj


def test_each_pod_endpoint_gives_its_address() -> None:
    sigs = parse_record(SLICE_TEXT, SRC)
    assert [s.kind for s in sigs] == [SignalKind.POD_ADDRESS] * 2
    first = sigs[0]
    assert (first.namespace, first.pod) == ("pc-dev", "example-web-6c9d8b7f5-zz8pq")
    assert first.attrs == {
        "pod_ip": "192.168.215.1",
        "ready": False,
        "service": "example-web-service",
    }
    assert first.time == parse_time("2023-03-08T16:02:40Z")


def test_watch_event_and_list_are_unwrapped() -> None:
    watch = json.dumps({"type": "MODIFIED", "object": _slice()})
    listed = json.dumps({"apiVersion": "v1", "kind": "EndpointSliceList", "items": [_slice()]})
    for text in (watch, listed):
        assert [s.attrs["pod_ip"] for s in parse_record(text, SRC)] == [
            "192.168.215.1",
            "192.168.215.2",
        ]


def test_non_pod_targets_and_fqdn_slices_give_nothing() -> None:
    obj = _slice()
    obj["endpoints"][0]["targetRef"]["kind"] = "Node"
    del obj["endpoints"][1]["targetRef"]
    assert signals_from_endpointslice(obj, SRC) == []
    assert signals_from_endpointslice({**_slice(), "addressType": "FQDN"}, SRC) == []


def test_namespace_defaults_to_the_slices_and_time_to_the_shippers() -> None:
    obj = _slice()
    del obj["endpoints"][0]["targetRef"]["namespace"]
    del obj["metadata"]["annotations"]
    (sig, _) = signals_from_endpointslice(obj, SRC, default_time=5.0)
    assert (sig.namespace, sig.time) == ("pc-dev", 5.0)


def test_lb_line_goes_to_the_not_ready_pod_named_by_the_slice() -> None:
    """No pod object seen: the upstream address names the pod through the slice, not the
    ``<namespace>-<service>-<port>`` convention (which would give ``example-web-service``)."""
    resolver = WorkloadResolver()
    for sig in parse_record(SLICE_TEXT, SRC):
        resolver.resolve(sig)
    (line,) = parse_record(INGRESS_NGINX, SRC, default_time=1.0)
    assert resolver.resolve(line) == WEB


def test_correlator_attributes_the_line_and_records_nothing_for_the_slice() -> None:
    corr = Correlator(CorrelateSettings())
    assert corr.observe_all(parse_record(SLICE_TEXT, SRC)) == []
    (line,) = parse_record(INGRESS_NGINX, SRC, default_time=1.0)
    corr.observe(line)
    assert corr.unattributed == 0
    assert WEB in corr.workloads and corr.workloads[WEB].last_lb is line
