"""Upstream 5xx (500 included) counted beside the gateway's own 502/503/504 (issue 11, item 7).

vLLM answers its in-flight requests with 500 when its engine dies; ingress-nginx logs them with
``$upstream_status`` 500 (a list "502, 200" after a retry that the client never saw fail).
"""

from __future__ import annotations

from typing import Any

from detector.config import CorrelateSettings
from detector.correlate.correlator import Correlator
from detector.correlate.state import Decision, EvidenceAdded, IncidentOpened, VerdictRecorded
from detector.correlate.windows import RateWindow, upstream_failed
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.ingress_nginx import access_line_attrs

T0 = 1_732_890_000.0
PODS = [f"vllm-llama-7d9f8b6c5d-{s}" for s in ("x2k4p", "b7q9z", "m4n8w")]
UPSTREAM = "llm-vllm-llama-8000"
# the controller's default upstreaminfo format, one retry: the pod refused, the next answered
RETRIED = (
    '10.0.0.1 - - [14/Mar/2025:09:03:40 +0000] "POST /v1/chat/completions HTTP/1.1" 200 150 '
    '"-" "python" 512 1.204 [llm-vllm-llama-8000] [] 10.1.2.3:8000, 10.1.2.4:8000 0, 150 '
    "0.001, 1.203 502, 200 abc123"
)
_line = iter(range(1, 10**9))


def sig(kind: SignalKind, t: float, pod: str | None = None, **attrs: Any) -> Signal:
    ns = "ingress-nginx" if kind is SignalKind.LB_RESPONSE else "llm"
    return Signal(kind, T0 + t, SourcePos("rec", next(_line)), ns, pod, "vllm", attrs=attrs)


def oom(t: float, pod: str) -> Signal:
    return sig(SignalKind.GPU_OOM, t, pod, framework="pytorch", bytes_tried=2 << 30)


def traffic(t0: float, t1: float, status: int, per_s: int = 5, **attrs: Any) -> list[Signal]:
    return [
        sig(SignalKind.LB_RESPONSE, t0 + i / per_s, status=status, upstream=UPSTREAM, **attrs)
        for i in range(int((t1 - t0) * per_s))
    ]


def run(signals: list[Signal]) -> list[Decision]:
    return Correlator(CorrelateSettings()).observe_all(sorted(signals, key=lambda s: s.time))


def test_a_retried_try_that_failed_is_an_upstream_error() -> None:
    parsed = access_line_attrs(RETRIED)
    assert parsed is not None
    attrs = parsed[0]
    assert attrs["status"] == 200 and attrs["upstream_statuses"] == (502, 200)
    assert upstream_failed(attrs["upstream_status"], attrs.get("upstream_statuses"))
    assert upstream_failed(500) and not upstream_failed(200) and not upstream_failed(None)
    assert not upstream_failed(200, (404, 200))


def test_the_window_counts_gateway_and_upstream_errors_apart_and_once_together() -> None:
    lb = RateWindow(10.0)
    lb.add(0.0, 502, upstream_error=True)  # the gateway passed the pod's 502 on
    lb.add(0.5, 500, upstream_error=True)  # a dying engine's 500
    lb.add(1.0, 503)  # no endpoint: the gateway's own
    lb.add(1.5, 200, 2)
    assert (lb.errors, lb.upstream_errors, lb.failed, lb.total) == (2, 2, 3, 5)
    assert lb.upstream_error_ratio == 0.4 and lb.upstream_error_rate_per_s == 0.2
    assert lb.fails(0.3, 0.6) and not lb.exceeds(0.3, 0.6)
    lb.advance(10.9)  # the first second leaves the window
    assert (lb.errors, lb.upstream_errors, lb.failed, lb.total) == (1, 0, 1, 3)


def test_upstream_500s_with_gpu_ooms_are_the_cascade_with_both_figures() -> None:
    signals = [*traffic(0, 200, 200, upstream_status=200), oom(60, PODS[0]), oom(100, PODS[1])]
    signals += traffic(60, 200, 500, per_s=10, upstream_status=500)
    out = run(signals)
    assert sum(isinstance(d, IncidentOpened) for d in out) == 1
    lb = [d for d in out if isinstance(d, EvidenceAdded) and d.kind == "lb_errors"]
    assert lb
    attrs = lb[0].signal.attrs
    assert attrs["error_rate_per_s"] == 0 and attrs["upstream_error_rate_per_s"] >= 1
    assert lb[0].summary.startswith("upstream 5xx surge at upstream llm-vllm-llama-8000")
    assert not any(isinstance(d, VerdictRecorded) for d in out)


def test_upstream_5xx_hidden_by_retries_without_an_oom_is_not_this_pattern() -> None:
    ok = traffic(0, 60, 200, upstream_status=200)
    retried = traffic(60, 150, 200, per_s=10, upstream_status=200, upstream_statuses=(502, 200))
    out = run(ok + retried)
    verdicts = [d for d in out if isinstance(d, VerdictRecorded)]
    assert len(verdicts) == 1 and "no GPU OOM" in verdicts[0].reason
    assert verdicts[0].reason.startswith("upstream 5xx surge")
    assert not any(isinstance(d, IncidentOpened) for d in out)


def test_gateway_errors_keep_their_figure_and_name_the_upstream_ones() -> None:
    signals = [*traffic(0, 200, 200, upstream_status=200), oom(60, PODS[0])]
    signals += traffic(60, 200, 502, per_s=10, upstream_status=502)
    lb = [d for d in run(signals) if isinstance(d, EvidenceAdded) and d.kind == "lb_errors"]
    assert lb and lb[0].summary.startswith("5xx surge at upstream llm-vllm-llama-8000: ")
    assert "; upstream pods answered 5xx to" in lb[0].summary
    attrs = lb[0].signal.attrs
    assert attrs["error_rate_per_s"] == attrs["upstream_error_rate_per_s"] >= 1


def test_500s_without_an_upstream_status_are_not_counted() -> None:
    out = run(traffic(0, 60, 200) + traffic(60, 150, 500, per_s=10))
    assert out == []
