"""Pure parts of the Kubernetes actuators: flags, env, strategies, fields, requests, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from detector.actuators.base import ActuatorError
from detector.actuators.kubernetes.api import (
    BACKEND_TRAFFIC_POLICIES,
    CONFIGMAPS,
    DEPLOYMENTS,
    PODS,
    ApiRequest,
    KubeApi,
    ObjectRef,
    Permission,
    Verb,
    api_error,
    permission,
    transport_error,
)
from detector.actuators.kubernetes.gateways import (
    IngressRateLimit,
    local_rate_limit,
    status_code_note,
)
from detector.actuators.kubernetes.patch import (
    ceiling_fields,
    container_patch,
    desired_ceiling_fields,
    find_flag,
    format_value,
    merge_diff,
    one_pod_strategy,
    parse_fields,
    remove_flag,
    render_fields,
    rolls_one_at_a_time,
    set_flag,
)

VLLM = {
    "name": "vllm",
    "args": ["--model", "m", "--max-num-seqs", "256", "--max_model_len=4096"],
}


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["--max-num-seqs", "64"], (0, "64", False)),
        (["--max-num-seqs=64"], (0, "64", True)),
        (["--max_num_seqs", "64"], (0, "64", False)),
        (["--max-num-seqs=8", "--x", "--max-num-seqs", "64"], (2, "64", False)),
        (["--max-num-seqs-extra=1"], None),
        ([], None),
    ],
)
def test_find_flag_returns_the_last_value_in_either_form(
    argv: list[str], found: tuple[int, str, bool] | None
) -> None:
    assert find_flag(argv, "--max-num-seqs") == found


def test_find_flag_without_a_value_is_an_error() -> None:
    with pytest.raises(ActuatorError, match="has no value"):
        find_flag(["serve", "--max-num-seqs"], "--max-num-seqs")


@pytest.mark.parametrize(
    ("argv", "after"),
    [
        (["--max-num-seqs", "256"], ["--max-num-seqs", "64"]),
        (["--max-num-seqs=256"], ["--max-num-seqs=64"]),
        (["--max_num_seqs=256"], ["--max_num_seqs=64"]),
        (["serve", "m"], ["serve", "m", "--max-num-seqs=64"]),
    ],
)
def test_set_flag_keeps_the_form_or_appends(argv: list[str], after: list[str]) -> None:
    assert set_flag(argv, "--max-num-seqs", "64") == after


def test_remove_flag_takes_every_form_and_its_value() -> None:
    argv = ["serve", "--max-num-seqs", "1", "--max_num_seqs=2", "--max-num-seqs=3", "--port", "80"]
    assert remove_flag(argv, "--max-num-seqs") == ["serve", "--port", "80"]


def test_ceiling_fields_read_args_command_and_env() -> None:
    sglang = {
        "name": "sglang",
        "command": ["python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.88"],
        "args": ["--max-running-requests=128"],
    }
    assert ceiling_fields(sglang, "sglang") == {
        "containers[sglang].args[--max-running-requests]": "128",
        "containers[sglang].command[--mem-fraction-static]": "0.88",
    }
    tgi = {"name": "tgi", "env": [{"name": "MAX_INPUT_TOKENS", "value": "4095"}]}
    assert ceiling_fields(tgi, "tgi") == {"containers[tgi].env[MAX_INPUT_TOKENS]": "4095"}


def test_desired_fields_change_in_place_and_add_new_ones_by_default() -> None:
    desired = desired_ceiling_fields(
        VLLM, "vllm", {"max_num_seqs": 32, "max_model_len": 2048, "gpu_memory_utilization": 0.85}
    )
    assert desired == {
        "containers[vllm].args[--max-num-seqs]": "32",
        "containers[vllm].args[--max-model-len]": "2048",
        "containers[vllm].args[--gpu-memory-utilization]": "0.85",
    }
    patch = container_patch(VLLM, ceiling_fields(VLLM, "vllm"), desired)
    assert patch == {
        "name": "vllm",
        "args": [
            "--model",
            "m",
            "--max-num-seqs",
            "32",
            "--max_model_len=2048",
            "--gpu-memory-utilization=0.85",
        ],
    }


def test_tgi_flag_on_the_command_line_wins_over_env() -> None:
    tgi = {
        "name": "tgi",
        "args": ["--max-concurrent-requests", "128"],
        "env": [{"name": "MAX_CONCURRENT_REQUESTS", "value": "128"}],
    }
    desired = desired_ceiling_fields(
        tgi, "tgi", {"max_concurrent_requests": 16, "max_total_tokens": 8192}
    )
    assert desired == {
        "containers[tgi].args[--max-concurrent-requests]": "16",
        "containers[tgi].env[MAX_TOTAL_TOKENS]": "8192",
    }
    assert container_patch(tgi, ceiling_fields(tgi, "tgi"), desired) == {
        "name": "tgi",
        "args": ["--max-concurrent-requests", "16"],
        "env": [{"name": "MAX_TOTAL_TOKENS", "value": "8192"}],
    }


def test_revert_fields_remove_what_was_added() -> None:
    container = {
        "name": "tgi",
        "args": ["--max-input-tokens=100"],
        "env": [{"name": "MAX_TOTAL_TOKENS", "value": "8"}],
    }
    now = ceiling_fields(container, "tgi")
    assert container_patch(container, now, {}) == {
        "name": "tgi",
        "args": [],
        "env": [{"name": "MAX_TOTAL_TOKENS", "$patch": "delete"}],
    }
    assert container_patch(container, now, now) is None


@pytest.mark.parametrize(
    ("container", "ceilings", "reason"),
    [
        (VLLM, {"max_batch": 1}, "invalid_request"),
        (VLLM, {"max_num_seqs": True}, "invalid_request"),
        (
            {"name": "v", "command": ["/bin/sh", "-c", "vllm serve m --max-num-seqs 256"]},
            {"max_num_seqs": 8},
            "unsupported",
        ),
        (
            {"name": "v", "command": ["sh", "-c", "exec vllm serve m"]},
            {"max_model_len": 8},
            "unsupported",
        ),
    ],
)
def test_desired_fields_refuse(container: dict[str, Any], ceilings: Any, reason: str) -> None:
    with pytest.raises(ActuatorError) as raised:
        desired_ceiling_fields(container, "vllm", ceilings)
    assert raised.value.reason == reason


def test_env_from_value_from_cannot_be_changed() -> None:
    source = {"configMapKeyRef": {"name": "tgi", "key": "max"}}
    tgi = {"name": "tgi", "env": [{"name": "MAX_CONCURRENT_REQUESTS", "valueFrom": source}]}
    current = ceiling_fields(tgi, "tgi")
    assert current == {"containers[tgi].env[MAX_CONCURRENT_REQUESTS]": source}
    desired = desired_ceiling_fields(tgi, "tgi", {"max_concurrent_requests": 8})
    with pytest.raises(ActuatorError, match="valueFrom") as raised:
        container_patch(tgi, current, desired)
    assert raised.value.reason == "unsupported"


def test_unknown_engine() -> None:
    with pytest.raises(ActuatorError, match="unknown engine 'trtllm'"):
        ceiling_fields(VLLM, "trtllm")


@pytest.mark.parametrize(
    ("strategy", "one"),
    [
        ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}, True),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, True),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            False,
        ),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 0}}, False),
        ({"type": "Recreate"}, False),
        (None, False),
    ],
)
def test_rolls_one_at_a_time(strategy: dict[str, Any] | None, one: bool) -> None:
    assert rolls_one_at_a_time(strategy) is one


def test_one_pod_strategy_keeps_a_good_one_and_replaces_others() -> None:
    down_first = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert one_pod_strategy(down_first, "surge") == down_first
    assert one_pod_strategy({"type": "Recreate"}, "surge") == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert merge_diff(
        {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}, {"type": "Recreate"}
    ) == {
        "type": "Recreate",
        "rollingUpdate": None,
    }


def test_merge_diff_nulls_removed_keys_and_replaces_lists() -> None:
    current = {"type": "Global", "global": {"rules": [1]}, "keep": {"a": 1}}
    desired = {"type": "Local", "local": {"rules": [2]}, "keep": {"a": 1}}
    assert merge_diff(current, desired) == {
        "type": "Local",
        "local": {"rules": [2]},
        "global": None,
    }


def test_fields_text_round_trips() -> None:
    fields = {
        "spec.strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}},
        "containers[a].env[NOTE]": 'line one\nline "two": ü',
        "metadata.annotations[x/y]": "5",
    }
    text = render_fields(fields)
    assert text.count("\n") == 3
    assert parse_fields(text) == fields
    assert render_fields({}) == ""
    with pytest.raises(ActuatorError, match="field line 1"):
        parse_fields("no separator\n")


def test_format_value() -> None:
    assert (format_value(64), format_value(0.9), format_value("0.85")) == ("64", "0.9", "0.85")


def test_requests_describe_method_path_and_content_type() -> None:
    deploy = ApiRequest(Verb.PATCH, ObjectRef(DEPLOYMENTS, "ns", "d"), {"b": 1, "a": [2]})
    assert deploy.describe() == (
        "PATCH /apis/apps/v1/namespaces/ns/deployments/d "
        '(application/strategic-merge-patch+json) {"a":[2],"b":1}'
    )
    policy = ObjectRef(BACKEND_TRAFFIC_POLICIES, "ns", "p")
    assert ApiRequest(Verb.PATCH, policy, {}).content_type == "application/merge-patch+json"
    assert ApiRequest(Verb.CREATE, policy, {}).path == (
        "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/ns/backendtrafficpolicies"
    )
    evict = ApiRequest(Verb.EVICT, ObjectRef(PODS, "ns", "p"), {})
    assert (evict.method, evict.path) == ("POST", "/api/v1/namespaces/ns/pods/p/eviction")
    assert ObjectRef(PODS, "ns", "p").label == "pods ns/p"


def test_permissions() -> None:
    assert permission(PODS, Verb.EVICT) == Permission("", "pods/eviction", "create")
    assert permission(DEPLOYMENTS, Verb.PATCH) == Permission("apps", "deployments", "patch")


def _api_exception(status: int, reason: str, body: Any) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps(body) if not isinstance(body, str) else body
    return exc


@pytest.mark.parametrize(
    ("status", "reason", "code"),
    [
        (400, "Bad Request", "bad_request"),
        (401, "Unauthorized", "forbidden"),
        (403, "Forbidden", "forbidden"),
        (404, "Not Found", "not_found"),
        (409, "Conflict", "conflict"),
        (422, "Unprocessable Entity", "bad_request"),
        (429, "Too Many Requests", "throttled"),
        (500, "Internal Server Error", "server_error"),
        (418, "I'm a teapot", "http_error"),
    ],
)
def test_api_errors_become_reasons_naming_the_call(status: int, reason: str, code: str) -> None:
    error = api_error(_api_exception(status, reason, {"message": "why"}), "patch pods ns/p", "ns")
    assert error.reason == code
    assert error.detail == f"patch pods ns/p: {status} {reason}: why"


def test_a_pdb_refusal_names_the_budget() -> None:
    body = {
        "kind": "Status",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": (
                        "The disruption budget llama-pdb needs 2 healthy pods and has 2 currently"
                    ),
                }
            ]
        },
        "code": 429,
    }
    error = api_error(_api_exception(429, "Too Many Requests", body), "evict pods ns/p", "ns")
    assert error.reason == "pdb_blocked"
    assert error.detail.startswith(
        "evict pods ns/p: blocked by PodDisruptionBudget ns/llama-pdb (429 Too Many Requests)"
    )
    no_name = dict(body, details={"causes": [{"reason": "DisruptionBudget", "message": ""}]})
    error = api_error(_api_exception(429, "Too Many Requests", no_name), "evict pods ns/p", "ns")
    assert "PodDisruptionBudget (name not given)" in error.detail


def test_a_body_that_is_not_a_status_is_quoted() -> None:
    error = api_error(
        _api_exception(502, "Bad Gateway", "<html>proxy</html>"), "get pods ns/p", "ns"
    )
    assert (error.reason, error.detail) == (
        "server_error",
        "get pods ns/p: 502 Bad Gateway: <html>proxy</html>",
    )


def test_transport_errors() -> None:
    read = urllib3.exceptions.ReadTimeoutError(None, "/x", "read timed out")  # type: ignore[arg-type]
    assert (
        transport_error(read, "get pods ns/p", 2.5).detail
        == "get pods ns/p: no answer within 2.5 s"
    )
    wrapped = urllib3.exceptions.MaxRetryError(None, "/x", read)  # type: ignore[arg-type]
    assert transport_error(wrapped, "get pods ns/p", 1).reason == "timeout"
    refused = urllib3.exceptions.NewConnectionError(None, "refused")  # type: ignore[arg-type]
    assert transport_error(refused, "get pods ns/p", 1).reason == "unreachable"
    dropped = urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError())
    assert transport_error(dropped, "patch pods ns/p", 1).reason == "connection_lost"


def test_calls_outside_the_granted_set_are_refused_before_sending() -> None:
    api_client = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    try:
        api = KubeApi(api_client, timeout_s=0.5)
        request = ApiRequest(Verb.PATCH, ObjectRef(CONFIGMAPS, "ingress-nginx", "c"), {})
        with pytest.raises(ActuatorError, match="no patch call for configmaps") as raised:
            api.send(request)
        assert raised.value.reason == "invalid_request"
        with pytest.raises(ActuatorError, match="timeout_s"):
            KubeApi(api_client, timeout_s=0)
    finally:
        api_client.close()


def test_status_code_note() -> None:
    rps = IngressRateLimit(rps=5)
    both = IngressRateLimit(rps=5, connections=10)
    assert status_code_note({"limit-req-status-code": "429"}, rps, "ns/c") == ""
    assert "no limit-req-status-code (default 503)" in status_code_note({}, rps, "ns/c")
    note = status_code_note({"limit-req-status-code": "429"}, both, "ns/c")
    assert "no limit-conn-status-code (default 503)" in note
    assert "limit-req-status-code" not in note
    assert "limit-req-status-code=503" in status_code_note(
        {"limit-req-status-code": "503"}, rps, "c"
    )
    assert "could not read ConfigMap ns/c (forbidden)" in status_code_note(
        None, rps, "ns/c", "forbidden"
    )


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"rps": 0}, {"rps": 1.5}, {"connections": True}, {"burst_multiplier": 2}],
)
def test_ingress_rate_limit_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ActuatorError):
        IngressRateLimit(**kwargs)


def test_ingress_annotations_are_strings() -> None:
    limit = IngressRateLimit(rps=5, connections=10, burst_multiplier=3)
    assert limit.annotations() == {
        "nginx.ingress.kubernetes.io/limit-rps": "5",
        "nginx.ingress.kubernetes.io/limit-connections": "10",
        "nginx.ingress.kubernetes.io/limit-burst-multiplier": "3",
    }


def test_local_rate_limit() -> None:
    assert local_rate_limit(7, "Minute") == {
        "type": "Local",
        "local": {"rules": [{"limit": {"requests": 7, "unit": "Minute"}}]},
    }
    with pytest.raises(ActuatorError, match="unit"):
        local_rate_limit(7, "Week")
    with pytest.raises(ActuatorError):
        local_rate_limit(0, "Second")
