"""The HTTP admin client: error mapping, timeouts and which calls are retried (MockTransport)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from detector.actuators.base import ActuatorError
from detector.actuators.http import (
    AdminApi,
    HttpApi,
    HttpCallError,
    parse_json,
    reason_for_status,
    render_json,
)

URL = "http://kong-admin:8001"


def client(
    handler: Callable[[httpx.Request], httpx.Response], retries: int = 2
) -> tuple[HttpApi, list[httpx.Request]]:
    """Return an HttpApi on a MockTransport that records every request it sees."""
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    api = AdminApi(URL, timeout_s=1.0, retries=retries, backoff_s=0.0)
    return HttpApi(api, transport=httpx.MockTransport(record)), seen


def timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (400, "bad_request"),
        (401, "forbidden"),
        (403, "forbidden"),
        (404, "not_found"),
        (405, "not_allowed"),
        (409, "conflict"),
        (418, "http_error"),
        (422, "bad_request"),
        (429, "throttled"),
        (500, "server_error"),
        (503, "server_error"),
    ],
)
def test_reason_for_status(status: int, reason: str) -> None:
    assert reason_for_status(status) == reason


def test_json_answer_and_request_shape() -> None:
    http, seen = client(lambda r: httpx.Response(201, json={"id": "p1"}))
    answer = http.call(
        "POST", "/services/llm/plugins", what="plugin", idempotent=False, body={"name": "x"}
    )
    assert answer == {"id": "p1"}
    assert str(seen[0].url) == f"{URL}/services/llm/plugins"
    assert seen[0].read() == b'{"name":"x"}'
    assert seen[0].headers["content-type"] == "application/json"


def test_text_and_empty_answers() -> None:
    http, _ = client(lambda r: httpx.Response(200, text="OK\n"))
    assert http.call("POST", "/runtime_modify", what="k", idempotent=True) == "OK\n"
    http, _ = client(lambda r: httpx.Response(204))
    assert http.call("DELETE", "/plugins/p1", what="p", idempotent=True) is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"message": "UNIQUE violation detected"}, "UNIQUE violation detected"),  # Kong
        ({"error": "failed to load 'llm'"}, "failed to load 'llm'"),  # Triton
        ("No admin layer specified", "No admin layer specified"),  # Envoy (text)
    ],
)
def test_error_answer_names_call_object_and_api_message(body: object, message: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(409, text=body)
        return httpx.Response(409, json=body)

    http, seen = client(answer)
    with pytest.raises(HttpCallError) as raised:
        http.call("POST", "/x", what="rate-limiting plugin on services/llm", idempotent=False)
    error = raised.value
    assert (error.reason, error.status, error.message, error.in_doubt) == (
        "conflict",
        409,
        message,
        False,
    )
    assert error.detail == (
        f"POST {URL}/x (rate-limiting plugin on services/llm) answered 409: {message}"
    )
    assert len(seen) == 1


def test_get_is_retried_after_timeouts_and_502() -> None:
    answers = iter([timeout, lambda r: httpx.Response(502), lambda r: httpx.Response(200, json=[])])
    http, seen = client(lambda r: next(answers)(r))
    assert http.call("GET", "/runtime", what="runtime", idempotent=True) == []
    assert len(seen) == 3


def test_get_timeout_after_every_attempt() -> None:
    http, seen = client(timeout, retries=1)
    with pytest.raises(HttpCallError) as raised:
        http.call("GET", "/runtime", what="Envoy runtime", idempotent=True)
    assert raised.value.reason == "timeout" and len(seen) == 2
    assert "got no answer within 1 s (2 attempts)" in raised.value.detail


@pytest.mark.parametrize("method", ["PUT", "POST", "PATCH", "DELETE"])
def test_a_mutation_that_timed_out_is_never_resent(method: str) -> None:
    http, seen = client(timeout)
    with pytest.raises(HttpCallError) as raised:
        http.call(method, "/api/serve/applications/", what="config", idempotent=True)
    assert (raised.value.reason, raised.value.in_doubt, len(seen)) == ("timeout", True, 1)


def test_a_mutation_answered_5xx_is_in_doubt_and_not_resent() -> None:
    http, seen = client(lambda r: httpx.Response(504))
    with pytest.raises(HttpCallError) as raised:
        http.call("PUT", "/api/serve/applications/", what="config", idempotent=True)
    assert (raised.value.reason, raised.value.in_doubt, len(seen)) == ("server_error", True, 1)


def test_idempotent_mutation_is_resent_only_when_nothing_was_sent() -> None:
    answers = iter([refused, lambda r: httpx.Response(200, text="OK\n")])
    http, seen = client(lambda r: next(answers)(r))
    assert http.call("POST", "/runtime_modify", what="keys", idempotent=True) == "OK\n"
    assert len(seen) == 2


def test_create_is_sent_once_even_without_a_connection() -> None:
    http, seen = client(refused)
    with pytest.raises(HttpCallError) as raised:
        http.call("POST", "/services/llm/plugins", what="plugin", idempotent=False)
    assert (raised.value.reason, raised.value.in_doubt, len(seen)) == ("unreachable", False, 1)
    assert "could not connect" in raised.value.detail


def test_load_timeout_overrides_the_endpoint_timeout() -> None:
    timeouts: list[object] = []

    def answer(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"]["read"])
        return httpx.Response(200)

    http, _ = client(answer)
    http.call(
        "POST", "/v2/repository/models/llm/load", what="load", idempotent=False, timeout_s=300
    )
    http.call("GET", "/v2/models/llm/config", what="config", idempotent=True)
    assert timeouts == [300, 1.0]


def test_admin_api_checks_its_values_and_hides_headers() -> None:
    api = AdminApi("https://kong:8444/team-a/", headers={"Kong-Admin-Token": "s3cret"})
    assert api.name == "kong:8444/team-a"
    assert "s3cret" not in repr(api)
    for url, timeout_s in (("kong:8001", 1.0), (URL, 0.0)):
        with pytest.raises(ActuatorError) as raised:
            AdminApi(url, timeout_s=timeout_s)
        assert raised.value.reason == "invalid_request"


def test_headers_are_sent_and_workspace_prefix_kept() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"data": [], "next": None})

    api = AdminApi(f"{URL}/team-a", headers={"Kong-Admin-Token": "s3cret"})
    HttpApi(api, transport=httpx.MockTransport(record)).call(
        "GET", "/services/llm/plugins", what="plugins", idempotent=True
    )
    assert str(seen[0].url) == f"{URL}/team-a/services/llm/plugins"
    assert seen[0].headers["kong-admin-token"] == "s3cret"


def test_render_and_parse_json() -> None:
    text = render_json({"b": None, "a": [1, 2]})
    assert text == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": null\n}\n'
    assert parse_json(text, "x") == {"a": [1, 2], "b": None}
    assert render_json(None) is None and parse_json(None, "x") is None
    with pytest.raises(ActuatorError):
        parse_json("{", "content of x")
