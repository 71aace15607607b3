"""The client distribution of a workload's traffic: per window, bounded, carried to planning."""

from __future__ import annotations

from typing import Any

from detector.config import CorrelateSettings
from detector.correlate.correlator import Correlator
from detector.correlate.state import EvidenceAdded
from detector.correlate.windows import SLOTS_PER_WINDOW, ClientWindow
from detector.events.model import Signal, SignalKind, SourcePos
from detector.runbooks.planner import traffic_before

T0 = 1_732_890_000.0
UPSTREAM = "llm-vllm-llama-8000"
CONTROLLER = "ingress-nginx-controller-5c8d-abcde"


def test_counts_clients_their_busiest_and_the_proxies() -> None:
    window = ClientWindow(30.0)
    for i in range(10):
        window.add(T0 + i, f"10.0.0.{i % 4}", CONTROLLER)
    window.add(T0 + 9, "10.0.0.0", "ingress-nginx-controller-5c8d-fghij", count=3)
    window.add(T0 + 9, None, CONTROLLER)  # a line without a client counts no client
    stats = window.stats(T0 + 9)
    assert (stats.clients, stats.max_requests, stats.requests) == (4, 6, 13)
    assert stats.proxies == 2 and not stats.capped
    assert 25.0 <= stats.span_s <= 30.0  # the window less at most one slot


def test_old_slots_leave_the_window_and_a_late_record_joins_its_own() -> None:
    window = ClientWindow(30.0)
    window.add(T0, "a", None)
    window.add(T0 + 20, "b", None)
    window.add(T0 + 5, "c", None)  # late, still in the window
    assert window.stats(T0 + 20).clients == 3
    window.add(T0 + 40, "d", None)
    assert window.stats(T0 + 40).clients == 2  # a and c are older than the window
    window.add(T0 + 1, "e", None)  # too late: dropped
    assert window.stats(T0 + 40).clients == 2


def test_memory_is_bounded_by_the_window_and_the_cap() -> None:
    window = ClientWindow(30.0, max_clients=100)
    for second in range(600):  # 10 minutes, 50 new addresses every second
        for i in range(50):
            window.add(T0 + second, f"c{second}-{i}", CONTROLLER)
    slots = window._slots
    assert len(slots) <= SLOTS_PER_WINDOW
    assert all(len(slot[1]) <= 100 for slot in slots)
    stats = window.stats(T0 + 599)
    assert stats.capped and stats.clients <= 100 * SLOTS_PER_WINDOW  # at least this many


def lb(t: float, status: int, client: str | None, **attrs: Any) -> Signal:
    attrs = {"status": status, "upstream": UPSTREAM, "count": 1, "client": client, **attrs}
    return Signal(
        SignalKind.LB_RESPONSE,
        T0 + t,
        SourcePos("rec", int(t * 100)),
        "ingress-nginx",
        CONTROLLER,
        attrs=attrs,
    )


def oom(t: float, pod: str) -> Signal:
    return Signal(
        SignalKind.GPU_OOM,
        T0 + t,
        SourcePos("rec", 10**6 + int(t)),
        "llm",
        pod,
        "vllm",
        attrs={"framework": "pytorch"},
    )


def test_the_surge_summary_and_the_context_carry_the_clients() -> None:
    pods = [f"vllm-llama-7d9f8b6c5d-{s}" for s in ("x2k4p", "b7q9z", "m4n8w")]
    healthy = [lb(i * 0.25, 200, f"203.0.113.{i % 20}") for i in range(240)]  # 20 clients, 4/s
    errors = [lb(60 + i * 0.1, 503, f"203.0.113.{i % 20}") for i in range(300)]
    signals = sorted([*healthy, *errors, oom(55, pods[0]), oom(70, pods[1])], key=lambda s: s.time)
    corr = Correlator(CorrelateSettings())
    out = corr.observe_all(signals)
    surge = [d.signal for d in out if isinstance(d, EvidenceAdded) and d.kind == "lb_errors"]
    assert surge, "a 5xx surge attaches its window summary"
    attrs = surge[0].attrs
    assert attrs["clients"] == 20 and attrs["proxies"] == 1
    assert attrs["client_max_requests"] >= 5 and attrs["clients_span_s"] > 0
    key = next(d.key for d in out if isinstance(d, EvidenceAdded))
    ctx = corr.context(key)
    assert ctx is not None
    traffic = traffic_before(ctx.signals, T0 + 70, 60.0)
    assert traffic.clients == 20 and traffic.proxies == 1
    assert traffic.client_max_rate_per_s is not None and traffic.client_max_rate_per_s > 0


def test_a_sidecar_is_no_proxy_and_its_peer_no_client() -> None:
    window = Correlator(CorrelateSettings())
    serving = "vllm-llama-7d9f8b6c5d-x2k4p"
    sidecar = Signal(
        SignalKind.LB_RESPONSE,
        T0,
        SourcePos("rec", 1),
        "llm",
        serving,
        attrs={"status": 200, "count": 1, "client": None, "sidecar": True},
    )
    window.observe(sidecar)
    (ws,) = window.workloads.values()
    assert ws.clients.stats(T0).proxies == 0 and ws.clients.stats(T0).clients == 0
