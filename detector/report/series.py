"""Load an incident's time series from the store for the web page's charts and the postmortem.

The series are the correlator's (``detector.correlate.series``), written per bucket by
``detector.incidents.flows.write_series``: ``requests``, ``errors_5xx``, ``shed_429``
(responses per ``SERIES_BUCKET_S`` bucket at the load balancer, label ""), and per pod
(label) ``pressure`` (the highest used/total ratio) and ``ceiling`` (the ratio it was judged
against), detail "KV cache" or "GPU memory".
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from detector.correlate.series import SERIES_BUCKET_S
from detector.db import store_errors
from detector.incidents.models import SeriesValue
from detector.incidents.schemas import Out

__all__ = ["SERIES_BUCKET_S", "SeriesOut", "load_series"]


class SeriesOut(Out):
    """One bucket of one series: ``time`` is the bucket's start (UTC)."""

    time: datetime
    metric: str  # requests | errors_5xx | shed_429 | pressure | ceiling
    label: str  # "" for the load balancer's series; the pod for pressure and ceiling
    value: float  # responses in the bucket, or a used/total ratio
    detail: str  # "KV cache" | "GPU memory" for pressure and ceiling; else ""


@store_errors
def load_series(*, session: Session, incident_id: int) -> list[SeriesOut]:
    """Return the incident's series ordered by metric, label, time; raises StoreError."""
    stmt = (
        select(SeriesValue)
        .where(SeriesValue.incident_id == incident_id)
        .order_by(SeriesValue.metric, SeriesValue.label, SeriesValue.time)
    )
    return [SeriesOut.model_validate(row) for row in session.scalars(stmt)]
