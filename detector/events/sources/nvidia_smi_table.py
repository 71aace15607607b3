"""The human ``nvidia-smi`` table (what plain ``nvidia-smi`` prints) -> GPU_MEMORY.

Each GPU's first row starts with its index (``|   0  NVIDIA H100 PCIe   On  | ...``) and its
second row carries ``used MiB / total MiB`` in the Memory-Usage column; both the 2017 layout
(driver 375, 79 columns) and the current one (with the ``MIG M.`` row) read the same way.
The Processes table gives no signal. Time: the ctime line nvidia-smi prints above the table
(``Tue Jul 16 10:13:25 2024``, host local time, read as UTC like the CSV query), else
``default_time``.
Source: https://docs.nvidia.com/deploy/nvidia-smi/index.html
"""

from __future__ import annotations

import re
from calendar import timegm
from datetime import datetime

from detector.errors import ParseError
from detector.events.model import MAX_TEXT_CHARS, Signal, SignalKind, SourcePos

_MIB = 1024 * 1024
_HEAD = re.compile(r"(?:\+-{4}|\| NVIDIA-SMI )")
_CTIME = re.compile(r"[A-Z][a-z]{2} ([A-Z][a-z]{2}) +(\d{1,2}) (\d\d:\d\d:\d\d) (\d{4})")
_GPU_ROW = re.compile(r"\|\s+(\d{1,3})\s+\S.*?\|")
_MEMORY = re.compile(r"\|\s*(\d{1,9})MiB\s*/\s*(\d{1,9})MiB\s*\|")
_PROCESSES = re.compile(r"\|\s*Processes:")

__all__ = ["is_nvidia_smi_table", "signals_from_nvidia_smi_table"]


def is_nvidia_smi_table(head: str) -> bool:
    """Tell whether ``head`` (a record's first lines) is an ``nvidia-smi`` table.

    A ``+----`` border must be followed by the ``| NVIDIA-SMI`` banner, so other ASCII tables
    in logs are not taken for one. Format: https://docs.nvidia.com/deploy/nvidia-smi/index.html
    """
    lines = [ln.strip() for ln in head.split("\n")[:6] if ln.strip()]
    while lines and (lines[0].startswith("$ ") or lines[0] == "nvidia-smi"):
        lines.pop(0)
    if lines and _CTIME.fullmatch(lines[0]):
        lines.pop(0)
    if not lines:
        return False
    if lines[0].startswith("| NVIDIA-SMI "):
        return True
    return lines[0].startswith("+----") and len(lines) > 1 and "| NVIDIA-SMI " in lines[1]


def signals_from_nvidia_smi_table(
    text: str,
    source: SourcePos,
    *,
    default_time: float | None = None,
    namespace: str | None = None,
    pod: str | None = None,
) -> list[Signal]:
    """Return one GPU_MEMORY signal (used_bytes, total_bytes, gpu; uuid None) per GPU row.

    The table names no pod: the signals are of ``namespace``/``pod`` (the caller's; both or none).

    Raises ``ParseError`` only: ``unknown_format`` without the NVIDIA-SMI banner,
    ``missing_timestamp`` with GPU rows but neither a date line nor ``default_time``,
    ``bad_timestamp`` for an impossible date. Format:
    https://docs.nvidia.com/deploy/nvidia-smi/index.html
    """
    lines = [ln.rstrip("\r") for ln in text.split("\n")]
    if not any(ln.lstrip().startswith("| NVIDIA-SMI ") for ln in lines[:8]):
        raise ParseError("unknown_format", "no NVIDIA-SMI banner")
    gpus = _gpu_memory(lines)
    if not gpus:
        return []
    time = _time(lines, default_time)
    if namespace is None or pod is None:
        namespace = pod = None
    return [
        Signal(
            kind=SignalKind.GPU_MEMORY,
            time=time,
            source=source,
            namespace=namespace,
            pod=pod,
            attrs={
                "used_bytes": used * _MIB,
                "total_bytes": total * _MIB,
                "gpu": index,
                "uuid": None,
                "metric": "nvidia-smi",
            },
            text=row[:MAX_TEXT_CHARS],
        )
        for index, used, total, row in gpus
    ]


def _gpu_memory(lines: list[str]) -> list[tuple[int, int, int, str]]:
    """Return (index, used MiB, total MiB, rows) for each GPU of the GPU table."""
    out: list[tuple[int, int, int, str]] = []
    index: int | None = None
    for number, line in enumerate(lines):
        stripped = line.strip()
        if _PROCESSES.match(stripped):
            break
        row = _GPU_ROW.match(stripped)
        if row is not None and "MiB" not in stripped:
            index = int(row.group(1))
            continue
        memory = _MEMORY.search(stripped)
        if memory is not None and index is not None:
            used, total = int(memory.group(1)), int(memory.group(2))
            if used <= total:
                out.append((index, used, total, "\n".join(lines[number - 1 : number + 1])))
            index = None
    return out


def _time(lines: list[str], default_time: float | None) -> float:
    for line in lines[:4]:
        m = _CTIME.fullmatch(line.strip())
        if m is not None:
            month, day, clock, year = m.groups()
            try:
                stamp = datetime.strptime(f"{year} {month} {day} {clock}", "%Y %b %d %H:%M:%S")
            except ValueError:
                raise ParseError("bad_timestamp", f"not a date: {line.strip()[:64]!r}") from None
            return float(timegm(stamp.timetuple()))
    if default_time is None:
        raise ParseError("missing_timestamp", "nvidia-smi table without a date line")
    return default_time
