"""How an incident's evidence looks at a moment, and the checks that verify a step. Pure.

A ``Health`` is read from the ``IncidentContext`` the correlator keeps: the victims, the latest
GPU OOM, the latest load-balancer window's 5xx rate, the latest memory-ceiling crossing and the
pods seen Ready. The step machine keeps the one taken when a step was applied (its baseline)
and compares it with a later one: did errors fall, did OOMs stop, did memory stop rising.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from detector.correlate.context import IncidentContext
from detector.events.model import SignalKind


@dataclass(frozen=True, slots=True)
class Health:
    """The evidence of one incident at ``time`` (Unix seconds, event time).

    ``last_oom`` and ``last_pressure`` are (time, pod) of the latest GPU OOM and of the latest
    crossing of a memory ceiling (GPU memory, KV cache, preemptions, queue depth: the signals
    the correlator marks with ``pressure``); ``error_rate_per_s`` is the 502/503/504 rate of
    the latest load-balancer window (None: no load-balancer data); ``ready`` maps a pod to the
    time it was last seen Ready.
    """

    time: float
    stage: str
    victims: tuple[str, ...] = ()
    last_oom: tuple[float, str] | None = None
    error_rate_per_s: float | None = None
    last_pressure: tuple[float, str] | None = None
    ready: dict[str, float] = field(default_factory=dict)
    start_failed: dict[str, float] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        """Return the snapshot as JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Health:
        """Rebuild a snapshot from ``as_record`` data."""

        def pair(value: Any) -> tuple[float, str] | None:
            return None if value is None else (float(value[0]), str(value[1]))

        return cls(
            time=float(record["time"]),
            stage=str(record["stage"]),
            victims=tuple(record.get("victims") or ()),
            last_oom=pair(record.get("last_oom")),
            error_rate_per_s=record.get("error_rate_per_s"),
            last_pressure=pair(record.get("last_pressure")),
            ready={str(k): float(v) for k, v in (record.get("ready") or {}).items()},
            start_failed={str(k): float(v) for k, v in (record.get("start_failed") or {}).items()},
        )

    def failed_to_start(self, pods: Iterable[str], since: float) -> list[str]:
        """Return the pods of ``pods`` that could not start after ``since`` (their GPU's memory
        held) and were not seen Ready after that."""
        return [
            p
            for p in pods
            if self.start_failed.get(p, float("-inf")) > since
            and self.ready.get(p, float("-inf")) <= self.start_failed[p]
        ]


def health(ctx: IncidentContext) -> Health:
    """Return the health of ``ctx``'s evidence: its latest values, at its latest signal time."""
    last_oom = last_pressure = None
    rate: tuple[float, float] | None = None
    ready: dict[str, float] = {}
    start_failed: dict[str, float] = {}
    for sig in ctx.signals:
        if sig.kind is SignalKind.GPU_OOM and (last_oom is None or sig.time >= last_oom[0]):
            last_oom = (sig.time, sig.pod or "?")
        if "pressure" in sig.attrs and (last_pressure is None or sig.time >= last_pressure[0]):
            last_pressure = (sig.time, sig.pod or "?")
        value = sig.attrs.get("error_rate_per_s")
        is_rate = sig.kind is SignalKind.LB_RESPONSE and isinstance(value, int | float)
        if is_rate and (rate is None or sig.time >= rate[0]):
            rate = (sig.time, float(value or 0))
        if sig.kind is SignalKind.POD_READY and sig.pod:
            ready[sig.pod] = max(sig.time, ready.get(sig.pod, sig.time))
        if sig.kind is SignalKind.START_FAILED and sig.pod:
            start_failed[sig.pod] = max(sig.time, start_failed.get(sig.pod, sig.time))
    return Health(
        time=max((s.time for s in ctx.signals), default=ctx.opened_at),
        stage=ctx.stage,
        victims=ctx.victims,
        last_oom=last_oom,
        error_rate_per_s=None if rate is None else rate[1],
        last_pressure=last_pressure,
        ready=ready,
        start_failed=start_failed,
    )


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One verification check: whether it holds, and the numbers that say so."""

    check: str
    ok: bool
    detail: str


def hms(t: float) -> str:
    """Return ``t`` (Unix seconds) as HH:MM:SS UTC, for timeline lines."""
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S")


def spread(baseline: Health, now: Health) -> list[str]:
    """Return the pods that died of GPU OOM after ``baseline``: the cascade went on."""
    return [p for p in now.victims if p not in baseline.victims]


# check -> (Health field, what a failure saw, what a pass says)
_SINCE = {
    "ooms_stop": ("last_oom", "GPU OOM", "no GPU OOM since the apply"),
    "memory_stops_rising": (
        "last_pressure",
        "memory at the ceiling",
        "no pod reached a memory ceiling since the apply",
    ),
}


def evaluate(
    checks: Iterable[str], baseline: Health, now: Health, *, pods: Iterable[str] = ()
) -> list[CheckResult]:
    """Evaluate each check (``detector.runbooks.definition.Check`` values) since ``baseline``.

    - ``ooms_stop``: no GPU OOM after the baseline;
    - ``errors_fall``: the 5xx rate is 0 or lower than at the baseline (no load-balancer rate
      in the evidence fails it: it cannot be told);
    - ``memory_stops_rising``: no pod crossed a memory ceiling after the baseline;
    - ``pods_ready``: every pod of ``pods`` was seen Ready after the baseline (one that could
      not start since, its GPU's memory held, is named as such).
    """
    since = baseline.time
    out = []
    for check in checks:
        if check in _SINCE:
            field_name, what, fine = _SINCE[check]
            event = getattr(now, field_name)
            bad = event is not None and event[0] > since
            detail = f"{what} in pod {event[1]} at {hms(event[0])}" if bad else fine
            out.append(CheckResult(check, not bad, detail))
        elif check == "errors_fall":
            out.append(_errors_fall(baseline.error_rate_per_s, now.error_rate_per_s))
        elif check == "pods_ready":
            late = [p for p in pods if now.ready.get(p, float("-inf")) <= since]
            held = now.failed_to_start(late, since)
            detail = f"not seen Ready since the apply: {', '.join(late)}" if late else "all Ready"
            if held:
                detail += f" ({', '.join(held)} could not start: GPU memory still held)"
            out.append(CheckResult(check, not late, detail))
        else:
            out.append(CheckResult(check, False, f"unknown check {check!r}"))
    return out


def _errors_fall(before: float | None, after: float | None) -> CheckResult:
    if after is None:
        return CheckResult("errors_fall", False, "no load-balancer rate in the evidence")
    was = "unknown" if before is None else f"{before:.2f}/s"
    ok = after == 0 or (before is not None and after < before)
    return CheckResult("errors_fall", ok, f"5xx rate {was} at the apply, {after:.2f}/s now")
