"""Turn one container log record into Signals: GPU OOM, engine dead, host OOM, engine lines.

Most records carry no signal, so a cheap substring pre-filter on the lower-cased text runs
first; the classifier (``detector.events.classify``) and the engine-line parsers
(``detector.events.engine_lines``) only see records that pass it. A record that carries a whole
multi-line message (Fluent Bit's multiline filter, a Docker record joined by a shipper) is
classified line by line (``detector.events.multiline.record_findings``), so an OOM on the last
line of a long traceback is found and a hint or ``raise`` line elsewhere cannot veto it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from detector.events.classify import NUMBER_FIELDS, Classification, OomClass, classify_line
from detector.events.classify_patterns import GATE_TOKENS
from detector.events.crash_causes import CRASH_GATE_TOKENS, crash_cause
from detector.events.engine_lines import ENGINE_GATE_TOKENS, parse_engine_line
from detector.events.model import LogLine, Signal, SignalKind, SourcePos
from detector.events.multiline import MAX_LINE_CHARS, classify_long_line, record_findings

MAX_SCAN_CHARS = MAX_LINE_CHARS  # a line is classified on this prefix (and suffix, if longer)

_PREFILTER_TOKENS = tuple(dict.fromkeys(GATE_TOKENS + ENGINE_GATE_TOKENS))

_VERDICT_KIND = {
    OomClass.GPU_OOM: SignalKind.GPU_OOM,
    OomClass.AMBIGUOUS: SignalKind.GPU_OOM,  # with attrs ambiguous=True: the correlator decides
    OomClass.ENGINE_DEAD: SignalKind.ENGINE_DEAD,
    OomClass.HOST_OOM: SignalKind.HOST_OOM,
}


# GPU OOM reasons that say the engine could not start because the memory is held by another
# process, not that serving ran out: vLLM's start-up check "Free memory on device (X/Y GiB) on
# startup is less than desired GPU memory utilization" (``gpu_worker.py``; vllm#42017)
START_FAILED_REASONS = frozenset({"startup_free_memory_check"})


def _kind(verdict: Classification) -> SignalKind | None:
    """Return the signal kind of a classifier verdict (None: no signal)."""
    kind = _VERDICT_KIND.get(verdict.verdict)
    if kind is SignalKind.GPU_OOM and verdict.reason in START_FAILED_REASONS:
        return SignalKind.START_FAILED
    return kind


def signals_from_log_line(line: LogLine, source: SourcePos) -> list[Signal]:
    """Return the signals one container log record carries (usually none).

    Kinds: GPU_OOM (attrs framework, bytes_tried, capacity_bytes, free_bytes, gpu_index; plus
    ambiguous=True when the text alone cannot decide, and quoted=True, ambiguous=True when the OOM
    text is another component's HTTP error body), START_FAILED (the same numbers, for an engine
    whose start-up found its GPU's memory held: ``START_FAILED_REASONS``), ENGINE_DEAD (framework),
    HOST_OOM (reason, exit_code) from the classifier, and ENGINE_CONFIG / ENGINE_PRESSURE from
    ``parse_engine_line``; when none of these, CRASH_CAUSE (cause, cause_text, xid) from
    ``detector.events.crash_causes``. Identity fields and time come from the ``LogLine``; ``text``
    is the line that decided, truncated to 2 KiB. A line is classified on its first and last
    ``MAX_SCAN_CHARS`` characters, a multi-line record line by line (bounded windows).
    """
    lower = line.text.lower()
    out = _classified(line, source) if _may_carry_signal(lower) else []
    if not out and _may_state_crash(lower):
        out = _crash_cause(line, source)
    return out


def _crash_cause(line: LogLine, source: SourcePos) -> list[Signal]:
    """Return a CRASH_CAUSE signal for the first line of the record that states one."""
    for text in line.text[:MAX_SCAN_CHARS].splitlines():
        attrs = crash_cause(text)
        if attrs is not None:
            return [replace(line, text=text).to_signal(SignalKind.CRASH_CAUSE, source, attrs)]
    return []


def _classified(line: LogLine, source: SourcePos) -> list[Signal]:
    text = line.text
    out: list[Signal] = []
    if "\n" in text:
        for hit in record_findings(text):
            kind = _kind(hit.classification)
            if kind is None:
                continue
            attrs = _oom_attrs(hit.classification, kind)
            out.append(replace(line, text=hit.text).to_signal(kind, source, attrs))
    else:
        verdict = classify_line(text) if len(text) <= MAX_SCAN_CHARS else classify_long_line(text)
        found = _kind(verdict)
        if found is not None:
            out.append(line.to_signal(found, source, _oom_attrs(verdict, found)))
    engine = parse_engine_line(text[:MAX_SCAN_CHARS])
    if engine is not None:
        out.append(line.to_signal(engine[0], source, engine[1]))
    return out


def _may_carry_signal(lower: str) -> bool:
    # A plain loop: any() with a generator costs ~20% more on this per-line hot path.
    for token in _PREFILTER_TOKENS:  # noqa: SIM110
        if token in lower:
            return True
    return False


def _may_state_crash(lower: str) -> bool:
    for token in CRASH_GATE_TOKENS:  # noqa: SIM110 (a plain loop, as above)
        if token in lower:
            return True
    return False


def _oom_attrs(verdict: Classification, kind: SignalKind) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if verdict.framework is not None:
        attrs["framework"] = verdict.framework
    if kind is SignalKind.HOST_OOM:
        attrs["reason"] = verdict.reason
        if verdict.reason == "exit_137":
            attrs["exit_code"] = 137
        return attrs
    if kind not in (SignalKind.GPU_OOM, SignalKind.START_FAILED):
        return attrs
    for key in NUMBER_FIELDS:
        value = getattr(verdict, key)
        if value is not None:
            attrs[key] = value
    if verdict.verdict is OomClass.AMBIGUOUS or verdict.quoted:
        attrs["ambiguous"] = True
    if verdict.quoted:
        attrs["quoted"] = True
    if verdict.accelerator not in (None, "cuda"):  # CUDA, a GPU OOM's default, goes unsaid
        attrs["accelerator"] = verdict.accelerator
    if verdict.sharing_layer is not None:
        attrs["sharing_layer"] = verdict.sharing_layer
    return attrs
