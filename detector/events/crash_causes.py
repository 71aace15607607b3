"""Recognize known non-memory crash causes in a container log line (GPU faults, NCCL hangs).

A pod that dies of one of these crash-loops and its ingress answers 5xx, as in a GPU OOM
cascade, but the cause is not memory: the correlator records a "not this pattern" verdict
naming it. A GPU OOM in the same pods still wins (it is classified first, by
``detector.events.classify``). Wordings and their sources:

- ``CUDA error: an illegal memory access was encountered`` (cudaErrorIllegalAddress):
  https://github.com/vllm-project/vllm/issues/6976, https://github.com/vllm-project/vllm/issues/8177
- ``CUDA error: device-side assert triggered``: https://github.com/vllm-project/vllm/issues/11931
- ``CUDA error: unspecified launch failure``: https://github.com/pytorch/pytorch/issues/49832
- ``Watchdog caught collective operation timeout: WorkNCCL(...)`` (``ProcessGroupNCCL.cpp``):
  https://github.com/hiyouga/LlamaFactory/issues/7396, https://github.com/pytorch/pytorch/issues/118369
- ``NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus`` (the kernel log; Xid catalog
  https://docs.nvidia.com/deploy/xid-errors/): https://github.com/NVIDIA/NVSentinel/issues/155
- ``CUDA error: uncorrectable ECC error encountered`` (cudaErrorECCUncorrectable):
  https://github.com/vllm-project/vllm/issues/5222
"""

from __future__ import annotations

import re
from typing import Any, Final

# (cause key, what it is in words, pattern); the first that matches names the cause.
_CAUSES: Final[tuple[tuple[str, str, re.Pattern[str]], ...]] = (
    (
        "illegal_memory_access",
        "CUDA illegal memory access (cudaErrorIllegalAddress)",
        re.compile(r"an illegal memory access was encountered|cudaErrorIllegalAddress", re.I),
    ),
    (
        "device_side_assert",
        "CUDA device-side assert",
        re.compile(r"device-side assert(?:ion)? triggered|cudaErrorAssert\b", re.I),
    ),
    (
        "unspecified_launch_failure",
        "CUDA unspecified launch failure",
        re.compile(r"unspecified launch failure|cudaErrorLaunchFailure", re.I),
    ),
    (
        "ecc_error",
        "uncorrectable GPU ECC error",
        re.compile(r"uncorrectable ECC error|cudaErrorECCUncorrectable", re.I),
    ),
    (
        "nccl_timeout",
        "NCCL collective timeout (watchdog)",
        re.compile(
            r"Watchdog caught collective operation timeout"
            r"|\bNCCL\b(?! INFO)[^\n]{0,120}\b(?:timed out|timeout)\b",
            re.I,
        ),
    ),
    (
        "xid",
        "NVIDIA Xid error",
        re.compile(r"NVRM: Xid \(PCI:[0-9A-Fa-f:.]{1,20}\): (\d{1,3})\b"),
    ),
)
# Lower-case tokens at least one of which every line this module recognizes contains.
CRASH_GATE_TOKENS: Final = (
    "illegal",
    "device-side",
    "cudaerror",
    "launch failure",
    "ecc error",
    "watchdog",
    "nccl",
    "xid",
)
_XID_NAMES: Final = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "ECC page retirement",
    64: "ECC page retirement failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}
_SCAN_CHARS: Final = 8192  # a line is searched on this prefix only


def crash_cause(text: str) -> dict[str, Any] | None:
    """Return the known non-memory crash cause a log line states, or ``None``.

    Attrs: ``cause`` (a key: illegal_memory_access, device_side_assert,
    unspecified_launch_failure, ecc_error, nccl_timeout, xid), ``cause_text`` (the cause in
    words, with the Xid number and name for an Xid line) and ``xid`` (int) for an Xid line.
    Wordings and their sources: see the module docstring.
    """
    head = text[:_SCAN_CHARS]
    for key, words, pattern in _CAUSES:
        match = pattern.search(head)
        if match is None:
            continue
        attrs: dict[str, Any] = {"cause": key, "cause_text": words}
        if key == "xid":
            xid = int(match.group(1))
            attrs["xid"] = xid
            name = _XID_NAMES.get(xid)
            attrs["cause_text"] = f"NVIDIA Xid {xid}" + (f" ({name})" if name else "")
        return attrs
    return None
