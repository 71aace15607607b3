"""The generated cascade recording (detector.lab.recording), placed in time and cut, for tests.

People decide in wall-clock time, so a test that approves a step replays a cascade whose event
time is near the wall clock; one that shows a late decision being refused replays it in 2025.
Cut just after the fourth death (``AWAITING_S``), the staggered-restart step is still waiting
for approval at the end of the replay: every pod is still down.
"""

from __future__ import annotations

import time
from pathlib import Path

from detector.events.detect import parse_record
from detector.events.model import SourcePos
from detector.lab.recording import DEATHS, START, write_recording

AWAITING_S = DEATHS[-1] + 12.0  # after the last death, before the first pod comes back


def cascade(outdir: Path, *, start: float = START, until_s: float | None = None) -> Path:
    """Write the cascade starting at ``start`` (Unix s) into ``outdir``, cut at ``until_s``.

    Records after ``start + until_s`` (by the detector's own parse of each line) are left out;
    lines with no signal are kept. Returns ``outdir``.
    """
    full = write_recording("cascade", outdir.with_name(outdir.name + "-full"), start=start)
    outdir.mkdir(parents=True, exist_ok=True)
    end = float("inf") if until_s is None else start + until_s
    for path in full:
        kept = []
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            signals = parse_record(line, SourcePos(str(path), number), default_time=start)
            if not signals or signals[0].time <= end:
                kept.append(line)
        (outdir / path.name).write_bytes(b"\n".join(kept) + b"\n")
    return outdir


def awaiting_now(outdir: Path) -> Path:
    """Write the cascade cut while its restart step waits, ending about 30 s ago."""
    return cascade(outdir, start=time.time() - AWAITING_S - 30.0, until_s=AWAITING_S)


def awaiting_in_2025(outdir: Path) -> Path:
    """Write the same cut cascade at its recorded time (2025): every approval long expired."""
    return cascade(outdir, until_s=AWAITING_S)
