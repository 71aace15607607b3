"""What a cited evidence line shows, in the figures the parser took from it (pure).

A row of the postmortem that cites a line states only what that line shows: its pod, its time
and its figures. An evidence row's ``attrs`` are the figures its parser read from the line
(``detector.events.model.Signal``); some are derived (a ratio, a rate over a window, a flag
the line implies), so only the attrs a line states as such are written here (``_SAID``; every
number of an ``engine_config`` line is one of its start-up settings). Bytes are written in
GiB with two decimals (the unit PyTorch and vLLM print; a line in MiB shows the same amount),
KV-cache usage as a percentage with one decimal (vLLM's ``GPU KV cache usage: 98.4%``).

A question's answer is stored with one evidence line (``detector.incidents.questions``), which
may show only part of it: ``questions`` adds what that line shows, so a reader sees which
figures it backs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import pandas as pd

from detector.correlate.series import GPU_MEMORY, KV_CACHE
from detector.postmortem.fmt import hms

GIB: Final = 2**30
_SAID: Final[dict[str, Callable[[Any], str]]] = {
    "bytes_tried": lambda v: f"tried to allocate {v / GIB:.2f} GiB",
    "free_bytes": lambda v: f"{v / GIB:.2f} GiB free",
    "capacity_bytes": lambda v: f"of {v / GIB:.2f} GiB",
    "used_bytes": lambda v: f"{v / GIB:.2f} GiB used",
    "total_bytes": lambda v: f"of {v / GIB:.2f} GiB",
    "requests_running": lambda v: f"{v} requests running",
    "requests_waiting": lambda v: f"{v} waiting",
    "kv_cache_usage": lambda v: f"KV cache {v * 100:.1f}% used",
    "kv_cache_bytes": lambda v: f"KV cache memory {v / GIB:.2f} GiB",
}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _float(value: Any) -> float | None:
    return float(value) if _number(value) else None


def reading(attrs: Mapping[str, Any] | None, detail: str) -> float | None:
    """Return the pressure (used/total, 0..1) that one ``gpu_memory`` line gives in the
    measure ``detail`` ("KV cache" or "GPU memory"; ``detector.correlate.series``), None when
    the line does not give it alone (a DCGM line holds one of used or free, not both)."""
    a = attrs or {}
    if detail == KV_CACHE:
        return _float(a.get("kv_cache_usage"))
    total, used, free = (_float(a.get(k)) for k in ("total_bytes", "used_bytes", "free_bytes"))
    if detail != GPU_MEMORY or not total:
        return None
    if used is not None:
        return used / total
    return (total - free) / total if free is not None else None


def said(kind: str, attrs: Mapping[str, Any] | None) -> list[str]:
    """Return the figures a line of evidence ``kind`` states, as text, in ``attrs`` order."""
    a = attrs or {}
    if kind == "engine_config":
        return [
            f"{key} {value / GIB:.2f} GiB" if key.endswith("_bytes") else f"{key} {value}"
            for key, value in a.items()
            if _number(value)
        ]
    return [_SAID[key](value) for key, value in a.items() if key in _SAID and _number(value)]


def shows(row: Any) -> str:
    """Return what an evidence row's line shows: ``pod P at HH:MM:SS: figure, figure``."""
    head = f"pod {row.pod} at {hms(row.time)}" if row.pod else f"at {hms(row.time)}"
    figures = said(str(row.kind), row.attrs if isinstance(row.attrs, Mapping) else None)
    return f"{head}: {', '.join(figures)}" if figures else head


def questions(evidence: pd.DataFrame, asked: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return the document's questions, each with ``evidence_shows``: what its cited line
    shows (``shows``; None when it cites none or the line is not in the evidence)."""
    by_source = {str(r.source): r for r in evidence.itertuples()}
    out = []
    for q in asked:
        row = by_source.get(str(q.get("evidence")))
        out.append(dict(q) | {"evidence_shows": shows(row) if row is not None else None})
    return out
