"""ingress-nginx access lines -> LB_RESPONSE."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ParseError
from detector.events.model import LogLine, SignalKind, SourcePos
from detector.events.sources.ingress_nginx import (
    access_line_attrs,
    signal_from_access_line,
    signal_from_raw_access_line,
)

FIXTURES = Path(__file__).parent / "fixtures"
SRC = SourcePos("ingress", 1)
UA = '"-" "python-requests/2.31.0"'


def _fixture_rows() -> list[dict[str, Any]]:
    path = FIXTURES / "sources_ingress_nginx_lines.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("row", _fixture_rows(), ids=lambda r: r["source"].rsplit("/", 1)[-1])
def test_real_lines(row: dict[str, Any]) -> None:
    parsed = access_line_attrs(row["text"])
    if row["expect"] == "none":
        assert parsed is None
        return
    assert parsed is not None
    attrs, _time_local = parsed
    for key in ("status", "upstream", "upstream_status", "upstream_addr", "request_time_s"):
        assert attrs[key] == row[key], key
    assert attrs["count"] == 1
    single = (attrs["upstream_addr"],) if attrs["upstream_addr"] else ()
    assert len(attrs.get("upstream_addrs", single)) == row["attempts"]
    sig = signal_from_raw_access_line(row["text"], SRC)
    assert sig is not None and sig.time == row["time"]


@pytest.mark.parametrize(
    ("line", "status", "upstream", "upstream_status", "upstream_addr"),
    [
        # 1.x default format, healthy 2xx still counts (request volume for error rates)
        (
            f'10.0.0.9 - - [17/Dec/2024:10:00:01 +0000] "POST /v1/chat/completions HTTP/1.1" 200 '
            f"512 {UA} 1024 0.850 [llm-vllm-llama-8000] [] 10.244.1.7:8000 512 0.849 200 "
            "4e1c0b5f0d9d3c1b2a8f7e6d5c4b3a29",
            200,
            "llm-vllm-llama-8000",
            200,
            "10.244.1.7:8000",
        ),
        # 429 from limit-req-status-code stays 429 (the correlator keeps it apart from 5xx)
        (
            f'10.0.0.9 - - [17/Dec/2024:10:00:02 +0000] "POST /v1/completions HTTP/1.1" 429 '
            f"162 {UA} 1024 0.000 [llm-vllm-llama-8000] [] - - - - 5f0d9d3c1b2a8f7e6d5c4b3a294e",
            429,
            "llm-vllm-llama-8000",
            None,
            None,
        ),
        # 503 with canary alternative upstream and a user name
        (
            f'10.0.0.9 - alice [17/Dec/2024:10:00:03 +0000] "GET /health HTTP/2.0" 503 190 {UA} '
            "88 0.001 [llm-vllm-llama-8000] [llm-vllm-llama-canary-8000] 10.244.1.8:8000 0 "
            "0.001 503 9d3c1b2a8f7e6d5c4b3a294e1c0b5f0d",
            503,
            "llm-vllm-llama-8000",
            503,
            "10.244.1.8:8000",
        ),
        # internal redirect between upstream groups: " : " separates them
        (
            f'10.0.0.9 - - [17/Dec/2024:10:00:04 +0000] "GET / HTTP/1.1" 502 150 {UA} 90 0.010 '
            "[llm-vllm-llama-8000] [] 10.244.1.7:8000, 10.244.1.8:8000 : 10.244.1.9:8000 "
            "0, 0 : 150 0.004, 0.003 : 0.003 502, 502 : 502 c1b2a8f7e6d5c4b3a294e1c0b5f0d9d3",
            502,
            "llm-vllm-llama-8000",
            502,
            "10.244.1.9:8000",
        ),
        # plain nginx combined + "$http_x_forwarded_for": status only
        (
            '192.0.2.11 - - [03/Nov/2024:06:09:29 +0000] "GET / HTTP/1.1" 502 559 "-" '
            '"Mozilla/5.0" "-"',
            502,
            None,
            None,
            None,
        ),
        # escaped quote inside the request and the user agent
        (
            r'10.0.0.9 - - [17/Dec/2024:10:00:05 +0000] "GET /a\"b HTTP/1.1" 504 0 "-" "x\"y" '
            "10 60.001 [ns-svc-80] [] 10.244.1.7:8000 0 60.000 504 abc",
            504,
            "ns-svc-80",
            504,
            "10.244.1.7:8000",
        ),
    ],
)
def test_formats(
    line: str,
    status: int,
    upstream: str | None,
    upstream_status: int | None,
    upstream_addr: str | None,
) -> None:
    parsed = access_line_attrs(line)
    assert parsed is not None
    attrs = parsed[0]
    assert (attrs["status"], attrs["upstream"]) == (status, upstream)
    assert (attrs["upstream_status"], attrs["upstream_addr"]) == (upstream_status, upstream_addr)


def test_retries_are_listed() -> None:
    line = (
        f'10.0.0.9 - - [17/Dec/2024:10:00:04 +0000] "GET / HTTP/1.1" 502 150 {UA} 90 0.010 '
        "[llm-vllm-llama-8000] [] 10.244.1.7:8000, 10.244.1.8:8000 0, 0 0.004, 0.003 502, 502 id"
    )
    parsed = access_line_attrs(line)
    assert parsed is not None
    assert parsed[0]["upstream_addrs"] == ("10.244.1.7:8000", "10.244.1.8:8000")
    assert parsed[0]["upstream_statuses"] == (502, 502)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "INFO 12-17 10:00:01 engine.py:267] Added request cmpl-1.",
        "I1217 10:00:01.000000       7 controller.go:190] Backend successfully reloaded.",
        '10.0.0.9 - - [17/Dec/2024:10:00:01 +0000] "GET / HTTP/1.1" abc 12',
        # mid-line paste fragment (corpus lb/ingress_nginx_access.jsonl): no request head
        'Chrome/58.0.3029.110 Safari/537.36" 619 0.003 [upstream-default-backend] '
        "10.42.0.16:3000 561 0.003 200",
    ],
)
def test_not_access_lines(line: str) -> None:
    assert access_line_attrs(line) is None


def test_truncated_line_keeps_status() -> None:
    line = (
        '203.0.113.193 - [203.0.113.193] - - [20/Dec/2017:01:40:42 +0000] "GET /b HTTP/1.1" 504 '
        '585 "-" "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_12_6) AppleWebKit/537.36 (KHTML, like '
    )
    parsed = access_line_attrs(line)
    assert parsed is not None
    assert parsed[0]["status"] == 504 and parsed[0]["upstream"] is None


@pytest.mark.parametrize("cut", [" ", "  ", " \t"])
def test_a_line_cut_to_spaces_after_its_upstream_names_has_no_upstream_fields(cut: str) -> None:
    line = (
        '203.0.113.187 - - [14/Mar/2025:09:00:47 +0000] "GET / HTTP/1.1" 502 1 ' + UA + " 634 "
        "2.497 [llm-vllm-llama-8000] []" + cut
    )
    parsed = access_line_attrs(line)  # once an IndexError out of the parser
    assert parsed is not None
    assert parsed[0]["upstream"] == "llm-vllm-llama-8000" and parsed[0]["upstream_addr"] is None


def test_signal_from_access_line_takes_envelope_identity() -> None:
    text = (
        f'10.0.0.9 - - [17/Dec/2024:10:00:01 +0000] "GET / HTTP/1.1" 502 150 {UA} 90 0.010 '
        "[llm-vllm-llama-8000] [] 10.244.1.7:8000 0 0.004 502 id"
    )
    line = LogLine(time=42.5, text=text, namespace="ingress-nginx", pod="ctrl-1", container="c")
    sig = signal_from_access_line(line, SRC)
    assert sig is not None
    assert sig.kind is SignalKind.LB_RESPONSE
    assert (sig.time, sig.namespace, sig.pod) == (42.5, "ingress-nginx", "ctrl-1")
    assert sig.attrs["upstream"] == "llm-vllm-llama-8000" and sig.text == text
    assert signal_from_access_line(LogLine(time=1.0, text="hello"), SRC) is None


def test_raw_line_with_bad_time() -> None:
    line = f'10.0.0.9 - - [17/Xyz/2024:10:00:01 +0000] "GET / HTTP/1.1" 200 1 {UA}'
    with pytest.raises(ParseError) as err:
        signal_from_raw_access_line(line, SRC)
    assert err.value.reason == "bad_timestamp"


def test_huge_line_is_bounded() -> None:
    line = f'10.0.0.9 - - [17/Dec/2024:10:00:01 +0000] "GET /{"a" * 100_000} HTTP/1.1" 200 1 {UA}'
    sig = signal_from_raw_access_line(line, SRC)
    assert sig is not None and len(sig.text) == 2048


def test_request_length_is_the_size_of_the_request() -> None:
    # $request_length: request line, headers and body (it grows with a prompt), on real lines
    sizes = [
        (access_line_attrs(row["text"]) or ({}, ""))[0].get("request_bytes")
        for row in _fixture_rows()
        if row["expect"] != "none"
    ]
    assert sizes == [1100, 205, 0, 117]
