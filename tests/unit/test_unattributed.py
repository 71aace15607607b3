"""Signals that name no workload: counted by kind and reason, with examples and a hint."""

from __future__ import annotations

import io

from rich.console import Console

from detector.cli.report import render_report
from detector.config import CorrelateSettings
from detector.correlate.correlator import Correlator
from detector.correlate.unattributed import EXAMPLES_KEPT, UnattributedTally, why_unattributed
from detector.events.model import Signal, SignalKind, SourcePos
from detector.report.document import EventCounts, ReplayResult, to_document

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def _sig(kind: SignalKind, line: int, **kw: object) -> Signal:
    return Signal(kind, 100.0 + line, SourcePos("dump.log", line), **kw)  # type: ignore[arg-type]


def test_reasons_and_hints_per_kind() -> None:
    cases = [
        (_sig(SignalKind.GPU_OOM, 1, pod="vllm-0"), "no namespace", "--namespace"),
        (_sig(SignalKind.GPU_OOM, 1), "no namespace and no pod", "--namespace"),
        (_sig(SignalKind.ENGINE_DEAD, 1, namespace="llm"), "no pod", "--pod"),
        (_sig(SignalKind.CRASH_LOOP, 1, pod="vllm-0"), "no namespace", "kubectl get pods -A"),
        (
            _sig(SignalKind.GPU_MEMORY, 1, attrs={"uuid": "GPU-1"}),
            "no namespace and no pod",
            "DCGM",
        ),
        (_sig(SignalKind.LB_RESPONSE, 1, attrs={"status": 503}), "no upstream on the line", ""),
        (
            _sig(SignalKind.LB_RESPONSE, 1, attrs={"upstream": "x"}),
            "upstream matches no workload",
            "--workloads",
        ),
    ]
    for signal, reason, hint_part in cases:
        got_reason, hint = why_unattributed(signal)
        assert got_reason == reason
        assert hint_part in hint


def test_tally_is_bounded_and_keeps_the_first_examples() -> None:
    tally = UnattributedTally()
    for line in range(1, 1001):
        tally.add(_sig(SignalKind.GPU_OOM, line, pod=f"p{line}", node="n1"))
    tally.add(_sig(SignalKind.LB_RESPONSE, 5, attrs={"upstream": "ns-svc-80"}))
    oom, lb = tally.reasons()
    assert (oom.kind, oom.count, len(oom.examples)) == ("gpu_oom", 1000, EXAMPLES_KEPT)
    assert oom.examples[0] == {"source": "dump.log:1", "pod": "p1", "node": "n1"}
    assert (lb.kind, lb.count, lb.examples) == (
        "lb_response",
        1,
        [{"source": "dump.log:5", "upstream": "ns-svc-80"}],
    )


def test_correlator_counts_by_reason() -> None:
    corr = Correlator(CorrelateSettings())
    assert corr.observe(_sig(SignalKind.GPU_OOM, 1, pod="vllm-0", text=OOM)) == []
    assert corr.observe(_sig(SignalKind.GPU_OOM, 2, pod="vllm-1", text=OOM)) == []
    assert corr.unattributed == 2
    (reason,) = corr.unattributed_by_reason.reasons()
    assert (reason.kind, reason.reason, reason.count) == ("gpu_oom", "no namespace", 2)


def _render(counts: EventCounts) -> str:
    buf = io.StringIO()
    render_report(ReplayResult(counts, [], []), Console(file=buf, width=200))
    return buf.getvalue()


def test_report_warns_and_escapes() -> None:
    tally = UnattributedTally()
    tally.add(_sig(SignalKind.GPU_OOM, 1, pod="[red]evil\x1b[0m\npod"))
    counts = EventCounts(signals=1, unattributed=1, unattributed_by_reason=tally.reasons())
    out = _render(counts)
    assert "warning: 1 unattributed GPU OOM signal(s): no namespace" in out
    assert "to tie them: pass --namespace NS" in out
    assert "\x1b" not in out
    assert "[red]evil" in out  # markup printed as text, not applied
    assert "e.g. dump.log:1 (pod [red]evil\\x1b[0m\\npod)" in out
    doc = to_document(ReplayResult(counts, [], []))["events"]
    assert doc["unattributed"] == 1
    assert doc["unattributed_by_reason"][0]["examples"] == [
        {"source": "dump.log:1", "pod": "[red]evil\x1b[0m\npod"}
    ]


def test_report_silent_when_everything_attributed() -> None:
    out = _render(EventCounts(signals=3))
    assert "unattributed" not in out
    assert "warning" not in out


def test_a_web_servers_own_lines_are_noted_not_warned_about() -> None:
    from rich.console import Console

    from detector.cli.report import _render_unattributed

    reason = {"kind": "lb_response", "reason": "no upstream on the line", "hint": "h",
              "count": 3, "examples": []}  # fmt: skip
    console = Console(record=True, width=200)
    _render_unattributed({"unattributed": 3, "unattributed_by_reason": [reason]}, console)
    out = console.export_text()
    assert "note: 3 signal(s) named no workload" in out and "warning" not in out
    oom = {**reason, "kind": "gpu_oom", "reason": "no namespace"}
    console = Console(record=True, width=200)
    _render_unattributed({"unattributed": 4, "unattributed_by_reason": [oom, reason]}, console)
    assert "warning: 4 signal(s) named no workload" in console.export_text()
