"""ingress-nginx access lines in a JSON log-format-upstream -> LB_RESPONSE, or a dead letter.

Fixture rows: fixtures/sources_ingress_nginx_json.jsonl, each with the source of its format
(an ingress-nginx issue, a published controller configuration, a vendor's documented line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from access_json import json_access_line

from detector.errors import ParseError
from detector.events.detect import parse_record, signals_from_log
from detector.events.model import LogLine, SignalKind, SourcePos
from detector.events.sources import ingress_nginx_json
from detector.events.sources.ingress_nginx import access_line_attrs
from detector.events.sources.timeparse import parse_iso8601

FIXTURES = Path(__file__).parent / "fixtures"
CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade" / "lb-access.jsonl"
SRC = SourcePos("ingress", 1)
T = 1741943017.0
KEYS = ("status", "upstream", "upstream_addr", "upstream_status", "request_time_s", "client")


def _rows() -> list[dict[str, Any]]:
    path = FIXTURES / "sources_ingress_nginx_json.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _line(text: str) -> LogLine:
    return LogLine(time=T, text=text, namespace="ingress-nginx", pod="ingress-nginx-ctrl-0")


def _id(row: dict[str, Any]) -> str:
    return f"{row['source'].rsplit('/', 1)[-1]}:{row['note'][:40]}"


@pytest.mark.parametrize("row", [r for r in _rows() if r.get("expect")], ids=_id)
def test_real_lines_read_by_field_name(row: dict[str, Any]) -> None:
    """The same attrs in a controller's log (timed by the envelope) and as a bare line."""
    expect = row["expect"]
    (sig,) = signals_from_log(_line(row["text"]), SRC)
    assert sig.kind is SignalKind.LB_RESPONSE and sig.time == T
    assert sig.pod == "ingress-nginx-ctrl-0" and sig.text == row["text"][:2048]
    for key in KEYS:
        assert sig.attrs[key] == expect[key], key
    assert sig.attrs["count"] == 1
    assert sig.attrs.get("request_bytes") == expect.get("request_bytes")
    single = (sig.attrs["upstream_addr"],) if sig.attrs["upstream_addr"] else ()
    assert len(sig.attrs.get("upstream_addrs", single)) == expect["attempts"]
    (bare,) = parse_record(row["text"], SRC)
    assert bare.attrs == sig.attrs
    assert bare.time == parse_iso8601(expect["time"])


@pytest.mark.parametrize("row", [r for r in _rows() if "reject" in r], ids=_id)
def test_lines_of_the_format_that_cannot_be_read_are_rejected_saying_why(
    row: dict[str, Any],
) -> None:
    with pytest.raises(ParseError) as err:
        signals_from_log(_line(row["text"]), SRC)
    assert err.value.reason == row["reject"]
    assert row["detail"] in err.value.detail
    with pytest.raises(ParseError) as bare:
        parse_record(row["text"], SRC)
    assert bare.value.reason == row["reject"]


@pytest.mark.parametrize("row", [r for r in _rows() if r.get("expect", 0) is None], ids=_id)
def test_other_json_lines_are_left_to_their_readers(row: dict[str, Any]) -> None:
    assert ingress_nginx_json.signal_from_access_line(_line(row["text"]), SRC) is None
    signals = signals_from_log(_line(row["text"]), SRC)
    lb = [s for s in signals if s.kind is SignalKind.LB_RESPONSE]
    if "response_code" in row["text"]:  # Envoy's JSON: its own reader, its own attrs
        assert [s.attrs["response_flags"] for s in lb] == ["UF"]
    else:  # an application's JSON log: classified as any log line
        assert lb == [] and [s.kind for s in signals] == [SignalKind.GPU_OOM]


def test_every_bundled_access_line_reads_the_same_as_json() -> None:
    """The bundled cascade's 1,532 access lines: text and JSON give identical attrs."""
    compared = 0
    for raw in CASCADE.read_text(encoding="utf-8").splitlines():
        text = json.loads(raw)["log"].rstrip("\n")
        obj = json_access_line(text)
        if obj is None:
            continue
        parsed = access_line_attrs(text)
        assert parsed is not None
        (sig,) = signals_from_log(_line(json.dumps(obj)), SRC)
        assert sig.attrs == parsed[0], text
        compared += 1
    assert compared == 1532


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # not access lines: no nginx variable beside the status, or no status at all
        ('{"status": 502, "path": "/v1/completions", "duration": 0.1}', None),
        ('{"upstream_addr": "10.0.0.1:80", "request_time": 0.1}', None),
        ('{"status": {"phase": "Running"}, "metadata": {}}', None),  # a Pod printed
        ('{"tatus": 1, "upstream": [', None),  # no JSON, names no nginx variable
        # upstream by name when "upstream" is no address; unix sockets are addresses
        ('{"status": 502, "upstream": "llm-vllm-8000"}', ("llm-vllm-8000", None)),
        ('{"status": 502, "upstream": "unix:/tmp/a.sock"}', (None, "unix:/tmp/a.sock")),
        # the client from X-Forwarded-For when $proxy_protocol_addr is empty
        ('{"status": 200, "remote_addr": "", "x-forward-for": "198.51.100.1, 10.0.0.2"}', None),
    ],
)
def test_recognition(text: str, expected: tuple[str | None, str | None] | None) -> None:
    sig = ingress_nginx_json.signal_from_access_line(_line(text), SRC)
    if "x-forward-for" in text:
        assert sig is not None and sig.attrs["client"] == "198.51.100.1"
        return
    if expected is None:
        assert sig is None
        return
    assert sig is not None
    assert (sig.attrs["upstream"], sig.attrs["upstream_addr"]) == expected


def test_bare_time_fields() -> None:
    """A bare line is timed by its own field: ISO 8601, $time_local or $msec."""
    base = {"status": 502, "upstream_addr": "10.0.0.1:80"}
    for stamp in ("2025-03-14T09:03:37+00:00", "14/Mar/2025:09:03:37 +0000"):
        (sig,) = parse_record(json.dumps({"time": stamp, **base}), SRC)
        assert sig.time == T
    (sig,) = parse_record(json.dumps({"msec": "1741943017.250", **base}), SRC)
    assert sig.time == pytest.approx(T + 0.25)
    with pytest.raises(ParseError) as err:
        parse_record(json.dumps(base), SRC)  # no time of its own, no default
    assert err.value.reason == "missing_timestamp"
    (sig,) = parse_record(json.dumps(base), SRC, default_time=T)
    assert sig.time == T


def test_a_line_that_is_no_json_is_rejected_not_raised_through() -> None:
    """Only ParseError leaves the reader, whatever the broken line holds (a bad escape)."""
    text = '{"status": 502, "upstream_status": 502, 502, "path": "/a\\q"}'
    with pytest.raises(ParseError) as err:
        signals_from_log(_line(text), SRC)
    assert err.value.reason == "malformed_json"
