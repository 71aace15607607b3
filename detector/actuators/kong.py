"""Kong gateway rate limit: the ``rate-limiting`` plugin of a service or route, via the Admin API.

The step (runbook action ``enable_rate_limit``) sheds load with fast rejections at the gateway.
Kong answers requests over the limit with the plugin's ``error_code``, 429 unless the plugin
was configured otherwise (the plan summary says which), and the body ``error_message`` ("API
rate limit exceeded").

Each scope (``services/<name or id>`` or ``routes/<name or id>``) is one target: the plugin's
``enabled``, ``config.second``, ``config.minute``, ``config.policy`` and ``config.limit_by``
as JSON, or absent. Calls (paths relative to ``AdminApi.base_url``; a workspace goes in it):

- ``GET /{scope}/plugins`` (following ``next``): the plugin named ``rate-limiting`` that is not
  tied to a consumer or consumer group; retried;
- ``POST /{scope}/plugins`` ``{"name": "rate-limiting", "enabled": true, "config": {...}}`` to
  create it (201); sent once, a duplicate answers 409;
- ``PATCH /plugins/{id}`` ``{"enabled": ..., "config": {...}}`` to change it; absolute values
  (``null`` clears a field), so retried;
- ``DELETE /plugins/{id}`` (204) when a revert removes the plugin the apply created; retried.

Revert restores the fields read before the apply, or deletes a plugin that did not exist.
A DB-less Kong answers 405 to every write (reason ``read_only``): change its declarative
config instead. With ``policy: local`` each Kong node counts on its own: the limit is per
node, so a workload's rate is divided by the number of nodes (``containment.kong.nodes``).
Sources: https://docs.konghq.com/hub/kong-inc/rate-limiting/ (configuration, ``error_code``,
ordering of the windows), https://docs.konghq.com/gateway/latest/admin-api/ (plugins:
add, list, update, delete; pagination; errors).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal
from urllib.parse import quote

from detector.actuators.base import ActuatorError, Change, Plan, Reason
from detector.actuators.http import (
    AdminApi,
    HttpActuator,
    HttpCallError,
    expect_dict,
    parse_json,
    render_json,
)

PLUGIN = "rate-limiting"
POLICIES = ("local", "cluster", "redis")
LIMIT_BY = ("consumer", "credential", "ip", "service", "header", "path", "consumer-group")
DEFAULT_ERROR_CODE = 429
_MAX_PAGES = 50


def _invalid(detail: str) -> ActuatorError:
    return ActuatorError(Reason.INVALID_REQUEST, detail)


@dataclass(frozen=True, slots=True)
class KongScope:
    """Where the plugin applies: a Kong service or route, by name or id."""

    kind: Literal["services", "routes"]
    name: str

    def __post_init__(self) -> None:
        if self.kind not in ("services", "routes") or not self.name:
            raise _invalid(f"a Kong scope is services/<name> or routes/<name>, got {self!r}")

    @property
    def path(self) -> str:
        """Return ``/services/<name>`` or ``/routes/<name>`` (the name URL-quoted)."""
        return f"/{self.kind}/{quote(self.name, safe='')}"

    @property
    def label(self) -> str:
        """Return ``services/<name>`` or ``routes/<name>`` for messages."""
        return f"{self.kind}/{self.name}"

    @property
    def target(self) -> str:
        """Return the plan target: ``services/<name>/plugins/rate-limiting``."""
        return f"{self.kind}/{self.name}/plugins/{PLUGIN}"


@dataclass(frozen=True, slots=True)
class KongLimit:
    """The limit to put in force: requests per ``second`` and/or ``minute`` (>= 1).

    ``policy``: where counters live (``local``: in each node's memory); ``limit_by``: what a
    counter counts (``service``: every client together, the workload's total). Kong requires
    ``minute >= second`` when both are set. Raises ActuatorError(``invalid_request``).
    """

    second: int | None
    minute: int | None = None
    policy: str = "local"
    limit_by: str = "service"

    def __post_init__(self) -> None:
        for name, value in (("second", self.second), ("minute", self.minute)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise _invalid(f"{name} must be an int, got {value!r}")
            if value is not None and value < 1:
                raise _invalid(f"{name} must be at least 1, got {value}")
        if self.second is None and self.minute is None:
            raise _invalid("a Kong limit needs second or minute")
        if self.second is not None and self.minute is not None and self.minute < self.second:
            raise _invalid(f"minute ({self.minute}) must not be lower than second ({self.second})")
        if self.policy not in POLICIES:
            raise _invalid(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.limit_by not in LIMIT_BY:
            raise _invalid(f"limit_by must be one of {LIMIT_BY}, got {self.limit_by!r}")

    def view(self) -> dict[str, Any]:
        """Return the managed fields of a plugin with this limit in force."""
        return {
            "enabled": True,
            "config": {
                "second": self.second,
                "minute": self.minute,
                "policy": self.policy,
                "limit_by": self.limit_by,
            },
        }

    def describe(self) -> str:
        """Return a one-line summary, e.g. ``rate-limiting 5/s by service (policy local)``."""
        windows = [f"{n}/{w}" for n, w in ((self.second, "s"), (self.minute, "min")) if n]
        return f"{PLUGIN} {' '.join(windows)} by {self.limit_by} (policy {self.policy})"


def find_plugin(plugins: Iterable[Any]) -> dict[str, Any] | None:
    """Return the scope's own ``rate-limiting`` plugin: not tied to a consumer (group)."""
    for plugin in plugins:
        if (
            isinstance(plugin, dict)
            and plugin.get("name") == PLUGIN
            and not plugin.get("consumer")
            and not plugin.get("consumer_group")
        ):
            return plugin
    return None


def plugin_view(plugin: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Return the managed fields of a plugin object (None for no plugin)."""
    if plugin is None:
        return None
    config = plugin.get("config") or {}
    return {
        "enabled": bool(plugin.get("enabled", True)),
        "config": {key: config.get(key) for key in ("second", "minute", "policy", "limit_by")},
    }


def create_body(view: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``POST /{scope}/plugins`` body: name, enabled and the set config fields."""
    config = {k: v for k, v in view["config"].items() if v is not None}
    return {"name": PLUGIN, "enabled": view["enabled"], "config": config}


def patch_body(view: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``PATCH /plugins/{id}`` body: every managed field, ``null`` clearing one."""
    return {"enabled": view["enabled"], "config": dict(view["config"])}


class KongRateLimiter(HttpActuator):
    """Enable, change or revert Kong's ``rate-limiting`` plugin on one or more scopes.

    ``settle_s``: how long an in-doubt write is read back. Source:
    https://docs.konghq.com/gateway/latest/admin-api/ (plugin objects, errors).
    """

    action: ClassVar[str] = "enable_rate_limit"

    def __init__(
        self, api: AdminApi, scopes: Sequence[KongScope], *, settle_s: float = 5.0
    ) -> None:
        super().__init__(settle_s=settle_s)
        if not scopes:
            raise _invalid("KongRateLimiter needs at least one scope")
        self.api = api
        self.http = self.connect(api)
        self.scopes = {scope.target: scope for scope in scopes}

    @property
    def target(self) -> str:
        """Return ``kong:<admin base URL>``."""
        return f"kong:{self.api.base_url}"

    def plan(self, limit: KongLimit) -> Plan:
        """Return the plan that puts ``limit`` on every scope; the summary names the status.

        Raises ActuatorError (an HttpCallError code) when a scope cannot be read.
        """
        changes, codes = [], set()
        for name in self.scopes:
            plugin = self.fetch(name)
            code = (plugin or {}).get("config", {}).get("error_code") or DEFAULT_ERROR_CODE
            codes.add(code)
            changes.append(Change(name, self.render(name, plugin), render_json(limit.view())))
        answer = ", ".join(str(c) for c in sorted(codes))
        summary = f"{limit.describe()}; over the limit Kong answers HTTP {answer} (error_code)"
        return Plan(self.action, self.target, tuple(changes), summary)

    def _scope(self, target: str) -> KongScope:
        try:
            return self.scopes[target]
        except KeyError:
            raise _invalid(f"{target} is not a scope of {self.target}") from None

    def fetch(self, target: str) -> dict[str, Any] | None:
        """Return the scope's ``rate-limiting`` plugin object, or None (GET, following next)."""
        scope = self._scope(target)
        path: str | None = f"{scope.path}/plugins"
        for _ in range(_MAX_PAGES):
            if path is None:
                return None
            page = expect_dict(
                self.http.call("GET", path, what=f"plugins of {scope.label}", idempotent=True),
                f"GET {path}",
            )
            found = find_plugin(page.get("data") or [])
            if found is not None:
                return found
            path = page.get("next") or None
        raise ActuatorError(
            Reason.BAD_RESPONSE, f"{scope.label}: over {_MAX_PAGES} pages of plugins"
        )

    def render(self, target: str, state: Any) -> str | None:
        """Return the plugin's managed fields as JSON text (None when there is no plugin)."""
        return render_json(plugin_view(state))

    def send(self, target: str, state: Any, content: str | None) -> None:
        """Create (POST), change (PATCH) or delete (DELETE) the scope's plugin."""
        scope = self._scope(target)
        what = f"{PLUGIN} plugin on {scope.label}"
        view = parse_json(content, f"content of {target}")
        try:
            if view is None:
                if state is not None:
                    self.http.call("DELETE", f"/plugins/{state['id']}", what=what, idempotent=True)
            elif state is None:
                body = create_body(view)
                self.http.call(
                    "POST", f"{scope.path}/plugins", what=what, idempotent=False, body=body
                )
            else:
                body = patch_body(view)
                self.http.call(
                    "PATCH", f"/plugins/{state['id']}", what=what, idempotent=True, body=body
                )
        except HttpCallError as exc:
            if exc.status == 405:
                raise HttpCallError(
                    Reason.READ_ONLY,
                    f"{exc.detail} (a DB-less Kong's Admin API is read-only: change its "
                    "declarative configuration instead)",
                    status=exc.status,
                    message=exc.message,
                ) from exc
            raise
