"""HTTP-admin actuators (Kong, Envoy, Triton, Ray Serve) at the request level.

Each fake is a stdlib ThreadingHTTPServer on a free loopback port. It answers like the real API
for exactly the paths the actuator uses (shapes from the docs each actuator module cites: Kong
Admin API plugin objects and error bodies, Envoy's ``/runtime`` JSON and ``runtime_modify``
text answers, Triton's model config and ``{"error": ...}`` bodies, Ray Serve's
``ServeInstanceDetails``) and records every request: method, path, query and JSON body.

Faults are scripted per (method, path): an error answer that changes nothing, or a sleep past
the client timeout, after which the request is applied (a slow server) or not.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from detector.actuators.base import ActuatorError, Operation, Plan, Status
from detector.actuators.envoy import EnvoyLocalRateLimiter, EnvoyRateLimit
from detector.actuators.http import AdminApi, HttpActuator
from detector.actuators.kong import KongLimit, KongRateLimiter, KongScope
from detector.actuators.rayserve import RayServeOngoingRequests
from detector.actuators.triton import QueuePolicy, TritonBatchCeiling, TritonBatching

TIMEOUT_S = 0.3  # client timeout per attempt
SLOW_S = 0.7  # a slow server answers after this, past the client timeout
SETTLE_S = 2.0  # actuators read an in-doubt write back this long

Answer = tuple[int, Any]
Api = Callable[[str, str, dict[str, list[str]], Any], Answer]


@dataclass(frozen=True)
class Call:
    """One recorded request."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class Fault:
    """A scripted answer for (method, path regex): ``status`` (not applied) after ``sleep_s``.

    With ``status`` None the request is applied after the sleep (a slow server).
    """

    method: str
    path: str
    status: int | None = None
    body: Any = None
    sleep_s: float = 0.0
    times: int = 1


class FakeServer:
    """A loopback HTTP server that routes to ``api``, records requests and plays faults."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def admin(self) -> AdminApi:
        return AdminApi(self.url, timeout_s=TIMEOUT_S, retries=1, backoff_s=0.01)

    def fail(self, method: str, path: str, status: int | None = None, **kw: Any) -> None:
        self.faults.append(Fault(method, path, status, **kw))

    def mutations(self) -> list[Call]:
        return [c for c in self.calls if c.method != "GET"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method == method and re.fullmatch(fault.path, path) and fault.times:
                    fault.times -= 1
                    return fault
        return None

    def _answer(self, method: str, raw_path: str, raw: bytes) -> Answer:
        split = urlsplit(raw_path)
        body = json.loads(raw) if raw else None
        query = parse_qs(split.query, keep_blank_values=True)
        with self.lock:
            self.calls.append(Call(method, split.path, query, body))
        fault = self._fault(method, split.path)
        if fault is not None:
            time.sleep(fault.sleep_s)
            if fault.status is not None:
                return fault.status, fault.body
        with self.lock:
            return self.api(method, split.path, query, body)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, payload = server._answer(self.command, self.path, self.rfile.read(length))
                text = payload if isinstance(payload, str) else json.dumps(payload)
                data = b"" if payload is None else text.encode()
                kind = "text/plain" if isinstance(payload, str) else "application/json"
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler


NOT_FOUND: Answer = (404, {"message": "Not found"})


class KongFake:
    """Kong Admin API: services/routes by name, their plugins, plugins by id."""

    DEFAULTS: dict[str, Any] = {
        **dict.fromkeys(("second", "minute", "hour", "day", "month", "year")),
        "limit_by": "consumer",
        "policy": "local",
        "fault_tolerant": True,
        "hide_client_headers": False,
        "error_code": 429,
        "error_message": "API rate limit exceeded",
        "header_name": None,
        "path": None,
        "sync_rate": -1,
    }

    def __init__(self) -> None:
        self.scopes = {("services", "llm"): "5b1b2b52-svc", ("routes", "chat"): "9a0c7f11-route"}
        self.plugins: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)

    def snapshot(self) -> Any:
        return self.plugins

    def add(self, kind: str, name: str, **config: Any) -> dict[str, Any]:
        plugin = self._new(kind, self.scopes[(kind, name)], {"config": config})
        self.plugins[plugin["id"]] = plugin
        return plugin

    def _new(self, kind: str, scope_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": f"plugin-{next(self.ids)}",
            "name": "rate-limiting",
            "created_at": 1700000000,
            "route": {"id": scope_id} if kind == "routes" else None,
            "service": {"id": scope_id} if kind == "services" else None,
            "consumer": None,
            "instance_name": None,
            "protocols": ["grpc", "grpcs", "http", "https"],
            "enabled": body.get("enabled", True),
            "tags": None,
            "config": {**self.DEFAULTS, **body.get("config", {})},
        }

    @staticmethod
    def _invalid(config: dict[str, Any]) -> Answer | None:
        second, minute = config.get("second"), config.get("minute")
        if second is None and minute is None:
            message = "schema violation (config: at least one of these fields must be non-empty)"
            return 400, {"code": 2, "name": "schema violation", "message": message}
        if second is not None and minute is not None and minute < second:
            message = f"schema violation (config.minute: cannot be lower than {second})"
            return 400, {"code": 2, "name": "schema violation", "message": message}
        return None

    def __call__(self, method: str, path: str, query: Any, body: Any) -> Answer:
        match = re.fullmatch(r"/(services|routes)/([^/]+)/plugins", path)
        if match:
            kind, name = match.groups()
            scope_id = self.scopes.get((kind, name))
            if scope_id is None:
                return NOT_FOUND
            mine = [p for p in self.plugins.values() if (p[kind[:-1]] or {}).get("id") == scope_id]
            if method == "GET":
                return 200, {"data": mine, "next": None}
            if any(p["name"] == body["name"] for p in mine):
                message = f"UNIQUE violation detected on '{{name=\"rate-limiting\",{kind[:-1]}}}'"
                return 409, {"code": 5, "name": "unique constraint violation", "message": message}
            plugin = self._new(kind, scope_id, body)
            if (error := self._invalid(plugin["config"])) is not None:
                return error
            self.plugins[plugin["id"]] = plugin
            return 201, plugin
        match = re.fullmatch(r"/plugins/([^/]+)", path)
        if not match or match.group(1) not in self.plugins:
            return NOT_FOUND
        plugin_id = match.group(1)
        if method == "DELETE":
            del self.plugins[plugin_id]
            return 204, None
        plugin = copy.deepcopy(self.plugins[plugin_id])
        plugin["config"].update(body.get("config", {}))
        plugin["enabled"] = body.get("enabled", plugin["enabled"])
        if (error := self._invalid(plugin["config"])) is not None:
            return error
        self.plugins[plugin_id] = plugin
        return 200, plugin


class EnvoyFake:
    """Envoy admin: GET /runtime and POST /runtime_modify over a static and an admin layer."""

    def __init__(self, static: dict[str, str], admin: dict[str, str] | None = None) -> None:
        self.layers = {"static_layer": dict(static), "admin": dict(admin or {})}

    def snapshot(self) -> Any:
        return self.layers

    def __call__(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Answer:
        if path == "/runtime" and method == "GET":
            keys = sorted(set().union(*self.layers.values()))
            entries = {}
            for key in keys:
                values = [layer.get(key, "") for layer in self.layers.values()]
                final = next((v for v in reversed(values) if v), "")
                entries[key] = {"final_value": final, "layer_values": values}
            return 200, {"layers": list(self.layers), "entries": entries}
        if path == "/runtime_modify" and method == "POST":
            if not query:
                return 400, "usage: /runtime_modify?key1=value1&key2=value2&keyN=valueN\n"
            admin = self.layers["admin"]
            for key, (value, *_) in query.items():
                if value:
                    admin[key] = value
                else:
                    admin.pop(key, None)
            return 200, "OK\n"
        return 404, "invalid path. admin commands are:\n"


TRITON_CONFIG: dict[str, Any] = {
    "name": "llm",
    "platform": "",
    "backend": "python",
    "max_batch_size": 32,
    "input": [{"name": "INPUT_IDS", "data_type": "TYPE_INT32", "dims": [-1]}],
    "output": [{"name": "OUTPUT_IDS", "data_type": "TYPE_INT32", "dims": [-1]}],
    "dynamic_batching": {
        "preferred_batch_size": [16, 32],
        "max_queue_delay_microseconds": 5000,
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "priority_queue_policy": {},
    },
    "instance_group": [{"name": "llm_0", "kind": "KIND_GPU", "count": 1, "gpus": [0]}],
    "parameters": {},
}


class TritonFake:
    """Triton HTTP: model config and ready, and the repository load with a config override."""

    def __init__(self, explicit: bool = True) -> None:
        self.explicit = explicit
        self.configs = {"llm": copy.deepcopy(TRITON_CONFIG)}

    def snapshot(self) -> Any:
        return self.configs

    def __call__(self, method: str, path: str, query: Any, body: Any) -> Answer:
        match = re.fullmatch(r"/v2/models/([^/]+)/(config|ready)", path)
        if match and method == "GET":
            name, what = match.groups()
            if name not in self.configs:
                return 400, {"error": f"Request for unknown model: '{name}' is not found"}
            return (200, self.configs[name]) if what == "config" else (200, None)
        match = re.fullmatch(r"/v2/repository/models/([^/]+)/load", path)
        if match and method == "POST":
            if not self.explicit:
                error = "explicit model load / unload is not allowed if polling is enabled"
                return 503, {"error": error}
            config = json.loads(body["parameters"]["config"])
            sizes = config.get("dynamic_batching", {}).get("preferred_batch_size", [])
            if any(size > config["max_batch_size"] for size in sizes):
                error = f"failed to load '{match.group(1)}': preferred batch size too large"
                return 400, {"error": error}
            self.configs[match.group(1)] = config
            return 200, None
        return 404, {"error": "Not Found"}


def serve_app(name: str, deployments: list[dict[str, Any]]) -> dict[str, Any]:
    """Return Serve details of a RUNNING declarative application."""
    config = {"name": name, "route_prefix": f"/{name}", "import_path": f"{name}:app"}
    return {
        "name": name,
        "route_prefix": f"/{name}",
        "status": "RUNNING",
        "message": "",
        "deployed_app_config": {**config, "deployments": deployments},
        "source": "declarative",
        "deployments": {},
    }


class RayFake:
    """Ray Serve REST API: GET and PUT /api/serve/applications/ (declarative)."""

    def __init__(self) -> None:
        self.details: dict[str, Any] = {
            "controller_info": {"actor_name": "SERVE_CONTROLLER_ACTOR"},
            "proxy_location": "EveryNode",
            "http_options": {"host": "0.0.0.0", "port": 8000, "root_path": ""},
            "grpc_options": {"port": 9000, "grpc_servicer_functions": []},
            "applications": {
                "llm": serve_app("llm", [{"name": "LLMServer", "num_replicas": 4}]),
                "embed": serve_app("embed", [{"name": "Embedder"}]),
            },
            "target_capacity": None,
        }
        self.outcomes: list[str] = []  # status after each PUT, then RUNNING
        self.deploying_polls = 2  # GETs that still report DEPLOYING after a PUT
        self.outcome = "RUNNING"
        self.pending = 0
        self._refresh()

    def snapshot(self) -> Any:
        apps = self.details["applications"]
        return {name: app["deployed_app_config"] for name, app in apps.items()}

    def _refresh(self) -> None:
        for app in self.details["applications"].values():
            for entry in (app["deployed_app_config"] or {}).get("deployments", []):
                live = {"name": entry["name"], "max_ongoing_requests": 5, **entry}
                app["deployments"][entry["name"]] = {"status": "HEALTHY", "deployment_config": live}

    def __call__(self, method: str, path: str, query: Any, body: Any) -> Answer:
        if path != "/api/serve/applications/":
            return 404, "Not Found"
        if method == "PUT":
            apps = {}
            for config in body["applications"]:
                app = serve_app(config["name"], [])
                app.update(status="DEPLOYING", deployed_app_config=config)
                apps[config["name"]] = app
            self.details["applications"] = apps
            self.pending = self.deploying_polls
            self.outcome = self.outcomes.pop(0) if self.outcomes else "RUNNING"
            self._refresh()
            return 200, None
        if self.pending > 0:
            self.pending -= 1
        else:
            for app in self.details["applications"].values():
                if app["status"] == "DEPLOYING":
                    app["status"] = self.outcome
                    app["message"] = "replica crashed" if self.outcome != "RUNNING" else ""
        return 200, self.details


@dataclass
class Case:
    """One actuator wired to its fake servers, and what its tests need to know."""

    name: str
    fakes: list[Any]
    servers: list[FakeServer]
    actuator: HttpActuator
    plan: Callable[[], Plan]
    mutation: tuple[str, str]  # method and path regex of the apply's mutating call
    what: str  # the object the failure message must name

    def state(self) -> str:
        return json.dumps([f.snapshot() for f in self.fakes], sort_keys=True)

    def mutations(self) -> list[Call]:
        return [c for s in self.servers for c in s.mutations()]

    def close(self) -> None:
        self.actuator.close()
        for server in self.servers:
            server.close()


# Per actuator: the apply's mutating call (method, path regex) and the object its errors name.
SPECS = {
    "kong": (("POST", r"/services/llm/plugins"), "rate-limiting plugin on services/llm"),
    "envoy": (
        ("POST", r"/runtime_modify"),
        "runtime keys local_rate_limit_enabled, local_rate_limit_enforced",
    ),
    "triton": (("POST", r"/v2/repository/models/llm/load"), "load of model llm"),
    "rayserve": (
        ("PUT", r"/api/serve/applications/"),
        "Serve config with llm/LLMServer max_ongoing_requests=2",
    ),
}


def make_case(name: str, count: int = 1) -> Case:
    fakes: list[Any]
    actuator: Any
    if name == "kong":
        fakes = [KongFake()]
        server = FakeServer(fakes[0])
        servers = [server]
        scopes = [KongScope("services", "llm"), KongScope("routes", "chat")][:count]
        actuator = KongRateLimiter(server.admin(), scopes, settle_s=SETTLE_S)
        limit = KongLimit(second=40)
        plan = partial(actuator.plan, limit)
    elif name == "envoy":
        fakes = [EnvoyFake({"local_rate_limit_enabled": "0"}) for _ in range(count)]
        servers = [FakeServer(f) for f in fakes]
        actuator = EnvoyLocalRateLimiter([s.admin() for s in servers], settle_s=SETTLE_S)
        plan = partial(actuator.plan, EnvoyRateLimit())
    elif name == "triton":
        fakes = [TritonFake() for _ in range(count)]
        servers = [FakeServer(f) for f in fakes]
        actuator = TritonBatchCeiling([s.admin() for s in servers], "llm", settle_s=SETTLE_S)
        actuator.load_timeout_s = TIMEOUT_S
        policy = QueuePolicy(max_queue_size=64)
        batching = TritonBatching(8, max_queue_delay_microseconds=1000, default_queue_policy=policy)
        plan = partial(actuator.plan, batching)
    else:
        fakes = [RayFake()]
        servers = [FakeServer(fakes[0])]
        actuator = RayServeOngoingRequests(
            servers[0].admin(), "llm", "LLMServer", settle_s=SETTLE_S
        )
        actuator.deploy_timeout_s = 5.0
        plan = partial(actuator.plan, 2)
    return Case(name, fakes, servers, actuator, plan, *SPECS[name])


NAMES = ["kong", "envoy", "triton", "rayserve"]


@pytest.fixture(params=NAMES)
def case(request: pytest.FixtureRequest) -> Iterator[Case]:
    built = make_case(request.param)
    yield built
    built.close()


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[Case]:
    built = make_case(request.param, count=2)
    yield built
    built.close()


REASONS = {400: "bad_request", 403: "forbidden", 404: "not_found", 409: "conflict"}


def test_dry_run_makes_no_mutating_call(case: Case) -> None:
    before = case.state()
    plan = case.plan()
    result = case.actuator.apply(plan)
    assert (result.status, result.operation) == (Status.DRY_RUN, Operation.APPLY)
    assert result.diff == plan.diff != ""
    assert case.mutations() == [] and case.state() == before
    assert case.actuator.revert(plan).status is Status.UNCHANGED


def test_apply_reapply_verify_and_revert(case: Case) -> None:
    before = case.state()
    plan = case.plan()
    applied = case.actuator.apply(plan, dry_run=False)
    assert applied.status is Status.OK, applied.message()
    assert len(case.mutations()) == 1 and case.state() != before
    assert case.actuator.verify(plan).status is Status.OK

    again = case.actuator.apply(plan, dry_run=False)
    assert (again.status, again.diff) == (Status.UNCHANGED, "")
    assert len(case.mutations()) == 1  # nothing sent
    assert case.plan().is_empty

    reverted = case.actuator.revert(plan, dry_run=False)
    assert (reverted.status, reverted.operation) == (Status.OK, Operation.REVERT)
    assert case.state() == before and len(case.mutations()) == 2
    assert case.actuator.revert(plan, dry_run=False).status is Status.UNCHANGED
    assert case.actuator.verify(plan).reason == "drift"


@pytest.mark.parametrize("status", sorted(REASONS))
def test_refused_mutation_fails_clearly_and_changes_nothing(case: Case, status: int) -> None:
    before = case.state()
    method, path = case.mutation
    case.servers[0].fail(method, path, status, body={"message": f"refused ({status})"})
    result = case.actuator.apply(case.plan(), dry_run=False)
    assert result.status is Status.FAILED and result.restored
    assert result.reason == REASONS[status]
    assert case.what in result.error and f"answered {status}: refused ({status})" in result.error
    assert "previous state restored" in result.message()
    assert case.state() == before
    assert [c.method for c in case.mutations()] == [method]  # sent once, nothing to undo


def test_read_timeout_fails_before_any_change(case: Case) -> None:
    plan = case.plan()
    case.servers[0].fail("GET", r".*", sleep_s=SLOW_S, times=2)  # both attempts
    result = case.actuator.apply(plan, dry_run=False)
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "timeout", True)
    assert f"GET {case.servers[0].url}" in result.error
    assert "got no answer within 0.3 s (2 attempts)" in result.error
    assert case.mutations() == []


def test_mutation_timeout_that_lands_late_is_undone(case: Case) -> None:
    before = case.state()
    method, path = case.mutation
    case.servers[0].fail(method, path, sleep_s=SLOW_S)  # applied after the client gave up
    result = case.actuator.apply(case.plan(), dry_run=False)
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "timeout", True)
    assert case.what in result.error and "landed late and was undone" in result.error
    assert case.state() == before
    undo = "DELETE" if case.name == "kong" else method
    assert [c.method for c in case.mutations()] == [method, undo]  # never resent


def test_mutation_timeout_that_never_lands_leaves_the_old_state(case: Case) -> None:
    before = case.state()
    case.actuator.settle_s = 0.5
    method, path = case.mutation
    case.servers[0].fail(method, path, 504, sleep_s=SLOW_S)  # not applied
    result = case.actuator.apply(case.plan(), dry_run=False)
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "timeout", True)
    assert "read back for 0.5 s: not applied" in result.error
    assert case.state() == before and len(case.mutations()) == 1


def test_unreadable_after_an_in_doubt_write_is_not_restored() -> None:
    case = make_case("kong")
    server = case.servers[0]
    case.actuator.settle_s = 0.1
    server.fail("GET", r".*", times=3)  # the reads of plan, apply and write pass
    server.fail("GET", r".*", sleep_s=SLOW_S, times=10)  # read-backs time out
    server.fail("POST", r"/services/llm/plugins", sleep_s=SLOW_S)
    plan = Plan(case.actuator.action, case.actuator.target, case.plan().changes)
    try:
        result = case.actuator.apply(plan, dry_run=False)
    finally:
        server.close()
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "timeout", False)
    assert "could not be read after an in-doubt write" in result.error
    assert "previous state NOT restored" in result.message()


@pytest.mark.parametrize("pair", ["kong", "envoy", "triton"], indirect=True)
def test_second_target_refused_undoes_the_first(pair: Case) -> None:
    before = pair.state()
    if pair.name == "kong":
        pair.servers[0].fail("POST", r"/routes/chat/plugins", 403, body={"message": "Forbidden"})
    else:
        method, path = pair.mutation
        error = {"error": "failed to load 'llm': CUDA out of memory"}
        pair.servers[1].fail(method, path, 400 if pair.name == "triton" else 403, body=error)
    result = pair.actuator.apply(pair.plan(), dry_run=False)
    assert result.status is Status.FAILED and result.restored
    assert "previous content restored" in result.error
    assert pair.state() == before
    if pair.name == "kong":
        calls = [(c.method, c.path) for c in pair.mutations()]
        assert calls == [
            ("POST", "/services/llm/plugins"),
            ("POST", "/routes/chat/plugins"),
            ("DELETE", "/plugins/plugin-1"),
        ]
    else:
        first, second = (len(s.mutations()) for s in pair.servers)
        assert (first, second) == (2, 1)  # set and put back; refused


def test_kong_creates_the_plugin_and_revert_deletes_it() -> None:
    case = make_case("kong")
    try:
        plan = case.plan()
        assert "over the limit Kong answers HTTP 429 (error_code)" in plan.summary
        assert case.actuator.apply(plan, dry_run=False).ok
        assert case.actuator.revert(plan, dry_run=False).ok
    finally:
        case.servers[0].close()
    calls = case.servers[0].calls
    assert [(c.method, c.path) for c in calls] == [
        ("GET", "/services/llm/plugins"),  # plan
        ("GET", "/services/llm/plugins"),  # apply: pending
        ("GET", "/services/llm/plugins"),  # apply: write
        ("POST", "/services/llm/plugins"),
        ("GET", "/services/llm/plugins"),  # revert: pending
        ("GET", "/services/llm/plugins"),  # revert: write
        ("DELETE", "/plugins/plugin-1"),
    ]
    assert calls[3].body == {
        "name": "rate-limiting",
        "enabled": True,
        "config": {"second": 40, "policy": "local", "limit_by": "service"},
    }


def test_kong_patches_an_existing_plugin_and_revert_restores_it() -> None:
    case = make_case("kong")
    kong = case.fakes[0]
    plugin = kong.add("services", "llm", minute=600, policy="cluster", error_code=503)
    plugin["enabled"] = False
    original = copy.deepcopy(plugin)
    try:
        plan = case.plan()
        assert "Kong answers HTTP 503" in plan.summary
        assert case.actuator.apply(plan, dry_run=False).ok
        assert kong.plugins["plugin-1"]["config"]["error_code"] == 503  # not ours: untouched
        assert case.actuator.revert(plan, dry_run=False).ok
    finally:
        case.servers[0].close()
    patches = [c for c in case.mutations()]
    assert [(c.method, c.path) for c in patches] == [("PATCH", "/plugins/plugin-1")] * 2
    assert patches[0].body == {
        "enabled": True,
        "config": {"second": 40, "minute": None, "policy": "local", "limit_by": "service"},
    }
    assert patches[1].body == {
        "enabled": False,
        "config": {"second": None, "minute": 600, "policy": "cluster", "limit_by": "consumer"},
    }
    assert kong.plugins["plugin-1"] == original


def test_kong_db_less_is_read_only() -> None:
    case = make_case("kong")
    message = "cannot create 'plugins' entities when not using a database"
    case.servers[0].fail("POST", r"/services/llm/plugins", 405, body={"message": message})
    try:
        result = case.actuator.apply(case.plan(), dry_run=False)
    finally:
        case.servers[0].close()
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "read_only", True)
    assert message in result.error and "declarative configuration" in result.error


def test_envoy_sets_both_keys_and_revert_keeps_an_earlier_override() -> None:
    envoy = EnvoyFake({"local_rate_limit_enabled": "0"}, {"local_rate_limit_enforced": "50"})
    server = FakeServer(envoy)
    actuator = EnvoyLocalRateLimiter([server.admin()])
    try:
        plan = actuator.plan(EnvoyRateLimit())
        assert actuator.apply(plan, dry_run=False).ok
        assert envoy.layers["admin"] == {
            "local_rate_limit_enabled": "100",
            "local_rate_limit_enforced": "100",
        }
        assert actuator.revert(plan, dry_run=False).ok
    finally:
        server.close()
    assert [(c.method, c.path, c.query) for c in server.mutations()] == [
        (
            "POST",
            "/runtime_modify",
            {"local_rate_limit_enabled": ["100"], "local_rate_limit_enforced": ["100"]},
        ),
        (
            "POST",
            "/runtime_modify",
            {"local_rate_limit_enabled": [""], "local_rate_limit_enforced": ["50"]},
        ),
    ]
    assert envoy.layers == {
        "static_layer": {"local_rate_limit_enabled": "0"},
        "admin": {"local_rate_limit_enforced": "50"},
    }


def test_envoy_plan_divides_the_aggregate_among_the_replicas_it_drives() -> None:
    envoys = [EnvoyFake({"local_rate_limit_enabled": "0"}) for _ in range(2)]
    servers = [FakeServer(envoy) for envoy in envoys]
    actuator = EnvoyLocalRateLimiter([server.admin() for server in servers])
    try:
        plan = actuator.plan(EnvoyRateLimit(aggregate_per_min=48))
        assert actuator.apply(plan, dry_run=False).ok
    finally:
        for server in servers:
            server.close()
    assert "the aggregate limit 48/min needs each of 2 Envoy replica(s)" in plan.summary
    assert "at most 24/min" in plan.summary  # each Envoy counts alone
    assert all(e.layers["admin"]["local_rate_limit_enforced"] == "100" for e in envoys)


def test_kong_plugin_by_service_carries_the_aggregate_budget() -> None:
    kong = KongFake()
    server = FakeServer(kong)
    actuator = KongRateLimiter(server.admin(), [KongScope("services", "llm")])
    try:
        plan = actuator.plan(KongLimit(second=1, minute=48))
        assert actuator.apply(plan, dry_run=False).ok
    finally:
        server.close()
    (create,) = server.mutations()
    assert create.body["config"] == {
        "second": 1,
        "minute": 48,
        "policy": "local",
        "limit_by": "service",
    }  # every client of the service together: 0.8/s over a minute
    assert "rate-limiting 1/s 48/min by service" in plan.summary


def test_envoy_without_an_admin_layer_is_a_clear_failure() -> None:
    envoy = EnvoyFake({})
    server = FakeServer(envoy)
    actuator = EnvoyLocalRateLimiter([server.admin()])
    server.fail("POST", r"/runtime_modify", 503, body="No admin layer specified")
    try:
        result = actuator.apply(actuator.plan(EnvoyRateLimit()), dry_run=False)
        del envoy.layers["admin"]
        with pytest.raises(ActuatorError) as raised:
            actuator.plan(EnvoyRateLimit())
    finally:
        server.close()
    assert (result.status, result.reason, result.restored) == (
        Status.FAILED,
        "no_admin_layer",
        True,
    )
    assert "answered 503: No admin layer specified" in result.error
    assert len(server.mutations()) == 1  # a 503 is not retried
    assert raised.value.reason == "no_admin_layer"


def test_triton_loads_the_merged_config_and_revert_loads_the_previous_one() -> None:
    case = make_case("triton")
    try:
        plan = case.plan()
        assert case.actuator.apply(plan, dry_run=False).ok
        assert case.actuator.verify(plan).ok
        assert case.actuator.revert(plan, dry_run=False).ok
    finally:
        case.servers[0].close()
    loads = case.mutations()
    assert [c.path for c in loads] == ["/v2/repository/models/llm/load"] * 2
    assert all(
        set(c.body) == {"parameters"} and set(c.body["parameters"]) == {"config"} for c in loads
    )
    expected = copy.deepcopy(TRITON_CONFIG)
    expected["max_batch_size"] = 8
    expected["dynamic_batching"].update(
        preferred_batch_size=[],  # 16 and 32 are over the new max_batch_size
        max_queue_delay_microseconds=1000,
        default_queue_policy={
            "max_queue_size": 64,
            "timeout_action": "REJECT",
            "default_timeout_microseconds": 0,
            "allow_timeout_override": False,
        },
    )
    assert json.loads(loads[0].body["parameters"]["config"]) == expected
    assert json.loads(loads[1].body["parameters"]["config"]) == TRITON_CONFIG
    assert ("GET", "/v2/models/llm/ready") in [(c.method, c.path) for c in case.servers[0].calls]


def test_triton_needs_explicit_model_control() -> None:
    case = make_case("triton")
    case.fakes[0].explicit = False
    try:
        result = case.actuator.apply(case.plan(), dry_run=False)
    finally:
        case.servers[0].close()
    assert (result.status, result.restored) == (Status.FAILED, True)
    assert result.reason == "explicit_mode_required"
    assert "--model-control-mode=explicit" in result.error and "load of model llm" in result.error
    assert len(case.mutations()) == 1


def test_rayserve_puts_the_full_config_and_revert_puts_the_previous_one() -> None:
    case = make_case("rayserve")
    ray = case.fakes[0]
    original = copy.deepcopy(ray.snapshot())
    try:
        plan = case.plan()
        assert case.actuator.apply(plan, dry_run=False).ok
        assert ray.details["applications"]["llm"]["status"] == "RUNNING"  # waited for it
        assert case.actuator.revert(plan, dry_run=False).ok
    finally:
        case.servers[0].close()
    puts = case.mutations()
    top = {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": 8000, "root_path": ""},
        "grpc_options": {"port": 9000, "grpc_servicer_functions": []},
    }
    llm = copy.deepcopy(original["llm"])
    llm["deployments"] = [{"name": "LLMServer", "num_replicas": 4, "max_ongoing_requests": 2}]
    assert puts[0].body == {**top, "applications": [llm, original["embed"]]}
    assert puts[1].body == {**top, "applications": [original["llm"], original["embed"]]}


def test_rayserve_deploy_failure_puts_the_previous_config_back() -> None:
    case = make_case("rayserve")
    ray = case.fakes[0]
    ray.outcomes = ["DEPLOY_FAILED"]
    before = case.state()
    try:
        result = case.actuator.apply(case.plan(), dry_run=False)
    finally:
        case.servers[0].close()
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "deploy_failed", True)
    assert "Serve application 'llm' DEPLOY_FAILED: replica crashed" in result.error
    assert case.state() == before and [c.method for c in case.mutations()] == ["PUT", "PUT"]
    assert ray.details["applications"]["llm"]["status"] == "RUNNING"


def test_rayserve_refuses_an_application_deployed_with_serve_run() -> None:
    case = make_case("rayserve")
    case.fakes[0].details["applications"]["embed"]["deployed_app_config"] = None
    try:
        result = case.actuator.apply(case.plan(), dry_run=False)
    finally:
        case.servers[0].close()
    assert (result.status, result.reason, result.restored) == (
        Status.FAILED,
        "not_declarative",
        True,
    )
    assert "'embed'" in result.error and case.mutations() == []
