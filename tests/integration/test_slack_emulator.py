"""The Slack emulator answers the real slack_sdk clients (Web API and Socket Mode) as Slack does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from urllib.parse import parse_qs

import pytest
from slack_emulator import SlackEmulator, block_actions_payload, signed_request
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

CHANNEL = "C0INCIDENTS"
BLOCKS = [{"type": "section", "text": {"type": "mrkdwn", "text": "*Incident 42*"}}]
METADATA = {"event_type": "incident_opened", "event_payload": {"incident_id": 42}}


@pytest.fixture
def web(slack_emulator: SlackEmulator) -> WebClient:
    """Return a WebClient with the emulator's bot token."""
    return WebClient(base_url=slack_emulator.api_url, token=slack_emulator.bot_token, timeout=5)


def test_post_find_by_metadata_update_and_reply(
    slack_emulator: SlackEmulator, web: WebClient
) -> None:
    posted = web.chat_postMessage(
        channel=CHANNEL, text="Incident 42", blocks=BLOCKS, metadata=METADATA
    )
    web.chat_postMessage(channel=CHANNEL, text="unrelated")
    ts = posted["ts"]
    assert posted["channel"] == CHANNEL and posted["message"]["blocks"] == BLOCKS

    history = web.conversations_history(channel=CHANNEL, include_all_metadata=True)
    found = [m for m in history["messages"] if m.get("metadata") == METADATA]
    assert [m["ts"] for m in found] == [ts]
    assert history["messages"][-1]["ts"] == ts  # newest first
    plain = web.conversations_history(channel=CHANNEL)
    assert all("metadata" not in m for m in plain["messages"])

    web.chat_update(channel=CHANNEL, ts=ts, text="Incident 42 resolved", blocks=[])
    (stored,) = [m for m in slack_emulator.root_messages(CHANNEL) if m["ts"] == ts]
    assert stored["text"] == "Incident 42 resolved" and stored["metadata"] == METADATA
    assert slack_emulator.edits[0]["before"]["text"] == "Incident 42"

    reply = web.chat_postMessage(channel=CHANNEL, text="step 1 done", thread_ts=ts)
    thread = web.conversations_replies(channel=CHANNEL, ts=ts, include_all_metadata=True)
    assert [m["ts"] for m in thread["messages"]] == [ts, reply["ts"]]
    assert thread["messages"][0]["reply_count"] == 1
    assert [m["text"] for m in slack_emulator.replies(CHANNEL, ts)] == ["step 1 done"]
    assert len(web.conversations_history(channel=CHANNEL)["messages"]) == 2  # reply not shown

    with pytest.raises(SlackApiError) as caught:
        web.chat_update(channel=CHANNEL, ts="1.000001", text="x")
    assert caught.value.response["error"] == "message_not_found"
    with pytest.raises(SlackApiError) as caught:
        web.conversations_replies(channel=CHANNEL, ts="1.000001")
    assert caught.value.response["error"] == "thread_not_found"


def test_history_pages_with_cursor(slack_emulator: SlackEmulator, web: WebClient) -> None:
    sent = [web.chat_postMessage(channel=CHANNEL, text=f"m{i}")["ts"] for i in range(5)]
    seen: list[str] = []
    for page in web.conversations_history(channel=CHANNEL, limit=2):
        seen += [m["ts"] for m in page["messages"]]
    assert seen == sent[::-1]
    assert len(slack_emulator.calls_to("conversations.history")) == 3


def test_users_auth_ephemeral_and_errors(slack_emulator: SlackEmulator, web: WebClient) -> None:
    slack_emulator.add_user("U123", "alice@example.com")
    user = web.users_info(user="U123")["user"]
    assert user["id"] == "U123" and user["profile"]["email"] == "alice@example.com"
    assert web.auth_test()["bot_id"]
    web.chat_postEphemeral(channel=CHANNEL, user="U123", text="only you")
    assert slack_emulator.ephemerals[0]["user"] == "U123"

    with pytest.raises(SlackApiError) as caught:
        web.users_info(user="U404")
    assert caught.value.response["error"] == "user_not_found"
    bad = WebClient(base_url=slack_emulator.api_url, token="xoxb-wrong")
    with pytest.raises(SlackApiError) as caught:
        bad.auth_test()
    assert caught.value.response["error"] == "invalid_auth"
    with pytest.raises(SlackApiError) as caught:
        WebClient(base_url=slack_emulator.api_url).auth_test()
    assert caught.value.response["error"] == "not_authed"
    with pytest.raises(SlackApiError) as caught:
        web.api_call("no.such.method")
    assert caught.value.response["error"] == "unknown_method"


def test_known_channels_and_form_encoded_blocks(slack_emulator: SlackEmulator) -> None:
    slack_emulator.known_channels = {CHANNEL}
    web = WebClient(base_url=slack_emulator.api_url, token=slack_emulator.bot_token)
    with pytest.raises(SlackApiError) as caught:
        web.chat_postMessage(channel="C0NOPE", text="x")
    assert caught.value.response["error"] == "channel_not_found"
    # A form body carries blocks and metadata as JSON strings; the emulator decodes them.
    web.api_call(
        "chat.postMessage",
        params={"channel": CHANNEL, "blocks": json.dumps(BLOCKS), "metadata": json.dumps(METADATA)},
    )
    (stored,) = slack_emulator.messages(CHANNEL)
    assert stored["blocks"] == BLOCKS and stored["metadata"] == METADATA


def test_rate_limit_is_retried_by_the_sdk(slack_emulator: SlackEmulator) -> None:
    slack_emulator.fail("chat.postMessage", status=429, times=1, retry_after=1)
    web = WebClient(
        base_url=slack_emulator.api_url,
        token=slack_emulator.bot_token,
        retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=2)],
    )
    assert web.chat_postMessage(channel=CHANNEL, text="after a retry")["ok"]
    assert [(c.method, c.status) for c in slack_emulator.failed_calls] == [
        ("chat.postMessage", 429)
    ]
    assert len(slack_emulator.calls_to("chat.postMessage")) == 1
    assert len(slack_emulator.messages(CHANNEL)) == 1


def test_server_error_reaches_the_caller(slack_emulator: SlackEmulator, web: WebClient) -> None:
    slack_emulator.fail("chat.postMessage", status=503, times=1)
    with pytest.raises(SlackApiError) as caught:
        web.chat_postMessage(channel=CHANNEL, text="lost")
    assert caught.value.response.status_code == 503
    assert slack_emulator.messages() == []
    assert web.chat_postMessage(channel=CHANNEL, text="kept")["ok"]


def test_pause_holds_requests_until_resume(slack_emulator: SlackEmulator, web: WebClient) -> None:
    slack_emulator.pause()
    results: list[str] = []
    thread = threading.Thread(
        target=lambda: results.append(web.chat_postMessage(channel=CHANNEL, text="late")["ts"])
    )
    thread.start()
    slack_emulator.wait_for(lambda emu: emu.held_requests == 1, what="a held request")
    assert not slack_emulator.calls and not results
    slack_emulator.resume()
    thread.join(timeout=5)
    assert len(results) == 1 and slack_emulator.messages(CHANNEL)[0]["ts"] == results[0]


def test_stop_drops_held_requests() -> None:
    with SlackEmulator() as emulator:
        # No retry handlers: the SDK's default one would retry the dropped connection.
        web = WebClient(base_url=emulator.api_url, token=emulator.bot_token, retry_handlers=[])
        emulator.pause()
        errors: list[Exception] = []

        def post() -> None:
            try:
                web.chat_postMessage(channel=CHANNEL, text="never")
            except Exception as exc:
                errors.append(exc)

        thread = threading.Thread(target=post)
        thread.start()
        emulator.wait_for(lambda emu: emu.held_requests == 1, what="a held request")
        emulator.stop()
        thread.join(timeout=10)
    assert len(errors) == 1 and not isinstance(errors[0], SlackApiError), errors
    assert {(c.method, c.status) for c in emulator.failed_calls} == {("chat.postMessage", 0)}
    assert emulator.messages() == []


@pytest.fixture
def socket_client(slack_emulator: SlackEmulator) -> Iterator[SocketModeClient]:
    """Return a builtin SocketModeClient that acks every request, closed after the test."""
    client = SocketModeClient(
        app_token=slack_emulator.app_token,
        web_client=WebClient(base_url=slack_emulator.api_url),
    )
    received: list[SocketModeRequest] = []

    def ack(client: SocketModeClient, request: SocketModeRequest) -> None:
        received.append(request)
        client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    client.socket_mode_request_listeners.append(ack)
    client.received = received  # type: ignore[attr-defined]
    try:
        yield client
    finally:
        client.close()


def test_socket_mode_delivers_block_actions_and_gets_ack(
    slack_emulator: SlackEmulator, socket_client: SocketModeClient
) -> None:
    socket_client.connect()
    slack_emulator.wait_socket_connected()
    assert slack_emulator.calls_to("apps.connections.open") == [{}]

    payload = block_actions_payload(
        user_id="U123", action_id="approve", value="run-7", channel=CHANNEL, message_ts="1.000100"
    )
    envelope_id = slack_emulator.send_interactive(payload)
    assert slack_emulator.wait_ack(envelope_id) == {"envelope_id": envelope_id}
    (request,) = socket_client.received  # type: ignore[attr-defined]
    assert request.type == "interactive" and request.payload["actions"][0]["value"] == "run-7"
    assert request.payload["container"]["message_ts"] == "1.000100"

    slack_emulator.send_disconnect()
    slack_emulator.wait_for(lambda emu: emu.socket_connects == 2, what="a reconnection")
    slack_emulator.wait_socket_connected()
    second = slack_emulator.send_interactive(payload)
    assert slack_emulator.wait_ack(second)["envelope_id"] == second


def test_signed_request_passes_slack_sdk_verifier() -> None:
    payload = block_actions_payload(
        user_id="U1", action_id="deny", value="v", channel=CHANNEL, message_ts="1.000001"
    )
    body, headers = signed_request("s3cret", payload)
    verifier = SignatureVerifier("s3cret")
    timestamp, signature = headers["X-Slack-Request-Timestamp"], headers["X-Slack-Signature"]
    assert verifier.is_valid(body, timestamp, signature)
    assert not SignatureVerifier("other").is_valid(body, timestamp, signature)
    assert json.loads(parse_qs(body.decode())["payload"][0]) == payload
