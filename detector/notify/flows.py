"""The notify flows: queue an incident's news with the writes that make it, for every face.

``queue(incident, ...)`` is the pipeline's notify stage and the end of every face's decision;
``decide(request, ...)`` is the one decide flow (``detector.runbooks.flows.decide``) followed
by that queueing, in the caller's transaction, so a decision and the messages that tell it
commit together.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from detector.config import GrafanaSettings, PagerDutySettings, SlackSettings
from detector.incidents import lifecycle
from detector.incidents.models import Incident
from detector.notify import outbox
from detector.notify.grafana import sender as grafana_events
from detector.notify.pagerduty import queue as pages
from detector.runbooks import flows
from detector.runbooks.flows import DecisionRequest, DecisionResult


def queue(
    incident: Incident,
    *,
    session: Session,
    slack: SlackSettings,
    drill: bool = False,
    pagerduty: PagerDutySettings | None = None,
    grafana: GrafanaSettings | None = None,
) -> int:
    """Queue the incident's untold timeline entries when Slack is on, and its PagerDuty events
    when ``pagerduty`` is on (``notify.pagerduty.queue``), and its annotations when ``grafana``
    is on (``notify.grafana``); return how many Slack entries.

    ``drill``: the incident comes from a replay (its messages are labelled and mention no one).
    While a person's snooze runs (``incidents.lifecycle.snooze``) on an incident not resolved,
    nothing is queued for Slack (the root message is still redrawn).
    """
    if pagerduty is not None and pagerduty.enabled:
        pages.enqueue(session=session, incident=incident,
                      trigger_stage=pagerduty.trigger_stage, drill=drill)  # fmt: skip
    if grafana is not None and grafana.enabled:
        grafana_events.enqueue(session=session, incident=incident, drill=drill)
    if not slack.enabled or _snoozed(incident, session):
        return 0  # a snoozed thread's entries are queued with the first news after it ends
    channel = slack.channel_for(incident.namespace)
    return outbox.enqueue(session=session, incident=incident, channel=channel, drill=drill)


def _snoozed(incident: Incident, session: Session) -> bool:
    """Return True while a person's snooze runs on an incident not resolved (resolving ends
    it: the thread tells what it held, then the resolve)."""
    if incident.resolved_at is not None:
        return False
    until = lifecycle.snoozed_until(session, incident)
    return until is not None and until > datetime.now(UTC)


def decide(
    request: DecisionRequest,
    *,
    session: Session,
    approvers: Collection[str],
    slack: SlackSettings,
    now: float | None = None,
    pagerduty: PagerDutySettings | None = None,
    grafana: GrafanaSettings | None = None,
) -> DecisionResult:
    """Carry out a decision (``runbooks.flows.decide``) and queue what it adds to a timeline.

    Raises ApprovalError, StoreError (as ``runbooks.flows.decide``).
    """
    result = flows.decide(request, session=session, approvers=approvers, now=now)
    incident = result.incident
    if result.approval is not None:
        incident = session.get(Incident, result.approval.incident_id)
    if incident is not None:
        queue(incident, session=session, slack=slack, pagerduty=pagerduty, grafana=grafana)
    return result
