"""The evidence's health is read from an incident context, and the checks compare two of them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from detector.correlate.context import IncidentContext
from detector.events.model import Signal, SignalKind, SourcePos
from detector.runbooks.health import Health, evaluate, health, spread

T0 = 1_741_943_000.0
K = SignalKind


def sig(kind: SignalKind, dt: float, pod: str | None = None, **attrs: Any) -> Signal:
    return Signal(kind, T0 + dt, SourcePos("t.log", int(dt) + 100), "llm", pod, attrs=attrs)


def ctx(*signals: Signal, victims: tuple[str, ...] = ("a",)) -> IncidentContext:
    return IncidentContext(
        key="k",
        namespace="llm",
        workload="m",
        workload_kind="Deployment",
        stage="cascading",
        opened_at=T0,
        victims=victims,
        signals=tuple(sorted(signals, key=lambda s: s.time)),
    )


def test_health_reads_the_latest_of_each_measure() -> None:
    h = health(
        ctx(
            sig(K.GPU_OOM, 0, "a"),
            sig(K.GPU_OOM, 30, "b"),
            sig(K.LB_RESPONSE, 10, status=502, error_rate_per_s=3.0),
            sig(K.LB_RESPONSE, 40, status=200, error_rate_per_s=1.5),
            sig(K.LB_RESPONSE, 50, status=200),  # a plain line carries no rate
            sig(K.ENGINE_PRESSURE, 20, "c", kv_cache_usage=0.97, pressure="KV cache"),
            sig(K.POD_READY, 45, "a"),
            sig(K.POD_READY, 35, "a"),
        )
    )
    assert h.time == T0 + 50
    assert h.last_oom == (T0 + 30, "b")
    assert h.error_rate_per_s == 1.5
    assert h.last_pressure == (T0 + 20, "c")
    assert h.ready == {"a": T0 + 45}
    assert Health.from_record(h.as_record()) == h
    assert health(ctx()).time == T0 and health(ctx()).error_rate_per_s is None


BASE = Health(time=T0, stage="cascading", victims=("a",), error_rate_per_s=4.0)


@pytest.mark.parametrize(
    ("check", "now", "ok", "fragment"),
    [
        ("ooms_stop", replace(BASE, last_oom=(T0 - 5, "a")), True, "no GPU OOM"),
        ("ooms_stop", replace(BASE, last_oom=(T0 + 5, "a")), False, "GPU OOM in pod a"),
        ("errors_fall", replace(BASE, error_rate_per_s=1.0), True, "4.00/s at the apply"),
        ("errors_fall", replace(BASE, error_rate_per_s=0.0), True, "0.00/s now"),
        ("errors_fall", replace(BASE, error_rate_per_s=4.0), False, "4.00/s now"),
        ("errors_fall", replace(BASE, error_rate_per_s=None), False, "no load-balancer"),
        ("memory_stops_rising", replace(BASE, last_pressure=(T0 + 1, "c")), False, "pod c"),
        ("memory_stops_rising", BASE, True, "no pod reached"),
        ("pods_ready", replace(BASE, ready={"a": T0 + 1, "b": T0 - 1}), False, ": b"),
        ("pods_ready", replace(BASE, ready={"a": T0 + 1, "b": T0 + 2}), True, "all Ready"),
        ("nonsense", BASE, False, "unknown check"),
    ],
)
def test_checks(check: str, now: Health, ok: bool, fragment: str) -> None:
    (result,) = evaluate([check], BASE, now, pods=["a", "b"])
    assert (result.check, result.ok) == (check, ok)
    assert fragment in result.detail


def test_spread_lists_the_new_victims_only() -> None:
    assert spread(BASE, replace(BASE, victims=("a", "c", "d"))) == ["c", "d"]
    assert spread(BASE, BASE) == []
