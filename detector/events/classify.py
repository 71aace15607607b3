"""Classify one container log line: GPU OOM, engine dead, host OOM, look-alike or ambiguous.

The wordings and their sources are listed in ``detector.events.classify_patterns``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from detector.events import classify_patterns as pat


class OomClass(StrEnum):
    """The verdict on one log line."""

    GPU_OOM = "gpu_oom"  # a GPU/accelerator allocation failed
    ENGINE_DEAD = "engine_dead"  # a serving engine died (a consequence; the cause is elsewhere)
    HOST_OOM = "host_oom"  # kernel/cgroup OOM killer, OOMKilled, exit 137
    NOT_GPU_OOM = "not_gpu_oom"  # nothing, or a look-alike
    AMBIGUOUS = "ambiguous"  # the line alone cannot decide


@dataclass(frozen=True, slots=True)
class Classification:
    """A verdict with the numbers the line carried; sizes in bytes, ``None`` where unknown."""

    verdict: OomClass
    framework: str | None = None
    bytes_tried: int | None = None
    capacity_bytes: int | None = None
    free_bytes: int | None = None
    gpu_index: int | None = None
    reason: str = ""


NOT_GPU_OOM = Classification(OomClass.NOT_GPU_OOM)

_UNIT_BYTES = {"": 1, "b": 1, "bytes": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_UNIT_BYTES["p"] = 1 << 50

# Tables in the order they are tried; the first matching rule decides.
_TABLES = (
    pat.STRONG,
    pat.EXCLUDE,
    pat.GPU_RULES,
    pat.AMBIGUOUS_RULES,
    pat.DEAD_RULES,
    pat.HOST_RULES,
    pat.LOOKALIKE_RULES,
)


def classify_line(text: str) -> Classification:
    """Classify one log line (prefixes such as timestamps or worker tags are allowed).

    Returns a ``Classification``; for GPU OOM it carries ``bytes_tried``, ``capacity_bytes``,
    ``free_bytes`` (integer bytes; KiB/MiB/GiB and K/M/G, as well as KB/MB/GB, are read as
    powers of 1024, as GPU tooling writes them) and ``gpu_index`` where the line states them.
    Formats and their sources: see ``detector.events.classify_patterns``.
    """
    lower = text.lower()
    if not any(token in lower for token in pat.GATE_TOKENS):
        return NOT_GPU_OOM
    if "raise " in text and pat.SOURCE_LINE.search(text):
        return Classification(OomClass.NOT_GPU_OOM, reason="traceback_source")
    if _echoes_request(lower, text):
        return Classification(OomClass.NOT_GPU_OOM, reason="request_payload")
    for table in _TABLES:
        for needles, pattern, verdict, framework, reason in table:
            for needle in needles:  # a plain loop: any() with a generator costs more here
                if needle in lower:
                    if pattern.search(text):
                        return _build(text, lower, OomClass(verdict), framework, reason)
                    break
    return NOT_GPU_OOM


def _echoes_request(lower: str, text: str) -> bool:
    for token in pat.REQUEST_PAYLOAD_TOKENS:
        if token in lower:
            return pat.REQUEST_PAYLOAD.search(text) is not None
    return False


def parse_size(number: str, unit: str | None) -> int:
    """Convert a number and a unit such as ``MiB``, ``G`` or ``bytes`` to integer bytes."""
    key = (unit or "").lower()
    key = key if key == "bytes" else key[:1]
    return round(float(number) * _UNIT_BYTES.get(key, 1))


def _build(
    text: str, lower: str, verdict: OomClass, framework: str | None, reason: str
) -> Classification:
    if verdict is not OomClass.GPU_OOM:
        return Classification(verdict, framework=framework, reason=reason)
    if framework == "cuda":
        framework = _refine(lower, pat.CUDA_FRAMEWORK_HINTS, framework)
    elif framework == "jax":
        framework = _refine(lower, pat.JAX_FRAMEWORK_HINTS, framework)
    capacity, free = _capacity_and_free(text)
    index = pat.GPU_INDEX.search(text)
    return Classification(
        verdict,
        framework=framework,
        bytes_tried=_bytes_tried(text),
        capacity_bytes=capacity,
        free_bytes=free,
        gpu_index=int(index.group(1)) if index else None,
        reason=reason,
    )


def _refine(lower: str, hints: tuple[tuple[str, str], ...], default: str) -> str:
    for token, framework in hints:
        if token in lower:
            return framework
    return default


def _bytes_tried(text: str) -> int | None:
    match = pat.SIZE_TRIED.search(text)
    if match is None:
        return None
    number, unit, exact = match.groups()
    return int(exact) if exact else parse_size(number, unit)


def _capacity_and_free(text: str) -> tuple[int | None, int | None]:
    both = pat.FREE_OF_TOTAL.search(text)
    if both is not None:
        free, total, unit = both.groups()
        return parse_size(total, unit), parse_size(free, unit)
    return _first_size(text, pat.SIZE_CAPACITY), _first_size(text, pat.SIZE_FREE)


def _first_size(text: str, patterns: tuple[re.Pattern[str], ...]) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match is not None:
            return parse_size(match.group(1), match.group(2))
    return None
