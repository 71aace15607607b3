"""The outbox's PagerDuty events, queued with the timeline entries that cause them.

``enqueue`` runs in the transaction that wrote the entries (the notify stage, a decision): a
``trigger`` for each ``stage -> <trigger stage>`` entry, an ``acknowledge`` for each
acknowledgement entry (``ack:...``), and a ``resolve`` for each ``stage -> resolved`` entry of
an incident that was paged; one event per entry (``pagerduty:<entry id>:<action>``, unique),
so a re-processed batch or a second process queues nothing twice. Claiming and marking:
``detector.notify.delivery``.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from detector.db import store_errors
from detector.incidents.models import Incident, TimelineEntry
from detector.notify import delivery

TARGET = "pagerduty"
RESOLVED = "resolved"
ACK_PREFIX = "ack:"  # the dedupe key prefix of an acknowledgement's timeline entry


def action_of(dedupe_key: str, trigger_stage: str) -> str | None:
    """Return the event a timeline entry causes (by its dedupe key), or None."""
    if dedupe_key.startswith(f"stage:{trigger_stage}:"):
        return "trigger"
    if dedupe_key.startswith(f"stage:{RESOLVED}:"):
        return "resolve"
    if dedupe_key.startswith(ACK_PREFIX):
        return "acknowledge"
    return None


@store_errors
def enqueue(
    *, session: Session, incident: Incident, trigger_stage: str, drill: bool = False
) -> int:
    """Queue the PagerDuty events the incident's entries cause and not queued yet; return
    how many. Runs in the caller's transaction. Raises StoreError."""
    done = delivery.queued_keys(session=session, target=TARGET, incident_id=incident.id)
    paged = any(key.endswith(":trigger") for key in done)
    stmt = (
        select(TimelineEntry.id, TimelineEntry.time, TimelineEntry.dedupe_key)
        .where(
            TimelineEntry.incident_id == incident.id,
            or_(
                TimelineEntry.dedupe_key.like("stage:%"),
                TimelineEntry.dedupe_key.like(f"{ACK_PREFIX}%"),
            ),
        )
        .order_by(TimelineEntry.time, TimelineEntry.id)
    )
    count = 0
    for entry_id, time, key in session.execute(stmt):
        action = action_of(key, trigger_stage)
        if action is None or (action != "trigger" and not paged):
            continue  # only a paged incident is acknowledged or resolved
        paged = True
        dedupe = f"{TARGET}:{entry_id}:{action}"
        if dedupe not in done:
            count += delivery.add(session=session, incident_id=incident.id, target=TARGET,
                                  action=action, dedupe_key=dedupe, time=time,
                                  drill=drill)  # fmt: skip
    return count
