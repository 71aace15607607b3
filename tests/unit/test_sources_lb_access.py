"""Envoy/Istio, ALB, HAProxy and nginx error_log lines -> LB_RESPONSE (lb_access dispatch)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.errors import ParseError
from detector.events.detect import parse_record, signals_from_log
from detector.events.model import LogLine, SignalKind, SourcePos
from detector.events.sources.lb_access import (
    parse_lb_text,
    signal_from_lb_line,
    signal_from_raw_lb_line,
    signals_from_lb_json,
)

FIXTURES = Path(__file__).parent / "fixtures"
SRC = SourcePos("lb", 1)
SCRAPE = 1734429601.0
CHECKED = (
    "status",
    "upstream",
    "upstream_addr",
    "upstream_status",
    "response_flags",
    "request_time_s",
    "server",
    "termination_state",
    "error",
)


def _rows() -> list[dict[str, Any]]:
    path = FIXTURES / "sources_lb_lines.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _same(got: Any, want: Any) -> bool:
    return bool(got == pytest.approx(want)) if isinstance(want, float) else bool(got == want)


def _row_id(row: dict[str, Any]) -> str:
    return f"{row['format']}-{row['source'].rsplit('/', 1)[-1][:24]}"


@pytest.mark.parametrize("row", _rows(), ids=_row_id)
def test_real_lines(row: dict[str, Any]) -> None:
    parsed = parse_lb_text(row["text"])
    if row["expect"] == "none":
        assert parsed is None
        assert signal_from_raw_lb_line(row["text"], SRC, SCRAPE) is None
        return
    assert parsed is not None
    for key in CHECKED:
        if key in row:
            assert _same(parsed.attrs[key], row[key]), key
    assert parsed.attrs.get("sidecar", False) == row.get("sidecar", False)
    assert parsed.attrs["count"] == 1
    sig = signal_from_raw_lb_line(row["text"], SRC, SCRAPE)
    assert sig is not None and sig.kind is SignalKind.LB_RESPONSE
    expected_time = row["time"] if row["time"] is not None else SCRAPE
    assert sig.time == pytest.approx(expected_time, abs=1e-6)
    assert sig.text == row["text"][:2048]


@pytest.mark.parametrize("row", [r for r in _rows() if r["expect"] != "none"], ids=_row_id)
def test_real_lines_in_a_container_log(row: dict[str, Any]) -> None:
    """Inside a container log the envelope gives time and identity (the proxy's own pod)."""
    line = LogLine(time=42.0, text=row["text"], namespace="llm", pod="vllm-0", container="c")
    (sig,) = signals_from_log(line, SRC)
    assert sig.kind is SignalKind.LB_RESPONSE
    assert (sig.time, sig.namespace, sig.pod) == (42.0, "llm", "vllm-0")
    assert sig.attrs["status"] == row["status"]


def test_raw_line_without_time_needs_a_default() -> None:
    (row,) = [r for r in _rows() if r["format"] == "envoy_text" and r.get("time", 0) is None]
    with pytest.raises(ParseError) as err:
        signal_from_raw_lb_line(row["text"], SRC)
    assert err.value.reason == "missing_timestamp"
    assert parse_record(row["text"], SRC, default_time=7.0)[0].time == 7.0


# --- formats, constructed around the documented fields ---------------------------------------

ENVOY_DEFAULT = (
    '[2024-12-17T10:00:01.000Z] "POST /v1/chat/completions HTTP/1.1" 503 UF,URX 512 91 3 - '
    '"10.0.0.9" "python-requests/2.31.0" "9d3c1b2a" "llm.example.com" "10.244.1.7:8000"'
)
ISTIO_OUTBOUND = (
    '[2024-12-17T10:00:02.000Z] "POST /v1/completions HTTP/1.1" 503 UH no_healthy_upstream - '
    '"-" 512 19 0 - "-" "python-requests/2.31.0" "9d3c1b2a" "vllm-llama.llm:8000" "-" '
    "outbound|8000||vllm-llama.llm.svc.cluster.local - 10.96.12.4:8000 10.244.2.3:51234 - "
    "default"
)
ISTIO_INBOUND = (
    '[2024-12-17T10:00:03.000Z] "POST /v1/completions HTTP/1.1" 503 UC '
    'upstream_reset_before_response_started{connection_termination} - "-" 512 95 2 - '
    '"-" "python-requests/2.31.0" "9d3c1b2a" "vllm-llama.llm:8000" "10.244.1.7:8000" '
    "inbound|8000|| 127.0.0.6:42317 10.244.1.7:8000 10.244.2.3:0 "
    "outbound_.8000_._.vllm-llama.llm.svc.cluster.local default"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ENVOY_DEFAULT,
            {"status": 503, "response_flags": "UF,URX", "upstream_addr": "10.244.1.7:8000"},
        ),
        (
            ISTIO_OUTBOUND,
            {
                "status": 503,
                "upstream": "llm-vllm-llama-8000",
                "response_code_details": "no_healthy_upstream",
                "upstream_addr": None,
            },
        ),
        (ISTIO_INBOUND, {"status": 503, "upstream": None, "sidecar": True}),
        (  # Envoy 1.13 details with a space, in a custom format (corpus lb/)
            "503 upstream_reset_before_response_started{local reset} LR",
            {"status": 503, "response_flags": "LR"},
        ),
        (  # truncated right after the flags: the status is all there is
            '[2024-12-17T10:00:01.000Z] "GET / HTTP/1.1" 504 UT',
            {"status": 504, "response_flags": "UT", "request_time_s": None},
        ),
        (  # local rate limit: throttling, not a backend failure
            '[2024-12-17T10:00:01.000Z] "GET / HTTP/1.1" 429 RL local_rate_limited - "-" 0 18 0 '
            '- "-" "curl/8.5.0" "a5" "x" "-" inbound|80|| - 10.42.0.27:80 192.168.1.1:0 - default',
            {"status": 429, "rate_limited": True, "sidecar": True},
        ),
    ],
)
def test_envoy_text(text: str, expected: dict[str, Any]) -> None:
    parsed = parse_lb_text(text)
    assert parsed is not None
    for key, value in expected.items():
        assert parsed.attrs.get(key) == value, key


def test_envoy_json_line_in_a_container_log() -> None:
    record = {
        "start_time": "2024-12-17T10:00:01.000Z",
        "response_code": 503,
        "response_flags": "UH",
        "response_code_details": "no_healthy_upstream",
        "upstream_cluster": "outbound|8000||vllm-llama.llm.svc.cluster.local",
        "upstream_host": None,
        "duration": 0,
    }
    line = LogLine(time=5.0, text=json.dumps(record), namespace="istio-system", pod="gw-1")
    sig = signal_from_lb_line(line, SRC)
    assert sig is not None and sig.time == 5.0
    assert sig.attrs["upstream"] == "llm-vllm-llama-8000"
    assert sig.attrs["response_flags"] == "UH" and sig.attrs["upstream_addr"] is None
    (raw,) = parse_record(json.dumps(record), SRC)
    assert raw.time == pytest.approx(1734429601.0) and raw.attrs == sig.attrs


def test_envoy_json_with_a_bad_code_is_rejected() -> None:
    bad = {"start_time": "2024-12-17T10:00:01Z", "response_code": "abc", "response_flags": "-"}
    with pytest.raises(ParseError) as err:
        signals_from_lb_json(bad, SRC)
    assert err.value.reason == "bad_value"
    # an application's own JSON line that happens to say response_code is no Envoy line
    app = LogLine(time=1.0, text='{"msg": "done", "response_code": "OK"}')
    assert signal_from_lb_line(app, SRC) is None


def test_envoy_json_needs_a_time_as_a_bare_record() -> None:
    record = {"response_code": "503", "response_flags": "UF"}
    with pytest.raises(ParseError) as err:
        signals_from_lb_json(record, SRC)
    assert err.value.reason == "missing_timestamp"
    (sig,) = signals_from_lb_json(record, SRC, default_time=3.0) or []
    assert sig.time == 3.0


@pytest.mark.parametrize(
    "text",
    [
        '[2024-13-45T99:00:00.000Z] "GET / HTTP/1.1" 503 UH 0 0 0 - "-" "-" "-" "-" "-"',
        (
            "http 2018-99-02T22:23:00.186641Z app/x/1 1.2.3.4:1 - -1 -1 -1 503 - 1 2 "
            '"GET http://x:80/ HTTP/1.1" "-" - - -'
        ),
        (
            "10.0.1.2:33317 [31/Foo/2009:12:14:14.655] http-in static/srv1 10/0/30/69/109 "
            '200 2750 - - ---- 1/1/1/1/0 0/0 "GET / HTTP/1.1"'
        ),
        (
            "2023/13/45 25:00:00 [error] 1#1: *1 upstream timed out (110: x) while connecting to "
            'upstream, client: 1.2.3.4, server: x, request: "GET / HTTP/1.1", upstream: '
            '"http://10.0.0.1:80/", host: "x"'
        ),
    ],
)
def test_bad_time_fields(text: str) -> None:
    """A recognized bare line with a bad time is rejected; in a log, the envelope times it."""
    with pytest.raises(ParseError) as err:
        signal_from_raw_lb_line(text, SRC, SCRAPE)
    assert err.value.reason == "bad_timestamp"
    assert signal_from_lb_line(LogLine(time=1.0, text=text), SRC) is not None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[",
        '"',
        "{",
        "<134>",
        "haproxy[1]: ",
        "2024/12/17 10:00:01 [error] 1#1: *1 upstream timed out",
        '[2024-12-17T10:00:01.000Z] "GET / HTTP/1.1" 503',  # cut before the flags
        '[2024-12-17T10:00:01.000Z] "GET / HTTP/1.1" abc UH',
        "http 2018-07-02T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 1.2.3.4:1",
        "26848/   0/-1/-1/26849",  # HAProxy timers without the status
        "10.0.1.2:33317 [06/Feb/2009:12:14:14.655] http-in static/srv1 10/0/30/69/109 -1 0",
        "INFO 12-17 10:00:01 engine.py:267] Added request cmpl-1.",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "200 OK",
        "503 Service Unavailable",
        '{"level": "info", "msg": "request served", "status": 503}',
    ],
)
def test_not_lb_lines(text: str) -> None:
    assert parse_lb_text(text) is None
    assert signal_from_raw_lb_line(text, SRC, SCRAPE) is None


def test_alb_fields() -> None:
    text = (
        "h2 2024-12-17T10:00:01.000000Z app/llm-alb/50dc6c495c0c9188 203.0.113.5:4321 "
        "10.0.3.7:8000 0.001 -1 -1 504 - 512 0 "
        '"POST https://llm.example.com:443/v1/completions HTTP/2.0" "python-requests/2.31.0" '
        "ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 "
        "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/k8s-llm-vllmllam-0a1b2c3d4e/"
        '73e2d6bc24d8a067 "Root=1-x" "llm.example.com" "-" 1 2024-12-17T09:59:01.000000Z '
        '"forward" "-" "Target.Timeout" "10.0.3.7:8000" "-" "-" "-" TID_1'
    )
    parsed = parse_lb_text(text)
    assert parsed is not None
    assert parsed.attrs["status"] == 504 and parsed.attrs["upstream_status"] is None
    assert parsed.attrs["upstream"] == "k8s-llm-vllmllam-0a1b2c3d4e"
    assert parsed.attrs["error_reason"] == "Target.Timeout"
    assert parsed.attrs["request_time_s"] is None


# --- robustness ------------------------------------------------------------------------------


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises_anything_but_parse_error(text: str) -> None:
    for call in (
        lambda: signal_from_raw_lb_line(text, SRC),
        lambda: signal_from_raw_lb_line(text, SRC, SCRAPE),
        lambda: signal_from_lb_line(LogLine(time=1.0, text=text), SRC),
    ):
        with contextlib.suppress(ParseError):
            call()


_PREFIXES = [row["text"] for row in _rows()] + [ENVOY_DEFAULT, ISTIO_OUTBOUND, ISTIO_INBOUND]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_PREFIXES), st.integers(min_value=0, max_value=400), st.text(max_size=20))
def test_truncated_and_mangled_real_lines(base: str, cut: int, junk: str) -> None:
    """Real lines cut anywhere and with junk spliced in still never raise but ParseError."""
    for text in (base[:cut], base[:cut] + junk + base[cut:], junk + base):
        with contextlib.suppress(ParseError):
            signal_from_raw_lb_line(text, SRC)
        with contextlib.suppress(ParseError):
            signal_from_lb_line(LogLine(time=1.0, text=text), SRC)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_KEYS = st.sampled_from(
    [
        "httpRequest",
        "http_request",
        "jsonPayload",
        "resource",
        "timestamp",
        "status",
        "response_code",
        "responseCode",
        "response_flags",
        "upstream_cluster",
        "start_time",
        "duration",
        "labels",
        "value",
        "name",
    ]
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_KEYS, _JSON, max_size=6))
def test_arbitrary_json_never_raises_anything_but_parse_error(obj: dict[str, Any]) -> None:
    with contextlib.suppress(ParseError):
        signals_from_lb_json(obj, SRC)


_SHAPED = (
    st.fixed_dictionaries(
        {
            "httpRequest": st.fixed_dictionaries(
                {},
                optional={"status": _JSON, "latency": _JSON, "serverIp": _JSON},
            ),
            "resource": st.fixed_dictionaries(
                {},
                optional={
                    "type": _JSON,
                    "labels": st.dictionaries(st.just("backend_service_name"), _JSON),
                },
            ),
        },
        optional={
            "jsonPayload": st.dictionaries(st.sampled_from(["@type", "statusDetails"]), _JSON),
            "timestamp": _JSON,
        },
    )
    | st.fixed_dictionaries(
        {"response_code": _JSON},
        optional={
            k: _JSON for k in ("response_flags", "upstream_cluster", "start_time", "duration")
        },
    )
    | st.fixed_dictionaries(
        {"labels": st.dictionaries(st.text(max_size=8), _JSON), "value": _JSON},
        optional={
            "name": st.sampled_from(["istio_requests_total", "x"]) | _JSON,
            "timestamp": _JSON,
        },
    )
)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(_SHAPED)
def test_format_shaped_json_never_raises_anything_but_parse_error(obj: dict[str, Any]) -> None:
    with contextlib.suppress(ParseError):
        signals_from_lb_json(obj, SRC)
