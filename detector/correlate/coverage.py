"""Which of the four signals each workload has seen, and for each one missing, why.

The four signals are the streams the cascade pattern reads (DESIGN.md section 2): the
container logs (``gpu_oom``: GPU OOMs, engine start-up and death lines), the pod states and
events (``crash_loop``: crash loops, readiness, OOMKilled), the load balancer's lines
(``lb_errors``) and the GPU memory readings (``gpu_memory``: DCGM, NVML / nvidia-smi, an
engine's KV cache). A signal a workload lacks is missing for one of four reasons, told in
this order: lines of it came that named no workload (``not attributed``, with the hint of
``unattributed.py``), lines of it came for other workloads only (``other workloads only``),
records came that the detector could not read (``format not read``, the dead letters), or
none came at all (``no lines``).

The correlator counts each workload's signals by kind (``WorkloadState.seen``: one increment
per signal); this module turns those counts into coverage when a face asks, never per record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from detector.correlate.identity import WorkloadRef
from detector.correlate.state import WorkloadState
from detector.correlate.unattributed import NO_UPSTREAM, UnattributedReason
from detector.events.model import SignalKind
from detector.events.streams import Stream

SIGNALS: Final = ("gpu_oom", "crash_loop", "lb_errors", "gpu_memory")
SIGNAL_OF: Final[Mapping[SignalKind, str]] = {
    SignalKind.GPU_OOM: "gpu_oom",
    SignalKind.ENGINE_DEAD: "gpu_oom",
    SignalKind.START_FAILED: "gpu_oom",
    SignalKind.ENGINE_CONFIG: "gpu_oom",
    SignalKind.CRASH_CAUSE: "gpu_oom",
    SignalKind.CRASH_LOOP: "crash_loop",
    SignalKind.POD_READY: "crash_loop",
    SignalKind.HOST_OOM: "crash_loop",
    SignalKind.POD_ADDRESS: "crash_loop",
    SignalKind.LB_RESPONSE: "lb_errors",
    SignalKind.GPU_MEMORY: "gpu_memory",
    SignalKind.ENGINE_PRESSURE: "gpu_memory",
}
# the signals a stream's unreadable records may have held (the metrics topic carries
# load-balancer counters too); records of no known stream (files) may have held any
STREAM_SIGNALS: Final[Mapping[Stream, tuple[str, ...]]] = {
    Stream.LOGS: ("gpu_oom",),
    Stream.EVENTS: ("crash_loop",),
    Stream.LB: ("lb_errors",),
    Stream.METRICS: ("gpu_memory", "lb_errors"),
}
# dead-letter reasons of records that were read but had a bad time: their format was known
READ_REASONS: Final = frozenset({"timestamp_out_of_range", "timestamp_jump", "processing_failed"})

NOT_ATTRIBUTED: Final = "not attributed"
OTHER_WORKLOADS: Final = "other workloads only"
FORMAT_NOT_READ: Final = "format not read"
NO_LINES: Final = "no lines"
REASONS: Final = (NOT_ATTRIBUTED, OTHER_WORKLOADS, FORMAT_NOT_READ, NO_LINES)

WHAT: Final[Mapping[str, str]] = {
    "gpu_oom": "container log lines with a signal (GPU OOM, engine start-up or death)",
    "crash_loop": "pod states or events (crash loop, readiness, OOMKilled)",
    "lb_errors": "load-balancer lines (access log or counters)",
    "gpu_memory": "GPU memory readings (DCGM, nvidia-smi, engine KV cache)",
}
NO_LINES_HINT: Final[Mapping[str, str]] = {
    "gpu_oom": "replay the container logs (kubectl logs, Fluent Bit or Vector records), or "
    "ship them to the logs topic",
    "crash_loop": "replay the pod events and objects (kubectl get events -A -o json, kubectl get "
    "pods -A -o yaml), or ship them to the events topic",
    "lb_errors": "replay the gateway's access log (ingress-nginx, Envoy, Kong, nginx), or ship "
    "it to the load-balancer topic",
    "gpu_memory": "replay the DCGM exporter's metrics or detector gpu-sample's lines, or ship "
    "them to the metrics topic",
}
OTHER_HINT: Final = (
    "the workload is told from the pod's owner references and labels, a load-balancer line "
    "from its upstream: replay the pod objects too (kubectl get pods -A -o yaml), or map the "
    "upstream in a workloads file (--workloads)"
)
FORMAT_HINT: Final = (
    "records in a format the detector could not read: detector dead-letters shows them "
    "(--reason unknown_format); a plain-text log of one pod needs --namespace NS --pod POD"
)
FORGOTTEN: Final = "workloads forgotten since (one pod each, idle past the window)"
NAMED_KEPT: Final = 3  # other workloads (or reasons) named in a detail


@dataclass(frozen=True, slots=True)
class SignalCoverage:
    """One signal of one workload: ``count`` signals of it seen; when none, why (``reason``,
    one of ``REASONS``), what was found (``detail``) and what would bring it in (``hint``)."""

    signal: str
    count: int
    reason: str = ""
    detail: str = ""
    hint: str = ""

    def to_dict(self) -> dict[str, str | int]:
        """Return the stored form (``Incident.coverage``: a list of these)."""
        return {
            "signal": self.signal,
            "count": self.count,
            "reason": self.reason,
            "detail": self.detail,
            "hint": self.hint,
        }


def retire(retired: dict[SignalKind, int], seen: Mapping[SignalKind, int]) -> None:
    """Add a forgotten workload's counts to ``retired`` (the input's totals keep them)."""
    for kind, count in seen.items():
        retired[kind] = retired.get(kind, 0) + count


def by_signal(seen: Mapping[SignalKind, int]) -> dict[str, int]:
    """Return the counts by kind summed by signal (``SIGNAL_OF``; other kinds left out)."""
    out = dict.fromkeys(SIGNALS, 0)
    for kind, count in seen.items():
        signal = SIGNAL_OF.get(kind)
        if signal is not None:
            out[signal] += count
    return out


def of_workloads(
    workloads: Mapping[WorkloadRef, WorkloadState],
    unattributed: Iterable[UnattributedReason],
    rejected: Mapping[tuple[Stream | None, str], int],
    retired: Mapping[SignalKind, int] | None = None,
) -> dict[WorkloadRef, list[SignalCoverage]]:
    """Return each workload's coverage of ``SIGNALS``, in that order.

    ``unattributed``: the tally's reasons (``UnattributedTally.reasons()``); ``rejected``:
    dead letters counted by (their stream, or None when unknown, e.g. a file; reason);
    ``retired``: the counts of workloads the correlator forgot (``Correlator.retired``).
    """
    counts = {ref: by_signal(ws.seen) for ref, ws in workloads.items()}
    holders = {  # per signal, the workloads that saw it, most first
        s: sorted(((c[s], ref.label) for ref, c in counts.items() if c[s]), reverse=True)
        for s in SIGNALS
    }
    for s, n in by_signal(retired or {}).items():
        if n:
            holders[s].append((n, FORGOTTEN))
    left_out, notes = _left_out(unattributed)
    unread = _unread(rejected)
    return {
        ref: [
            SignalCoverage(s, n)
            if (n := own[s])
            else _missing(s, holders[s], left_out.get(s, []), unread.get(s, {}), notes.get(s, ""))
            for s in SIGNALS
        ]
        for ref, own in counts.items()
    }


def _left_out(
    unattributed: Iterable[UnattributedReason],
) -> tuple[dict[str, list[UnattributedReason]], dict[str, str]]:
    """Return the unattributed reasons per signal, and per signal a note for ``no lines``.

    A web server's own access lines (no upstream: nothing proxied) are no load balancer's
    lines (``streams.stream_of``): they only get a note.
    """
    left_out: dict[str, list[UnattributedReason]] = {}
    web_lines = 0
    for r in unattributed:
        signal = SIGNAL_OF.get(SignalKind(r.kind))
        if signal == "lb_errors" and r.reason == NO_UPSTREAM:
            web_lines += r.count
        elif signal is not None:
            left_out.setdefault(signal, []).append(r)
    if not web_lines:
        return left_out, {}
    return left_out, {"lb_errors": f" ({web_lines} web server access lines name no upstream)"}


def _unread(rejected: Mapping[tuple[Stream | None, str], int]) -> dict[str, dict[str, int]]:
    """Return, per signal, the dead letters (by reason) that may have held its lines."""
    out: dict[str, dict[str, int]] = {}
    for (stream, reason), count in rejected.items():
        if reason in READ_REASONS or count <= 0:
            continue
        for signal in SIGNALS if stream is None else STREAM_SIGNALS[stream]:
            reasons = out.setdefault(signal, {})
            reasons[reason] = reasons.get(reason, 0) + count
    return out


def _missing(
    signal: str,
    others: list[tuple[int, str]],
    left_out: list[UnattributedReason],
    unread: Mapping[str, int],
    note: str = "",
) -> SignalCoverage:
    """Return why a workload saw no ``signal``: the first of ``REASONS`` that holds.

    ``others``: (count, label) of the workloads that saw it, most first; ``note`` ends the
    detail of ``no lines``.
    """
    what = WHAT[signal]
    if left_out:
        total = sum(r.count for r in left_out)
        why = "; ".join(f"{r.reason} ({r.count})" for r in left_out[:NAMED_KEPT])
        detail = f"{total} {what} named no workload: {why}"
        return SignalCoverage(signal, 0, NOT_ATTRIBUTED, detail, left_out[0].hint)
    if others:
        total = sum(n for n, _ in others)
        named = ", ".join(f"{label} ({n})" for n, label in others[:NAMED_KEPT])
        more = f" and {len(others) - NAMED_KEPT} more" if len(others) > NAMED_KEPT else ""
        detail = f"{total} {what} went to other workloads: {named}{more}"
        return SignalCoverage(signal, 0, OTHER_WORKLOADS, detail, OTHER_HINT)
    if unread:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(unread.items()))
        detail = (
            f"no {what} read; {sum(unread.values())} record(s) could not be read "
            f"({reasons}), perhaps its lines"
        )
        return SignalCoverage(signal, 0, FORMAT_NOT_READ, detail, FORMAT_HINT)
    detail = f"no {what} in the input, for any workload{note}"
    return SignalCoverage(signal, 0, NO_LINES, detail, NO_LINES_HINT[signal])
