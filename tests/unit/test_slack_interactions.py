"""Parsing Slack's interaction payloads and verifying signed requests (pure parts)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import urlencode

import pytest

from detector.errors import NotifyError
from detector.notify.slack.blocks import ActionId, action_value
from detector.notify.slack.interactions import parse_click, signed_payload

SECRET = "signing-secret"


def _payload(value: Any, action_id: str = "approve_step", **over: Any) -> dict[str, Any]:
    payload = {
        "type": "block_actions",
        "user": {"id": "U42"},
        "channel": {"id": "C1"},
        "actions": [{"action_id": action_id, "value": value}],
    }
    return payload | over


def test_a_click_of_our_button_is_parsed_once_into_typed_fields() -> None:
    click = parse_click(_payload(action_value("llm/v@1", 3, "abc")))
    assert click is not None and not click.unreadable
    assert (click.user_id, click.channel, click.action) == ("U42", "C1", ActionId.APPROVE)
    assert (click.incident, click.step, click.plan) == ("llm/v@1", 3, "abc")


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "view_submission"},
        {"type": "block_actions", "user": "x", "actions": "y"},
        {"type": "block_actions", "user": {"id": "U1"}, "actions": ["x"]},
        {"type": "block_actions", "user": {"id": "U1"}, "channel": {"id": "C1"}, "actions": []},
        _payload(action_value("k", 3, "p"), action_id="someone_elses_button"),
        _payload(action_value("k", 3, "p"), channel=None),
    ],
)
def test_other_payloads_are_not_clicks(payload: dict[str, Any]) -> None:
    assert parse_click(payload) is None


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        json.dumps({"incident": "k", "step": 3.9, "plan": "p"}),
        json.dumps({"incident": "k", "step": "3", "plan": "p"}),
        json.dumps({"incident": "k", "step": -1, "plan": "p"}),
        json.dumps({"incident": "k", "step": 3}),
        json.dumps({"incident": "", "step": 3, "plan": "p"}),
        json.dumps([1, 2]),
    ],
)
def test_our_button_with_a_broken_value_is_unreadable(value: str) -> None:
    click = parse_click(_payload(value))
    assert click is not None and click.unreadable


def _signed(body: bytes, ts: str) -> str:
    digest = hmac.new(SECRET.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256)
    return "v0=" + digest.hexdigest()


def test_a_signed_request_gives_its_payload() -> None:
    body = urlencode({"payload": json.dumps({"type": "block_actions"})}).encode()
    ts = str(int(time.time()))
    assert signed_payload(body, ts, _signed(body, ts), SECRET) == {"type": "block_actions"}


@pytest.mark.parametrize(
    ("body", "ts", "signature"),
    [
        (b"payload=%7B%7D", "", ""),
        (b"payload=%7B%7D", "abc", "v0=00"),
        (b"payload=%7B%7D", str(int(time.time()) - 400), None),  # stale, correctly signed
        (b"\xff\xfe", str(int(time.time())), None),  # not UTF-8, correctly signed
        (b"payload=%7B%7D", str(int(time.time())), "v0=" + "0" * 64),
    ],
)
def test_a_bad_signature_or_timestamp_is_refused(body: bytes, ts: str, signature: str) -> None:
    with pytest.raises(NotifyError) as caught:
        signed_payload(body, ts, signature or _signed(body, ts), SECRET)
    assert caught.value.reason == "bad_signature"


def test_a_signed_body_without_a_json_object_payload_is_bad() -> None:
    ts = str(int(time.time()))
    deep = "[" * 100_000 + "]" * 100_000  # signed, nested deeper than the JSON decoder goes
    for body in (b"nothing=here", urlencode({"payload": "[1]"}).encode(),
                 urlencode({"payload": deep}).encode()):  # fmt: skip
        with pytest.raises(NotifyError) as caught:
            signed_payload(body, ts, _signed(body, ts), SECRET)
        assert caught.value.reason == "bad_payload"
