"""Turn one container log line into Signals: GPU OOM, engine dead, host OOM, engine lines.

Most lines carry no signal, so a cheap substring pre-filter on the lower-cased line runs
first; the classifier (``detector.events.classify``) and the engine-line parsers
(``detector.events.engine_lines``) only see lines that pass it.
"""

from __future__ import annotations

from typing import Any

from detector.events.classify import Classification, OomClass, classify_line
from detector.events.classify_patterns import GATE_TOKENS
from detector.events.engine_lines import ENGINE_GATE_TOKENS, parse_engine_line
from detector.events.model import MAX_TEXT_CHARS, LogLine, Signal, SignalKind, SourcePos

MAX_SCAN_CHARS = 16384  # only this prefix of a line is classified and parsed

_PREFILTER_TOKENS = tuple(dict.fromkeys(GATE_TOKENS + ENGINE_GATE_TOKENS))

_VERDICT_KIND = {
    OomClass.GPU_OOM: SignalKind.GPU_OOM,
    OomClass.ENGINE_DEAD: SignalKind.ENGINE_DEAD,
    OomClass.HOST_OOM: SignalKind.HOST_OOM,
}
_OOM_NUMBERS = ("bytes_tried", "capacity_bytes", "free_bytes", "gpu_index")


def signals_from_log_line(line: LogLine, source: SourcePos) -> list[Signal]:
    """Return the signals one container log line carries (usually none).

    Kinds: GPU_OOM (attrs framework, bytes_tried, capacity_bytes, free_bytes, gpu_index),
    ENGINE_DEAD (framework), HOST_OOM (reason, exit_code) from ``classify_line``, and
    ENGINE_CONFIG / ENGINE_PRESSURE from ``parse_engine_line``. Identity fields and time come
    from the ``LogLine``; ``text`` is the line truncated to 2 KiB. Only the first
    ``MAX_SCAN_CHARS`` characters are classified, which bounds the cost of giant lines.
    """
    text = line.text
    if not _may_carry_signal(text.lower()):
        return []
    out: list[Signal] = []
    head = text[:MAX_SCAN_CHARS]
    verdict = classify_line(head)
    kind = _VERDICT_KIND.get(verdict.verdict)
    if kind is not None:
        out.append(line.to_signal(kind, source, _oom_attrs(verdict, kind)))
    engine = parse_engine_line(head)
    if engine is not None:
        out.append(line.to_signal(engine[0], source, engine[1]))
    return out


def _may_carry_signal(lower: str) -> bool:
    # A plain loop: any() with a generator costs ~20% more on this per-line hot path.
    for token in _PREFILTER_TOKENS:  # noqa: SIM110
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
    for key in _OOM_NUMBERS:
        value = getattr(verdict, key)
        if value is not None:
            attrs[key] = value
    return attrs


def text_excerpt(text: str) -> str:
    """Return ``text`` cut to ``MAX_TEXT_CHARS`` characters, as stored in ``Signal.text``."""
    return text[:MAX_TEXT_CHARS]
