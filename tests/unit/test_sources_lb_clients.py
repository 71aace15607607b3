"""Load-balancer lines name their client: the key of a per-client limit (``client`` attr).

Lines are the real ones of the parsers' own fixtures (sources_lb_lines.jsonl and
sources_ingress_nginx_lines.jsonl, each row with its source URL), plus the bundled cascade.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.events.model import SourcePos
from detector.events.sources.ingress_nginx import access_line_attrs
from detector.events.sources.lb_access import parse_lb_text, signals_from_lb_json
from detector.events.sources.lb_common import client_host, first_forwarded

FIXTURES = Path(__file__).parent / "fixtures"
CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade" / "lb-access.jsonl"


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


LB = _rows("sources_lb_lines.jsonl")
INGRESS = _rows("sources_ingress_nginx_lines.jsonl")


@pytest.mark.parametrize(
    ("row", "client"),
    [
        (1, "10.90.16.220"),  # Istio text: %REQ(X-FORWARDED-FOR)%
        (2, None),  # Istio inbound: a sidecar's peer is a proxy, not a client
        (3, "172.18.0.10"),  # Istio TCP: no X-Forwarded-For, %DOWNSTREAM_REMOTE_ADDRESS%
        (4, "10.20.5.1"),  # Envoy default format: X-Forwarded-For
        (8, "192.168.131.39"),  # ALB client:port
        (10, "10.0.0.140"),
        (11, "172.31.46.45"),  # ALB 503 of its own: the client is still logged
        (13, "10.0.1.2"),  # HAProxy client:port after a syslog header
        (16, "172.19.0.1"),  # HAProxy without a header
        (18, "fddd:1194:1194:1194::1000"),  # HAProxy IPv6: the port is the last field
        (19, None),  # HAProxy as pasted from the date on: no client
        (20, "203.0.113.208"),  # nginx error_log ", client: "
        (24, "10.44.112.83"),
    ],
)
def test_text_lines_name_their_client(row: int, client: str | None) -> None:
    parsed = parse_lb_text(LB[row]["text"])
    assert parsed is not None
    assert parsed.attrs["client"] == client


def test_envoy_json_client_from_the_downstream_remote_address() -> None:
    (sig,) = signals_from_lb_json(json.loads(LB[7]["text"]), SourcePos("x", 1)) or []
    assert sig.attrs["client"] == "REDACTED_IP2"  # "REDACTED_IP2:45403" without its port
    forwarded = {**json.loads(LB[7]["text"]), "x_forwarded_for": "198.51.100.7, 10.0.0.1"}
    (sig,) = signals_from_lb_json(forwarded, SourcePos("x", 1)) or []
    assert sig.attrs["client"] == "198.51.100.7"  # the first address is the client's


def test_gcp_entry_client_is_remote_ip() -> None:
    entry = {
        "httpRequest": {"status": 502, "remoteIp": "203.0.113.77", "latency": "0.01s"},
        "resource": {"type": "http_load_balancer", "labels": {}},
        "timestamp": "2021-09-10T22:28:32.701888Z",
    }
    (sig,) = signals_from_lb_json(entry, SourcePos("x", 1)) or []
    assert sig.attrs["client"] == "203.0.113.77"


@pytest.mark.parametrize(
    ("row", "client"), [(0, "203.0.113.25"), (2, "::ffff:10.101.61.0"), (5, "127.0.0.1")]
)
def test_ingress_nginx_client_is_remote_addr(row: int, client: str) -> None:
    parsed = access_line_attrs(INGRESS[row]["text"])
    assert parsed is not None and parsed[0]["client"] == client


def test_the_bundled_cascade_names_its_clients() -> None:
    clients = set()
    for line in CASCADE.read_text().splitlines():
        parsed = access_line_attrs(json.loads(line)["log"])
        if parsed is not None:  # the controller's error_log lines are read elsewhere
            clients.add(parsed[0]["client"])
    assert None not in clients and len(clients) > 200  # ~245 addresses over 9 minutes


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("203.0.113.9:51234", "203.0.113.9"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("2001:db8::1:51234", "2001:db8::1"),
        ("-", None),
        ("", None),
        (None, None),
        ("10.0.0.1", "10.0.0.1"),  # no port: as it is
    ],
)
def test_client_host(address: str | None, host: str | None) -> None:
    assert client_host(address) == host


def test_first_forwarded() -> None:
    assert first_forwarded("198.51.100.7, 10.0.0.1") == "198.51.100.7"
    assert first_forwarded("-") is None and first_forwarded("") is None
