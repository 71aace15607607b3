"""The detector's own health as the store tells it: the Slack outbox and failed actuator calls.

``probe`` reads three numbers in one short session; the loop exports them on ``/metrics``
(``LoopMetrics.set_health``) every ``PROBE_EVERY_S`` seconds, and ``detector_store_up`` says
whether the store answered. deploy/prometheus/detector-rules.yaml alerts on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detector.notify.models import Notification
from detector.runbooks.models import StepAction

PROBE_EVERY_S = 15.0  # wall-clock seconds between two probes of the store


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What the store holds of the detector's own troubles.

    ``outbox_pending``: timeline entries queued for Slack and not sent; ``outbox_oldest_s``:
    seconds from the event time of the oldest of them to ``now`` (0 when none);
    ``failed_actions``: live actuator actions recorded as failed, all time.
    """

    outbox_pending: int
    outbox_oldest_s: float
    failed_actions: int


def probe(session: Session, now: datetime) -> StoreHealth:
    """Read the store's health numbers at ``now`` (an aware datetime); raises what the
    database driver raises when the store does not answer."""
    pending, oldest = session.execute(
        select(func.count(Notification.id), func.min(Notification.time)).where(
            Notification.sent_at.is_(None)
        )
    ).one()
    failed = session.execute(
        select(func.count(StepAction.id)).where(
            StepAction.status == "failed", StepAction.live.is_(True)
        )
    ).scalar_one()
    if oldest is not None and oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=UTC)
    age_s = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    return StoreHealth(int(pending), age_s, int(failed))
