"""Signal coverage per workload: which of the four signals it saw, and why each missing one is
missing (no lines, not attributed, other workloads only, format not read), never in silence."""

from __future__ import annotations

import io
from collections.abc import Mapping

from prometheus_client import generate_latest
from rich.console import Console

from detector.cli.report import render_incident
from detector.config import CorrelateSettings, Settings
from detector.correlate.correlator import Correlator
from detector.correlate.coverage import (
    FORMAT_NOT_READ,
    NO_LINES,
    NOT_ATTRIBUTED,
    OTHER_WORKLOADS,
    SIGNAL_OF,
    SIGNALS,
    SignalCoverage,
    of_workloads,
)
from detector.correlate.identity import WorkloadRef
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.streams import Stream
from detector.pipeline import Processor
from detector.report.coverage import coverage_document, coverage_text
from detector.stream.metrics import COVERAGE_WORKLOADS_MAX, LoopMetrics

LLM = WorkloadRef("llm", "vllm")
WEB = WorkloadRef("web", "front")


def _sig(kind: SignalKind, line: int, **kw: object) -> Signal:
    return Signal(kind, 100.0 + line, SourcePos("dump.log", line), **kw)  # type: ignore[arg-type]


def _oom(pod: str = "vllm-6f7d8c9b5-abcde", namespace: str = "llm", line: int = 1) -> Signal:
    return _sig(SignalKind.GPU_OOM, line, namespace=namespace, pod=pod)


def _lb(upstream: str, line: int = 2, **attrs: object) -> Signal:
    return _sig(SignalKind.LB_RESPONSE, line, attrs={"status": 200, "upstream": upstream, **attrs})


def _coverage(
    signals: list[Signal], rejected: Mapping[tuple[Stream | None, str], int] | None = None
) -> dict[WorkloadRef, dict[str, SignalCoverage]]:
    c = Correlator(CorrelateSettings())
    c.observe_all(signals)
    found = of_workloads(c.workloads, c.unattributed_by_reason.reasons(), rejected or {})
    return {ref: {e.signal: e for e in entries} for ref, entries in found.items()}


def test_every_signal_kind_counts_for_one_of_the_four() -> None:
    assert set(SIGNAL_OF) == set(SignalKind)
    assert set(SIGNAL_OF.values()) == set(SIGNALS)


def test_seen_signals_are_counted_per_workload() -> None:
    pod = "vllm-6f7d8c9b5-abcde"
    cov = _coverage(
        [
            _oom(pod),
            _sig(SignalKind.CRASH_LOOP, 2, namespace="llm", pod=pod),
            _sig(SignalKind.GPU_MEMORY, 3, namespace="llm", pod=pod, attrs={"used_bytes": 1}),
            _sig(SignalKind.ENGINE_PRESSURE, 4, namespace="llm", pod=pod, attrs={}),
            _lb("llm-vllm-8000", 5),
            _lb("llm-vllm-8000", 6),
        ]
    )[LLM]
    assert {s: (e.count, e.reason) for s, e in cov.items()} == {
        "gpu_oom": (1, ""),
        "crash_loop": (1, ""),
        "lb_errors": (2, ""),
        "gpu_memory": (2, ""),
    }


def test_no_lines_at_all() -> None:
    lb = _coverage([_oom()])[LLM]["lb_errors"]
    assert (lb.count, lb.reason) == (0, NO_LINES)
    assert "no load-balancer lines" in lb.detail and "access log" in lb.hint


def test_a_web_servers_own_access_lines_are_no_load_balancer_lines() -> None:
    """Lines without an upstream (static files, nothing proxied) are noted, not a reason."""
    web_line = _sig(SignalKind.LB_RESPONSE, 2, attrs={"status": 200})
    lb = _coverage([_oom(), web_line])[LLM]["lb_errors"]
    assert lb.reason == NO_LINES
    assert lb.detail.endswith("(1 web server access lines name no upstream)")


def test_lines_that_named_no_workload_are_not_attributed_with_the_hint() -> None:
    lb = _coverage([_oom(), _lb("vllm_backend"), _lb("vllm_backend", 3)])[LLM]["lb_errors"]
    assert (lb.count, lb.reason) == (0, NOT_ATTRIBUTED)
    assert lb.detail.startswith("2 load-balancer lines")
    assert "upstream matches no workload (2)" in lb.detail
    assert "--workloads" in lb.hint


def test_lines_of_other_workloads_only_name_them() -> None:
    cov = _coverage([_oom(), _lb("web-front-80"), _lb("web-front-80", 3)])
    lb = cov[LLM]["lb_errors"]
    assert (lb.reason, lb.detail) == (
        OTHER_WORKLOADS,
        "2 load-balancer lines (access log or counters) went to other workloads: web/front (2)",
    )
    assert cov[WEB]["lb_errors"].count == 2
    assert cov[WEB]["gpu_oom"].reason == OTHER_WORKLOADS


def test_unreadable_records_of_a_file_may_be_any_signal_of_a_topic_its_streams() -> None:
    cov = _coverage([_oom()], {(None, "unknown_format"): 3})[LLM]
    assert {s: e.reason for s, e in cov.items() if e.reason} == dict.fromkeys(
        ("crash_loop", "lb_errors", "gpu_memory"), FORMAT_NOT_READ
    )
    assert "3 record(s) could not be read (unknown_format=3)" in cov["lb_errors"].detail
    assert "dead-letters" in cov["lb_errors"].hint
    by_topic = _coverage([_oom()], {(Stream.LB, "malformed_json"): 2})[LLM]
    assert by_topic["lb_errors"].reason == FORMAT_NOT_READ
    assert by_topic["gpu_memory"].reason == NO_LINES
    metrics = _coverage([_oom()], {(Stream.METRICS, "malformed_metric"): 1})[LLM]
    assert metrics["gpu_memory"].reason == metrics["lb_errors"].reason == FORMAT_NOT_READ
    late = _coverage([_oom()], {(None, "timestamp_out_of_range"): 5})[LLM]  # read, badly timed
    assert late["lb_errors"].reason == NO_LINES


def test_a_forgotten_workloads_lines_still_count_as_other_workloads() -> None:
    c = Correlator(CorrelateSettings())
    c.observe(_lb("web-front-80"))
    c.retired = dict(c.workloads.pop(WEB).seen)  # as _forget_idle does
    c.observe(_oom())
    found = of_workloads(c.workloads, [], {}, c.retired)
    lb = {e.signal: e for e in found[LLM]}["lb_errors"]
    assert lb.reason == OTHER_WORKLOADS and "forgotten" in lb.detail


def test_the_document_says_why_a_seen_signal_left_no_evidence() -> None:
    stored = [
        SignalCoverage("gpu_oom", 3).to_dict(),
        SignalCoverage("lb_errors", 1502).to_dict(),
        SignalCoverage(
            "gpu_memory", 0, NO_LINES, "no GPU memory readings", "replay DCGM"
        ).to_dict(),
    ]
    doc = coverage_document(stored, {"gpu_oom"})
    assert [(e["signal"], e["seen"], e["evidence"], e["reason"]) for e in doc] == [
        ("gpu_oom", True, True, ""),
        ("lb_errors", True, False, ""),
        ("gpu_memory", False, False, NO_LINES),
    ]
    assert coverage_text(doc[0]) == "gpu_oom: 3 seen"
    assert (
        coverage_text(doc[1])
        == "lb_errors: 1502 seen, no evidence: no 5xx surge while the incident was open"
    )
    assert coverage_text(doc[2]) == "gpu_memory: missing (no lines): no GPU memory readings"
    assert coverage_document(None, set()) == []


def test_the_console_prints_every_missing_signal_escaped() -> None:
    detail = "[red]x[/red] \x1b[2J went to other workloads"
    inc = {
        "id": 1, "pattern": "gpu_oom_cascade", "workload": "llm/vllm", "key": "k",
        "stage": "suspected", "opened_at": "2025-03-14T09:03:37+00:00", "pods": [],
        "signals": ["gpu_oom"], "steps": [], "questions": [], "timeline": [],
        "coverage": coverage_document(
            [
                SignalCoverage("gpu_oom", 3).to_dict(),
                SignalCoverage("lb_errors", 0, OTHER_WORKLOADS, detail, "map it").to_dict(),
            ],
            {"gpu_oom"},
        ),
    }  # fmt: skip
    out = io.StringIO()
    render_incident(inc, Console(file=out, width=400, color_system=None))
    text = out.getvalue()
    assert "coverage (signals seen): gpu_oom 3" in text
    assert "warning: lb_errors: missing (other workloads only): [red]x[/red] \\x1b[2J" in text
    assert "to bring it in: map it" in text
    assert "\x1b" not in text


def _exposition(metrics: LoopMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_metrics_export_seen_and_missing_and_drop_what_is_gone() -> None:
    metrics = LoopMetrics()
    llm = [SignalCoverage("gpu_oom", 3), SignalCoverage("lb_errors", 0, NO_LINES)]
    metrics.set_coverage({LLM: llm, WEB: [SignalCoverage("lb_errors", 9)]})
    text = _exposition(metrics)
    assert 'detector_workload_signal_seen{signal="gpu_oom",workload="llm/vllm"} 1.0' in text
    assert 'detector_workload_signal_seen{signal="lb_errors",workload="llm/vllm"} 0.0' in text
    assert (
        'detector_workload_signal_missing{reason="no lines",signal="lb_errors",workload="llm/vllm"}'
        " 1.0" in text
    )
    assert 'detector_workload_signal_seen{signal="lb_errors",workload="web/front"} 1.0' in text
    now_seen = [SignalCoverage("gpu_oom", 3), SignalCoverage("lb_errors", 4)]
    metrics.set_coverage({LLM: now_seen})  # web/front forgotten, llm's lb_errors came in
    text = _exposition(metrics)
    assert "web/front" not in text and "detector_workload_signal_missing{" not in text
    assert 'detector_workload_signal_seen{signal="lb_errors",workload="llm/vllm"} 1.0' in text


def test_metrics_export_a_bounded_number_of_workloads_open_incidents_first() -> None:
    metrics = LoopMetrics()
    many = {
        WorkloadRef("ns", f"w{i}"): [SignalCoverage("gpu_oom", 1)]
        for i in range(COVERAGE_WORKLOADS_MAX + 10)
    }
    last = WorkloadRef("ns", f"w{COVERAGE_WORKLOADS_MAX + 9}")
    metrics.set_coverage(many, first=[last])
    text = _exposition(metrics)
    assert text.count("detector_workload_signal_seen{") == COVERAGE_WORKLOADS_MAX
    assert f'workload="{last.label}"' in text


def test_the_processor_maps_a_dead_letters_topic_to_its_stream() -> None:
    processor = Processor.from_settings(Settings())  # kafka.topics: logs, events, lb, metrics
    processor.correlator.observe(_oom())
    processor.rejected_at["lb-logs", "malformed_json"] += 2
    processor.rejected_at["k8s-logs", "unknown_format"] += 1  # gpu_oom was seen: no matter
    cov = {e.signal: e for e in processor.workload_coverage()[LLM]}
    assert cov["lb_errors"].reason == FORMAT_NOT_READ
    assert "(malformed_json=2)" in cov["lb_errors"].detail
    assert cov["crash_loop"].reason == cov["gpu_memory"].reason == NO_LINES
    processor.rejected_at["/records/dump.log", "unknown_format"] += 1  # a file: any stream
    cov = {e.signal: e for e in processor.workload_coverage()[LLM]}
    assert cov["crash_loop"].reason == cov["gpu_memory"].reason == FORMAT_NOT_READ
