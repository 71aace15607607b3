"""The one entry point of the postmortem export, for the CLI and the web app.

``export_postmortem(session=..., ref=..., fmt=..., settings=...)`` reads the incident through
the read model (``detector.report``: the incident, its series, its Slack thread as delivered),
analyses it (``analysis``), draws its plots (``plots``) and writes it (``render``). ``ref`` is
an incident key or id; or, for a "not this pattern" verdict, the workload it names
(``namespace/name``, its newest verdict) or ``verdict:ID``: that exports a short document
saying why it was not a GPU OOM cascade.

Errors: ``PostmortemError`` (unknown incident or verdict, unknown format); ``StoreError``
from the store.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import pandas as pd
from sqlalchemy.orm import Session

from detector.config import Settings
from detector.db import store_errors
from detector.errors import PostmortemError
from detector.incidents import service
from detector.incidents.schemas import VerdictOut
from detector.postmortem import analysis, autoscaling, checks
from detector.postmortem.plots import (
    PRESSURE_FILE,
    TRAFFIC_FILE,
    describe,
    pressure_plot,
    traffic_plot,
)
from detector.postmortem.render import FORMATS, MEDIA_TYPES, render
from detector.report.document import incident_document
from detector.report.now import down_spans
from detector.report.outbox import load_delivery
from detector.report.read import load_incident
from detector.report.series import SERIES_BUCKET_S, load_series

SERIES_COLUMNS: Final = ("time", "metric", "label", "value", "detail")
# The plots swap matplotlib's process-wide rcParams while they draw: one drawing at a time
# (the web app serves requests from a thread pool).
_DRAWING: Final = threading.Lock()


@dataclass(frozen=True)
class Export:
    """One export: the document's ``text`` in ``fmt``, and the plots as files.

    ``plots`` are (file name, SVG text), the files a Markdown document links beside it
    (``traffic.svg``, ``pressure.svg``); the HTML has them inline; JSON describes them.
    ``manifest``: the autoscaling action item as a KEDA ScaledObject (``autoscaling``), or why
    there is none; None for a verdict.
    """

    text: str
    fmt: str
    media_type: str
    filename: str
    plots: tuple[tuple[str, str], ...] = ()
    manifest: autoscaling.Manifest | None = None

    @property
    def data(self) -> bytes:
        """Return the document as UTF-8 bytes."""
        return self.text.encode("utf-8")


def export_postmortem(
    *,
    session: Session,
    ref: str,
    fmt: str,
    settings: Settings,
    prometheus_url: str = autoscaling.DEFAULT_PROMETHEUS_URL,
) -> Export:
    """Return the postmortem of incident ``ref`` (or the verdict it names) in ``fmt``.

    ``fmt``: md, html or json; ``prometheus_url``: the Prometheus the autoscaling manifest's
    triggers query. Raises PostmortemError, StoreError.
    """
    if fmt not in FORMATS:
        raise PostmortemError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    found = load_incident(session=session, ref=ref)
    if found is None:
        verdict = find_verdict(session=session, ref=ref)
        if verdict is None:
            raise PostmortemError(f"no incident or verdict {ref!r}")
        return _export(verdict_content(verdict, settings), fmt, f"verdict-{verdict.id}", ())
    inc = found.model_dump(mode="json")
    rows = load_series(session=session, incident_id=found.id)
    series = pd.DataFrame([r.model_dump() for r in rows], columns=list(SERIES_COLUMNS))
    frames = analysis.frames(inc, series, SERIES_BUCKET_S)
    th = analysis.Thresholds(settings.correlate.error_ratio, settings.correlate.kv_cache_ceiling)
    sent = load_delivery(session=session, incident_id=found.id)
    delivery = sent.model_dump(mode="json") if sent is not None else None
    content = analysis.analyse(inc, incident_document(inc), frames, th, delivery)
    sizing = checks.served_limit(frames.lb, frames.bucket_s, th.window_s, th.error_ratio)
    manifest = autoscaling.autoscaling_manifest(content, sizing, prometheus_url)
    marks, down = analysis.markers(frames), down_spans(inc)
    if fmt == "json":
        plots = describe(series, marks, down, bucket_s=SERIES_BUCKET_S)
        found_json = _export(content, fmt, f"postmortem-{found.id}", (), plots)
        return replace(found_json, manifest=manifest)
    with _DRAWING:
        svgs = (
            (TRAFFIC_FILE, traffic_plot(series, marks, bucket_s=SERIES_BUCKET_S)),
            (PRESSURE_FILE, pressure_plot(series, marks, down, bucket_s=SERIES_BUCKET_S)),
        )
    return replace(_export(content, fmt, f"postmortem-{found.id}", svgs), manifest=manifest)


def _export(
    content: Mapping[str, Any],
    fmt: str,
    stem: str,
    svgs: tuple[tuple[str, str], ...],
    plots: list[dict[str, Any]] | None = None,
) -> Export:
    text = render(content, fmt, svgs=svgs, plots=plots or ())
    files = svgs if fmt == "md" else ()
    return Export(text, fmt, MEDIA_TYPES[fmt], f"{stem}.{fmt}", files)


@store_errors
def find_verdict(*, session: Session, ref: str) -> VerdictOut | None:
    """Return the verdict ``ref`` names: ``verdict:ID``, or a workload's newest; else None."""
    verdicts = service.list_verdicts(session=session)  # newest first
    if ref.startswith("verdict:"):
        found = [v for v in verdicts if str(v.id) == ref.removeprefix("verdict:")]
    else:
        found = [v for v in verdicts if f"{v.namespace}/{v.workload}" == ref]
    return VerdictOut.model_validate(found[0]) if found else None


def verdict_content(verdict: VerdictOut, settings: Settings) -> dict[str, Any]:
    """Return the content of a verdict's export: what was decided, and why."""
    workload = f"{verdict.namespace}/{verdict.workload}"
    window = settings.correlate.window_s
    explanation = (
        f"The detector saw failures of {workload} and decided at "
        f"{analysis.iso(verdict.time)} that they were not a GPU OOM cascade. That pattern "
        f"needs a GPU out-of-memory error in a pod's logs, then more pods of the same "
        f"workload dying of it within {window:.0f} s while their load shifts to the "
        f"survivors. Here instead: {verdict.reason}."
    )
    return {
        "kind": "verdict",
        "id": verdict.id,
        "workload": workload,
        "cluster": verdict.cluster,
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "time": analysis.iso(verdict.time),
        "source": verdict.source,
        "explanation": explanation,
    }
