"""The root message's on-call line and its menu: Acknowledge, Snooze, Resolve (pure).

The line says who acknowledged the incident (and via which face, when), and until when its
replies are snoozed, from the read model's timeline (``detail["lifecycle"]``:
``detector.incidents.lifecycle``). While the incident is not resolved it carries an overflow
menu (https://api.slack.com/reference/block-kit/block-elements#overflow: up to 5 options,
each value at most 150 characters): each option's value is a small JSON object
(``option_value``) with the incident id, the act and the snooze minutes, which
``detector.notify.slack.interactions`` parses into a decision through the one decide flow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from detector.notify.slack.mrkdwn import text

ACTION_ID = "incident_lifecycle"
OPTIONS = (
    ("acknowledge", 0, "Acknowledge: I'm on it"),
    ("snooze", 30, "Snooze replies 30 min"),
    ("snooze", 120, "Snooze replies 2 h"),
    ("resolve", 0, "Resolve"),
)
RESOLVE_REASON = "resolved from Slack"  # a menu option carries no free text


def option_value(incident_id: int, act: str, minutes: int = 0) -> str:
    """Return an option's value: ``{"i": incident id, "a": act, "m": minutes}``."""
    return json.dumps({"i": incident_id, "a": act, "m": minutes}, separators=(",", ":"))


def block(inc: Mapping[str, Any], now: datetime | None) -> dict[str, Any]:
    """Return the on-call section of the incident ``inc`` (an ``IncidentOut`` JSON dump)."""
    out: dict[str, Any] = {
        "type": "section",
        "block_id": "lifecycle",
        "text": {"type": "mrkdwn", "text": line(inc, now)},
    }
    if inc["stage"] != "resolved":
        out["accessory"] = {
            "type": "overflow",
            "action_id": ACTION_ID,
            "options": [
                {"text": {"type": "plain_text", "text": label},
                 "value": option_value(int(inc["id"]), act, minutes)}
                for act, minutes, label in OPTIONS
            ],
        }  # fmt: skip
    return out


def line(inc: Mapping[str, Any], now: datetime | None) -> str:
    """Return who is on it and until when replies are snoozed (a snooze past ``now`` is not
    shown; ``now`` None: the latest snooze is)."""
    acked = _latest(inc, "acknowledged", after=_latest(inc, "reopened"))
    if acked is None:
        parts = ["*On call:* not acknowledged yet"]
    else:
        d = acked["detail"]
        parts = [f"*On call:* acknowledged by {text(str(d.get('by')), 80)} via "
                 f"{text(str(d.get('via')), 20)} at {_clock(acked['time'])}"]  # fmt: skip
    snoozed = _latest(inc, "snoozed")
    if snoozed is not None:
        until = datetime.fromisoformat(str(snoozed["detail"].get("until")))
        if now is None or until > now:
            parts.append(f"replies snoozed until {until:%H:%M} UTC by "
                         f"{text(str(snoozed['detail'].get('by')), 80)}")  # fmt: skip
    return " · ".join(parts)


def _latest(
    inc: Mapping[str, Any], act: str, after: Mapping[str, Any] | None = None
) -> Mapping[str, Any] | None:
    found = [
        e
        for e in inc["timeline"]
        if (e.get("detail") or {}).get("lifecycle") == act
        and (after is None or e["id"] > after["id"])
    ]
    return max(found, key=lambda e: e["id"]) if found else None


def _clock(value: str) -> str:
    return f"{datetime.fromisoformat(value.replace('Z', '+00:00')).astimezone(UTC):%H:%M} UTC"
