"""Approve/Deny clicks from Slack, through the one decide flow; refusals as ephemeral messages.

A ``block_actions`` payload (https://api.slack.com/reference/interaction-payloads/block-actions)
is parsed once into a ``Click``. The Slack user is mapped to an approver of the allow-list
(``DETECTOR_CONTAINMENT__APPROVERS``): ``slack:<user id>`` as listed, else the user's e-mail
(``users.info``, scope ``users:read.email``) when the list names it. The decision goes
through ``detector.notify.flows.decide`` (the decide flow, then the outbox), so the message
is updated by the sender like any other change. A user not on the list, a step expired,
withdrawn or already decided, or a plan that changed since the message was drawn is told
why in an ephemeral message (``chat.postEphemeral``), and nothing changes. The root message's
on-call menu (an overflow, ``detector.notify.slack.lifecycle``) acknowledges, snoozes or
resolves the incident through the same flow and checks. The transports
(signed HTTP in ``detector.web``, Socket Mode in ``detector.notify.slack.socket``) verify
and acknowledge first, then call ``Interactions.handle``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs

from pydantic import BaseModel, Field, StrictInt, ValidationError
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import SignatureVerifier
from sqlalchemy.orm import Session

from detector import db
from detector.config import Settings
from detector.errors import ApprovalError, NotifyError, StoreError
from detector.notify import flows
from detector.notify.slack import lifecycle
from detector.notify.slack.blocks import ActionId
from detector.notify.slack.mrkdwn import text
from detector.runbooks.flows import DecisionKind, DecisionRequest

log = logging.getLogger(__name__)

SLACK_PREFIX = "slack:"


@dataclass(frozen=True, slots=True)
class Click:
    """One Approve/Deny click: who, where, on which step of which incident, with the plan they
    saw; ``unreadable`` when the button's value does not parse (nothing is decided then)."""

    user_id: str
    channel: str
    action: ActionId
    incident: str = ""
    step: int = 0
    plan: str = ""
    unreadable: bool = False
    act: str = ""  # the on-call menu's choice: acknowledge, snooze, resolve
    minutes: int = 0  # snooze


class _Id(BaseModel):
    id: str


class _Container(BaseModel):
    channel_id: str | None = None


class _Option(BaseModel):
    value: str = ""


class _Action(BaseModel):
    action_id: str
    value: str = ""
    selected_option: _Option | None = None  # an overflow menu's choice


class _LifecycleValue(BaseModel):
    """An on-call menu option's value (``slack.lifecycle.option_value``)."""

    i: StrictInt = Field(ge=1)
    a: Literal["acknowledge", "snooze", "resolve"]
    m: StrictInt = Field(0, ge=0, le=24 * 60)


class _Payload(BaseModel):
    """The part of a ``block_actions`` payload the buttons need."""

    type: Literal["block_actions"]
    user: _Id
    channel: _Id | None = None
    container: _Container | None = None
    actions: list[_Action] = Field(min_length=1)


class _Value(BaseModel):
    """A button's value (``blocks.action_value``)."""

    incident: str = Field(min_length=1, max_length=512)
    step: StrictInt = Field(ge=1)
    plan: str = Field(min_length=1, max_length=64)


def parse_click(payload: Mapping[str, Any]) -> Click | None:
    """Return the Approve/Deny click of a ``block_actions`` payload; None for anything else.

    The payload is validated once into typed fields: a payload of another shape, or a click
    on a button that is not ours, is None; one of our buttons whose value does not parse is a
    ``Click`` marked ``unreadable``.
    """
    try:
        parsed = _Payload.model_validate(payload)
        kind = ActionId(parsed.actions[0].action_id)
    except (ValidationError, ValueError):
        return None
    channel = parsed.channel.id if parsed.channel else None
    channel = channel or (parsed.container.channel_id if parsed.container else None)
    if not channel:
        return None
    if kind is ActionId.LIFECYCLE:
        option = parsed.actions[0].selected_option
        try:
            life = _LifecycleValue.model_validate_json(option.value if option else "")
        except ValidationError:
            return Click(parsed.user.id, channel, kind, unreadable=True)
        return Click(parsed.user.id, channel, kind, str(life.i), act=life.a, minutes=life.m)
    try:
        value = _Value.model_validate_json(parsed.actions[0].value)
    except ValidationError:
        return Click(parsed.user.id, channel, kind, unreadable=True)
    return Click(parsed.user.id, channel, kind, value.incident, value.step, value.plan)


class Interactions:
    """Carry out clicks; ``on_change`` is called after a decision committed (wake the sender)."""

    def __init__(
        self,
        settings: Settings,
        client: WebClient,
        make_session: Callable[[], Session],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._settings = settings
        self._approvers = tuple(settings.containment.approvers)
        self._client = client
        self._make_session = make_session
        self._on_change = on_change

    def handle(self, payload: Mapping[str, Any]) -> str | None:
        """Carry out one interaction payload; return the refusal told to the user, if any."""
        click = parse_click(payload)
        if click is None:
            return None
        if click.unreadable:
            return self._refuse(click, "nothing changed: this button could not be read")
        approver = self.approver(click.user_id)
        if approver is None:
            return self._refuse(
                click,
                "you are not on the approver allow-list: ask for `slack:"
                f"{text(click.user_id, 40)}` (or your e-mail) in DETECTOR_CONTAINMENT__APPROVERS",
            )
        request = _request(click, approver)
        try:
            with self._make_session() as session, db.write_turn(session):
                flows.decide(request, session=session, approvers=self._approvers,
                             slack=self._settings.slack, pagerduty=self._settings.pagerduty,
                             grafana=self._settings.grafana)  # fmt: skip
                session.commit()
        except ApprovalError as exc:
            why = exc.detail or exc.reason
            why = why if "nothing changed" in why else f"nothing changed: {why}"
            return self._refuse(click, text(why, 500))
        except StoreError as exc:
            log.warning("slack decision failed incident=%s error=%s", click.incident, exc)
            return self._refuse(click, "nothing changed: the incident store is unavailable")
        log.info("slack decision incident=%s step=%d action=%s by=%s", click.incident,
                 click.step, click.action.value, approver)  # fmt: skip
        self._on_change()
        return None

    def approver(self, user_id: str) -> str | None:
        """Return the allow-list entry of a Slack user (``slack:<id>`` or e-mail), else None."""
        tagged = SLACK_PREFIX + user_id
        if tagged in self._approvers:
            return tagged
        if not any("@" in a for a in self._approvers):
            return None
        try:
            profile = self._client.users_info(user=user_id)["user"].get("profile") or {}
        except (SlackApiError, SlackClientError, OSError, KeyError) as exc:
            log.warning("users.info failed user=%s error=%s", user_id, exc)
            return None
        email = str(profile.get("email") or "").lower()
        return next((a for a in self._approvers if email and a.lower() == email), None)

    def _refuse(self, click: Click, why: str) -> str:
        try:
            self._client.chat_postEphemeral(channel=click.channel, user=click.user_id, text=why)
        except (SlackApiError, SlackClientError, OSError) as exc:
            log.warning("ephemeral refusal failed user=%s error=%s", click.user_id, exc)
        return why


def _request(click: Click, approver: str) -> DecisionRequest:
    """Return the decision of a click: approve/deny a step, or the on-call menu's act."""
    if click.action is ActionId.LIFECYCLE:
        reason = lifecycle.RESOLVE_REASON if click.act == "resolve" else ""
        return DecisionRequest(DecisionKind(click.act), "slack", approver, reason,
                               incident=click.incident, minutes=click.minutes)  # fmt: skip
    approve = click.action is ActionId.APPROVE
    return DecisionRequest(
        DecisionKind.APPROVE if approve else DecisionKind.DENY,
        "slack",
        approver,
        incident=click.incident,
        step=str(click.step),
        plan=click.plan,
    )


def signed_payload(body: bytes, timestamp: str, signature: str, secret: str) -> dict[str, Any]:
    """Return the interaction payload of a signed request from Slack.

    Checks ``X-Slack-Signature`` (``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{body}`` with the
    signing secret) and that ``X-Slack-Request-Timestamp`` is within 5 minutes of now
    (https://api.slack.com/authentication/verifying-requests-from-slack), with slack_sdk's
    ``SignatureVerifier``; then decodes the form field ``payload`` (JSON). Raises
    NotifyError: ``bad_signature`` or ``bad_payload``.
    """
    if not (timestamp.isascii() and timestamp.isdigit()) or not signature.startswith("v0="):
        raise NotifyError("bad_signature", "no Slack signature or timestamp")
    try:
        valid = SignatureVerifier(secret).is_valid(body, timestamp, signature)
    except ValueError:  # a body that is not UTF-8 cannot have been signed by Slack
        valid = False
    if not valid:
        raise NotifyError("bad_signature", "the Slack signature or timestamp is not valid")
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True)
        payload = json.loads(form["payload"][0])
    except (UnicodeDecodeError, ValueError, KeyError) as exc:
        raise NotifyError("bad_payload", "no JSON payload form field") from exc
    except RecursionError as exc:  # signed, yet nested deeper than any Slack payload
        raise NotifyError("bad_payload", "the payload is nested too deep") from exc
    if not isinstance(payload, dict):
        raise NotifyError("bad_payload", "the payload is not a JSON object")
    return payload
