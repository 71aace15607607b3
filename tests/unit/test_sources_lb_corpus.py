"""Every row of the shared corpus lb/*.jsonl gives its expected status, or knowingly none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ParseError
from detector.events.detect import parse_record, signals_from_log
from detector.events.model import LogLine, Signal, SignalKind, SourcePos
from detector.events.reader import read_records

LB = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "lb"
pytestmark = pytest.mark.skipif(not LB.is_dir(), reason=f"corpus not found at {LB}")
SCRAPE = 1734429601.0
SRC = SourcePos("corpus", 1)

# (file, row index) -> why the row gives no signal although its label names a status
UNREAD = {
    ("envoy_istio_access.jsonl", 3): "fields as shown by a log UI (key | value), no wire format",
    ("gcp_https_lb.jsonl", 2): "copied from the Logs Explorer UI: summary columns, pseudo-JSON",
    ("ingress_nginx_access.jsonl", 3): "paste fragment that starts mid-line (no request head)",
}
# (file, row index) -> the reason a row is rejected with: a line of a known format cut off
REJECTED = {
    ("ingress_nginx_access.jsonl", 4): "malformed_json",  # JSON log-format-upstream, cut off
}
NO_STATUS = {"lb_tcp_connect_failure", "ambiguous"}  # HAProxy tcplog; a UI paste
RATE_LIMITED = "lb_rate_limited_not_backend_failure"


def _rows() -> list[tuple[str, int, dict[str, Any]]]:
    if not LB.is_dir():
        return []
    out = []
    for path in sorted(LB.glob("*.jsonl")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            row = json.loads(line)
            if "text" in row:
                out.append((path.name, i, row))
    return out


def _lb_signals(text: str) -> list[Signal]:
    """LB signals of a row: a JSON record as a whole, else each line as a container log line."""
    if text.lstrip().startswith("{"):
        try:
            json.loads(text)
        except ValueError:
            pass
        else:
            return [s for s in parse_record(text, SRC) if s.kind is SignalKind.LB_RESPONSE]
    out: list[Signal] = []
    for part in text.split("\n"):
        line = LogLine(time=SCRAPE, text=part, namespace="gw", pod="proxy-0")
        out += [s for s in signals_from_log(line, SRC) if s.kind is SignalKind.LB_RESPONSE]
    return out


@pytest.mark.parametrize(
    ("name", "index", "row"), _rows(), ids=[f"{n}:{i}:{r['expect']}" for n, i, r in _rows()]
)
def test_corpus_row(name: str, index: int, row: dict[str, Any]) -> None:
    if (name, index) in REJECTED:  # never dropped in silence: a dead letter saying why
        with pytest.raises(ParseError) as err:
            _lb_signals(row["text"])
        assert err.value.reason == REJECTED[name, index]
        assert "cut off" in err.value.detail
        return
    signals = _lb_signals(row["text"])
    statuses = [s.attrs["status"] for s in signals]
    if (name, index) in UNREAD or row["expect"] in NO_STATUS:
        assert signals == [], UNREAD.get((name, index), row["expect"])
        return
    if row["expect"] == RATE_LIMITED:
        limited = [s for s in signals if s.attrs.get("rate_limited")]
        assert limited, statuses
        assert all(s.attrs["status"] == 429 for s in limited)  # kept apart from 5xx
        assert all(s.attrs["status"] < 500 for s in signals)
        return
    assert signals, row["format"]
    assert set(statuses) == {row["status"]}
    if "response_flags" in row:
        assert row["response_flags"] in {s.attrs.get("response_flags") for s in signals}
    if row["expect"] == "lb_5xx_error_log":
        assert all(s.attrs["error_log"] for s in signals)


def test_corpus_rows_raw() -> None:
    """The same rows as bare records (no envelope) carry their own time where they have one."""
    timed = 0
    for _name, _index, row in _rows():
        for part in row["text"].split("\n"):
            try:
                signals = parse_record(part, SRC, default_time=SCRAPE)
            except ParseError as exc:
                assert exc.reason in {"malformed_json", "unknown_format", "missing_field"}
                continue
            timed += sum(1 for s in signals if s.time != SCRAPE)
    assert timed >= 10


def test_ingress_nginx_metrics_scrape() -> None:
    signals = []
    for source, raw in read_records([LB / "prometheus_ingress_nginx_metrics_v1_15.prom"]):
        signals += parse_record(raw, source, default_time=SCRAPE)
    (sig,) = signals  # the histogram series and the reload counter are not request counts
    assert sig.attrs["status"] == 200 and sig.attrs["counter_total"] == 1.0
    assert sig.attrs["upstream"] == "monitoring-prometheus-stack-kube-prom-prometheus-0"
    assert sig.time == SCRAPE


def test_envoy_metric_names_note_gives_no_signal() -> None:
    """PromQL and comments are not samples; the look-alike ``{code=429}`` is no sample either."""
    for source, raw in read_records([LB / "prometheus_envoy_upstream_rq_xx_names.txt"]):
        try:
            assert parse_record(raw, source, default_time=SCRAPE) == []
        except ParseError as exc:
            assert exc.reason in {"unknown_format", "missing_field", "malformed_metric"}
