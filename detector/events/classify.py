"""Classify one container log line: GPU OOM, engine dead, host OOM, look-alike or ambiguous.

The wordings and their sources are listed in ``detector.events.classify_patterns``; the number
formats (sizes, GPU index) and second-hand quotes (an HTTP error body that carries another
process's OOM text) are read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from detector.events import accelerators as acc
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
    quoted: bool = False  # the OOM text sits in an HTTP error body logged by another component
    # the accelerator family the line names (cuda, rocm, tpu, hpu, npu ...) and a GPU-sharing
    # layer with its own memory quota (hami, vgpu): descriptions, not part of the verdict
    accelerator: str | None = field(default=None, compare=False)
    sharing_layer: str | None = field(default=None, compare=False)


NOT_GPU_OOM = Classification(OomClass.NOT_GPU_OOM)

_UNIT_BYTES = {"": 1, "b": 1, "bytes": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_UNIT_BYTES["p"] = 1 << 50
NUMBER_FIELDS = ("bytes_tried", "capacity_bytes", "free_bytes", "gpu_index")

# Tables in the order they are tried; the first matching rule decides.
_TABLES = (
    pat.STRONG,
    pat.EXCLUDE,
    pat.GPU_RULES,
    pat.AMBIGUOUS_RULES,
    pat.DEAD_RULES,
    pat.HOST_RULES,
)


def classify_line(text: str) -> Classification:
    """Classify one log line (prefixes such as timestamps or worker tags are allowed).

    Returns a ``Classification``; for GPU OOM it carries ``bytes_tried``, ``capacity_bytes``,
    ``free_bytes`` (integer bytes; KiB/MiB/GiB and K/M/G, as well as KB/MB/GB, are read as
    powers of 1024, as GPU tooling writes them) and ``gpu_index`` where the line states them,
    and ``quoted=True`` when the OOM text is an HTTP error body relayed by another component.
    A traceback's ``raise ...`` source line and a logged request that quotes an error are
    NOT_GPU_OOM. The whole line is read: callers bound giant lines (``detector.events.multiline``).
    Formats and their sources: see ``detector.events.classify_patterns`` and the number and
    quote formats below.
    """
    lower = text.lower()
    for token in pat.GATE_TOKENS:  # a plain loop: any() with a generator costs more per line
        if token in lower:
            break
    else:
        return NOT_GPU_OOM
    for table in _TABLES:
        for needles, pattern, verdict, framework, reason in table:
            for needle in needles:  # a plain loop: any() with a generator costs more here
                if needle in lower:
                    if pattern.search(text):
                        return _decide(text, lower, OomClass(verdict), framework, reason)
                    break
    general = _general(text, lower)
    if general is not None:
        return general
    for needles, pattern, verdict, framework, reason in pat.LOOKALIKE_RULES:
        for needle in needles:
            if needle in lower:
                if pattern.search(text):
                    return _decide(text, lower, OomClass(verdict), framework, reason)
                break
    return NOT_GPU_OOM


def _general(text: str, lower: str) -> Classification | None:
    """Apply the general rule: device-memory exhaustion by its shape, whatever the vendor.

    An allocation-failure phrase (out of memory, OOM, OutOfMemory, RESOURCE_EXHAUSTED,
    allocation failed, failed to allocate, *_OUT_OF_DEVICE_MEMORY ...: ``accelerators``)
    with evidence that the memory is an accelerator's (a device/DRAM/HBM/VRAM/buffer/pool
    word, a device index, a GPU library, any vendor's API or runtime) is GPU_OOM; an
    out-of-memory phrase without that evidence is AMBIGUOUS; an allocation-failure phrase
    without it says nothing. A phrase that only says a memory is full (no free space, heaps
    exhausted, beyond the maximum size: ``accelerators.memory_full``) counts only beside a
    named accelerator or an accelerator's memory kind (DRAM, HBM, VRAM, L1). Host look-alikes
    (``classify_patterns.GENERAL_HOST``, ``accelerators.HOST_VETO``) and INFO/DEBUG lines stay
    out. ``None`` when the rule is silent.
    """
    for token in acc.PHRASE_TOKENS:  # every phrase below has one: the cheap way out
        if token in lower:
            break
    else:
        return None
    exhausted = _exhausted(lower, text)
    if not exhausted and not acc.alloc_failed(lower, text) and not acc.memory_full(lower, text):
        return None
    if pat.GENERAL_HOST.search(text) is not None or pat.INFO_LEVEL.search(text) is not None:
        return None
    if acc.host_veto(text):
        return None
    if _has_accelerator(lower, text) or acc.device_evidence(lower, text):
        family = acc.accelerator_of(lower, text)
        framework = _refine(lower, pat.GENERAL_FRAMEWORK_HINTS, family or "cuda")
        if framework == "cuda":
            framework = _refine(lower, pat.CUDA_FRAMEWORK_HINTS, framework)
        return _decide(text, lower, OomClass.GPU_OOM, framework, "general_accelerator_oom")
    if exhausted:
        return _decide(text, lower, OomClass.AMBIGUOUS, None, "general_oom_no_device")
    return None


def _decide(
    text: str, lower: str, verdict: OomClass, framework: str | None, reason: str
) -> Classification:
    """Return the matched rule's verdict unless the line only echoes a message as data: a
    traceback's ``raise ...`` source line, or a logged request whose prompt quotes an error.
    """
    if verdict is OomClass.NOT_GPU_OOM:
        return Classification(verdict, reason=reason)
    if "raise " in text and pat.SOURCE_LINE.search(text):
        return Classification(OomClass.NOT_GPU_OOM, reason="traceback_source")
    if _echoes_request(lower, text):
        return Classification(OomClass.NOT_GPU_OOM, reason="request_payload")
    return _build(text, lower, verdict, framework, reason)


def _exhausted(lower: str, text: str) -> bool:
    for phrase in pat.EXHAUSTED_PHRASES:
        if phrase in lower:
            return True
    if "oom" in lower or "ran out of" in lower:
        return pat.EXHAUSTED.search(text) is not None
    return False


def _has_accelerator(lower: str, text: str) -> bool:
    for needle in pat.ACCELERATOR_NEEDLES:
        if needle in lower:
            return pat.ACCELERATOR.search(text) is not None
    return False


def _echoes_request(lower: str, text: str) -> bool:
    for token in pat.REQUEST_PAYLOAD_TOKENS:
        if token in lower:
            return pat.REQUEST_PAYLOAD.search(text) is not None
    return False


def parse_size(number: str, unit: str | None) -> int:
    """Convert a number and a unit such as ``MiB``, ``G`` or ``bytes`` to integer bytes."""
    key = (unit or "").lower()
    key = key if key == "bytes" else key[:1]
    number = number.replace(",", "")
    if number.isascii() and number.isdigit():  # exact for sizes beyond float precision (2**53)
        return int(number) * _UNIT_BYTES.get(key, 1)
    return round(float(number) * _UNIT_BYTES.get(key, 1))


def _build(
    text: str, lower: str, verdict: OomClass, framework: str | None, reason: str
) -> Classification:
    if verdict not in (OomClass.GPU_OOM, OomClass.AMBIGUOUS):
        return Classification(verdict, framework=framework, reason=reason)
    if framework in ("cuda", "rocm"):
        framework = _refine(lower, pat.CUDA_FRAMEWORK_HINTS, framework)
    elif framework == "jax":
        framework = _refine(lower, pat.JAX_FRAMEWORK_HINTS, framework)
    capacity, free = _capacity_and_free(text)
    index = GPU_INDEX.search(text)
    return Classification(
        verdict,
        framework=framework,
        bytes_tried=_bytes_tried(text),
        capacity_bytes=capacity,
        free_bytes=free,
        gpu_index=int(index.group(1)) if index else None,
        reason=reason,
        quoted=_is_quoted(lower, text),
        accelerator=acc.accelerator_of(lower, text),
        sharing_layer=acc.sharing_layer_of(lower, text),
    )


def line_numbers(text: str) -> dict[str, int]:
    """Return the sizes (bytes) and GPU index a line states, keyed as in ``NUMBER_FIELDS``.

    For the continuation lines of a multi-line OOM message, e.g. PyTorch's cudaMallocAsync
    report ("Requested : 512.00 KiB", "Device limit : 15.99 GiB"), whatever their verdict.
    """
    capacity, free = _capacity_and_free(text)
    index = GPU_INDEX.search(text)
    found = (_bytes_tried(text), capacity, free, int(index.group(1)) if index else None)
    return {
        key: value for key, value in zip(NUMBER_FIELDS, found, strict=True) if value is not None
    }


def _is_quoted(lower: str, text: str) -> bool:
    for token in QUOTE_TOKENS:
        if token in lower:
            return QUOTED_BODY.search(text) is not None and STRUCTURED_LOG.search(text) is None
    return False


def _refine(lower: str, hints: tuple[tuple[str, str], ...], default: str) -> str:
    for token, framework in hints:
        if token in lower:
            return framework
    return default


def _bytes_tried(text: str) -> int | None:
    match = SIZE_TRIED.search(text)
    if match is None:
        return None
    number, unit, exact = match.groups()
    return int(exact) if exact else parse_size(number, unit)


def _capacity_and_free(text: str) -> tuple[int | None, int | None]:
    both = FREE_OF_TOTAL.search(text)
    if both is not None:
        free, total, unit = both.groups()
        return parse_size(total, unit), parse_size(free, unit)
    return _first_size(text, SIZE_CAPACITY), _first_size(text, SIZE_FREE)


def _first_size(text: str, patterns: tuple[re.Pattern[str], ...]) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match is not None:
            return parse_size(match["num"], match["unit"])
    return None


# Number formats. PyTorch: "Tried to allocate 20.00 MiB (GPU 0; 79.14 GiB total capacity; ...
# 576.00 KiB free" and "GPU 0 has a total capacity of 6.00 GiB of which 0 bytes is free";
# cudaMallocAsync: "Requested : 1.88 GiB Device limit : 16.00 GiB Free (according to CUDA): 0
# bytes" (https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDAMallocAsyncAllocator.cpp);
# TensorRT: "Requested amount of GPU memory (13476831488 bytes)"; TensorRT-LLM: "Total GPU
# memory (GiB): 140.06", "Free GPU memory before component creation attempt (GiB): 108.86"
# (https://github.com/NVIDIA/TensorRT-LLM/issues/5872); MPS "max allowed: 6.80 GB"
# (https://github.com/Comfy-Org/ComfyUI/issues/2489); PaddlePaddle "Cannot allocate 1.53GB memory
# on GPU 0, available memory is only 416.62MB" (https://github.com/PaddlePaddle/Paddle/issues/26892);
# Theano "Driver report N bytes free and N bytes total" (https://github.com/Theano/Theano/issues/1814).
# bounded: int() and float() of it never fail; "8,589,934,592" (CuPy) keeps its groups
_NUM = r"(\d{1,3}(?:,\d{3}){1,6}(?![\d.])|\d{1,20}(?:\.\d{1,20})?)"
_UNIT = r"\s*(bytes|[KMGTP]i?B\b|[KMGTP]\b|B\b)"
_N, _U = r"(?P<num>\d{1,20}(?:\.\d{1,20})?)", r"\s*(?P<unit>bytes|[KMGTP]i?B\b|[KMGTP]\b|B\b)"
_I = re.IGNORECASE
SIZE_TRIED: Final = re.compile(
    r"(?:tried to allocate|trying to allocate|allocate request for|failed to allocate"
    r"|requested\s*:|buffer of size|allocating|CUDA c?alloc|cannot allocate|memory to allocate"
    r"|requested amount of (?:GPU )?memory \()\s*"
    + _NUM
    + r"(?:"
    + _UNIT
    + r")?(?:\s*\((\d{1,20})\s*(?:bytes|B)\))?",
    _I,
)
SIZE_CAPACITY: Final = (
    re.compile(r"total capac(?:i)?ty of\s*" + _N + _U, _I),
    re.compile(r"(?<![\d.])" + _N + _U + r" total capacity", _I),
    re.compile(r"Device limit\s*:\s*" + _N + _U, _I),
    re.compile(r"Total GPU memory \((?P<unit>[KMGT]iB)\):\s*" + _N, _I),
    re.compile(r"max allowed:\s*" + _N + _U, _I),  # MPS
    re.compile(r"free and\s*" + _N + _U + r" total", _I),  # Theano
)
SIZE_FREE: Final = (
    re.compile(r"of which\s*" + _N + _U + r" is free", _I),
    re.compile(r"Free \(according to CUDA\)\s*:\s*" + _N + _U, _I),
    re.compile(r"(?<![\d.])" + _N + r"\s*(?P<unit>[KMGTP]i?B|bytes) free[;,)]"),
    re.compile(r"Free GPU memory before [\w ]{0,40}\((?P<unit>[KMGT]iB)\):\s*" + _N, _I),
    re.compile(r"available memory is only\s*" + _N + _U, _I),  # PaddlePaddle
    re.compile(r"Driver report\s*" + _N + _U + r" free", _I),  # Theano
)
# vLLM: "Free memory on device cuda:0 (36.75/121.63 GiB) on startup ..."
FREE_OF_TOTAL: Final = re.compile(
    r"Free memory on device[^(]{0,20}\(" + _NUM + r"/" + _NUM + _UNIT + r"\)", _I
)
GPU_INDEX: Final = re.compile(
    r"(?:\bGPU[ :=_]|device:GPU:|device ordinal |\bon device |cuda:|current device: "
    r"|\bCUDA(?=\d+ buffer))(\d{1,6})(?!\d)",
    _I,
)

# Second-hand OOM text: an HTTP error body relayed by a gateway or client ({"error": ...},
# {"detail": ...}, {"object": "error", "message": ...}, "Error code: 500 - {...}"), unlike the
# engine's own structured log record ("level"/"severity" keys). Sources:
# https://github.com/LeafYeeXYZ/PainterLeaf/issues/9, https://github.com/gladiaio/gladia/issues/802,
# https://github.com/openai/openai-python/blob/main/src/openai/_exceptions.py
QUOTE_TOKENS: Final = ("error", "detail", "warnings")
QUOTED_BODY: Final = re.compile(
    r"(?:[\"'](?:error|detail|warnings|errors)[\"']\s*:|[\"']object[\"']\s*:\s*[\"']error[\"']"
    r"|\bError code: 5\d\d\b)[^\n]{0,300}?(?:out of memory|OutOfMemory|OUT_OF_MEMORY)",
    _I,
)
STRUCTURED_LOG: Final = re.compile(r"[\"'](?:level|levelname|severity)[\"']\s*:", _I)
