"""The signal coverage of an incident's workload, as the document gives it to every face.

The pipeline stores the coverage on the incident (``Incident.coverage``, built by
``detector.correlate.coverage``); here each entry gains ``seen`` and ``evidence`` (whether a
signal of it became the incident's evidence) and, for a signal seen that left no evidence,
the reason in ``detail``: with the ``signals`` line of the report (``lb_errors no``), every
"no" says why.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

# why a signal the workload saw left no evidence: evidence is attached while an incident is open
NO_EVIDENCE: Final[Mapping[str, str]] = {
    "gpu_oom": "none was a GPU OOM of a victim",
    "crash_loop": "no crash loop while the incident was open",
    "lb_errors": "no 5xx surge while the incident was open",
    "gpu_memory": "no reading at its ceiling while the incident was open",
}


def coverage_document(
    stored: Sequence[Mapping[str, Any]] | None, evidence: Collection[str]
) -> list[dict[str, Any]]:
    """Return the document's ``coverage``: per signal ``signal``, ``seen``, ``count``,
    ``evidence``, ``reason`` (empty when seen), ``detail`` and ``hint``.

    ``stored``: ``IncidentOut.coverage`` dumped (None: not stored yet, an empty list);
    ``evidence``: the incident's evidence kinds.
    """
    out = []
    for entry in stored or ():
        signal, count = str(entry["signal"]), int(entry["count"])
        detail = str(entry.get("detail") or "")
        if count and signal not in evidence:
            detail = f"{count} seen, no evidence: {NO_EVIDENCE.get(signal, 'none attached')}"
        out.append(
            {
                "signal": signal,
                "seen": count > 0,
                "count": count,
                "evidence": signal in evidence,
                "reason": "" if count else str(entry.get("reason") or ""),
                "detail": detail,
                "hint": "" if count else str(entry.get("hint") or ""),
            }
        )
    return out


def coverage_text(entry: Mapping[str, Any]) -> str:
    """Return one line for a ``coverage`` entry: ``lb_errors: 1532 seen`` or ``lb_errors:
    missing (no lines): <detail>``; the hint goes on a line of its own."""
    signal = entry["signal"]
    if entry["seen"]:
        return (
            f"{signal}: {entry['detail']}"
            if entry["detail"]
            else f"{signal}: {entry['count']} seen"
        )
    return f"{signal}: missing ({entry['reason']}): {entry['detail']}"
