"""The notify flows: queue an incident's news with the writes that make it, for every face.

``queue(incident, ...)`` is the pipeline's notify stage and the end of every face's decision;
``decide(request, ...)`` is the one decide flow (``detector.runbooks.flows.decide``) followed
by that queueing, in the caller's transaction, so a decision and the messages that tell it
commit together.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy.orm import Session

from detector.config import SlackSettings
from detector.incidents.models import Incident
from detector.notify import outbox
from detector.runbooks import flows
from detector.runbooks.flows import DecisionRequest, DecisionResult


def queue(
    incident: Incident, *, session: Session, slack: SlackSettings, drill: bool = False
) -> int:
    """Queue the incident's untold timeline entries when Slack is on; return how many.

    ``drill``: the incident comes from a replay (its messages are labelled and mention no one).
    """
    if not slack.enabled:
        return 0
    channel = slack.channel_for(incident.namespace)
    return outbox.enqueue(session=session, incident=incident, channel=channel, drill=drill)


def decide(
    request: DecisionRequest,
    *,
    session: Session,
    approvers: Collection[str],
    slack: SlackSettings,
    now: float | None = None,
) -> DecisionResult:
    """Carry out a decision (``runbooks.flows.decide``) and queue what it adds to a timeline.

    Raises ApprovalError, StoreError (as ``runbooks.flows.decide``).
    """
    result = flows.decide(request, session=session, approvers=approvers, now=now)
    if result.approval is not None:
        incident = session.get(Incident, result.approval.incident_id)
        if incident is not None:
            queue(incident, session=session, slack=slack)
    return result
