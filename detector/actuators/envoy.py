"""Envoy local rate limit switched on at runtime, through each Envoy's admin interface.

The step (runbook action ``enable_rate_limit``) turns on an HTTP local rate limit the operator
has configured in advance. The filter ``envoy.filters.http.local_ratelimit`` answers requests
over its token bucket with 429 (its ``status``) when it is *enabled* and *enforced* for a
request; both fractions come from runtime keys the filter config names, defaulting to 0% "for
safety":

    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
      stat_prefix: detector_llm
      token_bucket: {max_tokens: 40, tokens_per_fill: 40, fill_interval: 1s}
      filter_enabled:  {runtime_key: local_rate_limit_enabled,  default_value: {numerator: 0}}
      filter_enforced: {runtime_key: local_rate_limit_enforced, default_value: {numerator: 0}}

The token bucket itself has no runtime key: it comes with the filter config (bootstrap or
xDS), so size it for containment up front; this actuator only switches the fractions. An
integer runtime value is a percentage (``100``: every request). Envoy needs an admin layer in
``layered_runtime`` (``- name: admin, admin_layer: {}``) to accept runtime changes; without
one it answers 503 "No admin layer specified" (reason ``no_admin_layer``). Admin overrides
live in memory: a restarted Envoy is back to its configured defaults. The bucket is per Envoy
process, so N replicas let through N times its rate; each replica's admin endpoint is one
target.

Calls per endpoint: ``GET /runtime`` (JSON ``{"layers": [names], "entries": {key:
{"final_value", "layer_values": [one per layer]}}}``; retried) and ``POST
/runtime_modify?key=value&...`` (body ``OK``), which sets absolute values and so is retried;
an empty value removes the admin override. The target's content is the admin layer's value of
each managed key (null: no override), so a revert restores earlier overrides and removes the
ones the apply added. Sources:
https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/local_rate_limit_filter
https://www.envoyproxy.io/docs/envoy/latest/operations/admin (``/runtime``, ``/runtime_modify``)
https://www.envoyproxy.io/docs/envoy/latest/configuration/operations/runtime (layering)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from detector.actuators.base import ActuatorError, Plan, Reason
from detector.actuators.http import (
    AdminApi,
    HttpActuator,
    HttpApi,
    HttpCallError,
    expect_dict,
    parse_json,
    render_json,
)

_KEY = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
NO_ADMIN_LAYER = "No admin layer specified"


def _invalid(detail: str) -> ActuatorError:
    return ActuatorError(Reason.INVALID_REQUEST, detail)


@dataclass(frozen=True, slots=True)
class EnvoyRuntimeKeys:
    """The runtime keys the filter config names in ``filter_enabled`` / ``filter_enforced``."""

    enabled: str = "local_rate_limit_enabled"
    enforced: str = "local_rate_limit_enforced"

    def __post_init__(self) -> None:
        for key in (self.enabled, self.enforced):
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                raise _invalid(f"runtime key {key!r} does not match {_KEY.pattern}")
        if self.enabled == self.enforced:
            raise _invalid("filter_enabled and filter_enforced need different runtime keys")


@dataclass(frozen=True, slots=True)
class EnvoyRateLimit:
    """Percent of requests the filter is enabled for and enforces (0-100; 100 and 100: all).

    Enabled but not enforced counts without rejecting (shadow mode). ``aggregate_per_min`` is
    the aggregate limit the containment asks for (requests per minute for all clients; None:
    not said) and ``replicas`` the Envoys that each count alone (None: the endpoints the
    actuator drives): the summary says what each replica's pre-configured token bucket may let
    through at most, since this actuator cannot set it. Raises
    ActuatorError(``invalid_request``).
    """

    enabled_percent: int = 100
    enforced_percent: int = 100
    aggregate_per_min: int | None = None
    replicas: int | None = None

    def __post_init__(self) -> None:
        for name, value in (
            ("enabled_percent", self.enabled_percent),
            ("enforced_percent", self.enforced_percent),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
                raise _invalid(f"{name} must be an int in 0-100, got {value!r}")
        for name, number in (
            ("aggregate_per_min", self.aggregate_per_min or 1),
            ("replicas", self.replicas or 1),
        ):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise _invalid(f"{name} must be an int >= 1, got {number!r}")

    @property
    def per_replica_per_min(self) -> int | None:
        """Return the requests per minute each replica's bucket may let through, or None."""
        if self.aggregate_per_min is None:
            return None
        return max(1, self.aggregate_per_min // (self.replicas or 1))

    def describe(self) -> str:
        """Return a one-line summary, e.g. ``local rate limit enabled 100% enforced 100%``."""
        text = (
            f"local rate limit enabled {self.enabled_percent}% "
            f"enforced {self.enforced_percent}% -> 429 over the token bucket"
        )
        share = self.per_replica_per_min
        if share is None:
            return text
        return (
            f"{text}; the aggregate limit {self.aggregate_per_min}/min needs each of "
            f"{self.replicas or 1} Envoy replica(s) to let through at most {share}/min (the token "
            "bucket of the filter config, per replica: this step does not set it)"
        )


def admin_values(runtime: Mapping[str, Any], keys: Sequence[str], layer: str) -> dict[str, Any]:
    """Return ``{key: value in the admin layer, or None}`` from a ``GET /runtime`` answer.

    Raises ActuatorError(``no_admin_layer``) when ``layer`` is not among ``layers``, and
    (``bad_response``) when the answer has not the documented shape.
    """
    layers = runtime.get("layers")
    entries = runtime.get("entries")
    if not isinstance(layers, list) or not isinstance(entries, dict):
        raise ActuatorError(
            Reason.BAD_RESPONSE, "GET /runtime has no layers list or entries object"
        )
    if layer not in layers:
        raise ActuatorError(
            Reason.NO_ADMIN_LAYER,
            f"GET /runtime lists layers {layers}, no admin layer named {layer!r} "
            "(layered_runtime needs an admin_layer to accept runtime_modify)",
        )
    index = layers.index(layer)
    values: dict[str, Any] = {}
    for key in keys:
        entry = entries.get(key) or {}
        layer_values = entry.get("layer_values") or []
        value = layer_values[index] if index < len(layer_values) else ""
        values[key] = value if isinstance(value, str) and value != "" else None
    return values


def modify_params(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, str]:
    """Return the ``runtime_modify`` query: each key whose value changes ("" removes it)."""
    return {
        key: "" if value is None else str(value)
        for key, value in desired.items()
        if current.get(key) != value
    }


class EnvoyLocalRateLimiter(HttpActuator):
    """Switch a pre-configured Envoy local rate limit on or off on every listed Envoy.

    ``admin_layer``: the name of the runtime's admin layer in ``GET /runtime``. Source:
    https://www.envoyproxy.io/docs/envoy/latest/operations/admin#post--runtime_modify
    """

    action: ClassVar[str] = "enable_rate_limit"

    def __init__(
        self,
        admins: Sequence[AdminApi],
        *,
        keys: EnvoyRuntimeKeys | None = None,
        admin_layer: str = "admin",
        settle_s: float = 2.0,
    ) -> None:
        super().__init__(settle_s=settle_s)
        if not admins:
            raise _invalid("EnvoyLocalRateLimiter needs at least one admin endpoint")
        self.keys = keys or EnvoyRuntimeKeys()
        self.admin_layer = admin_layer
        self.endpoints = {f"{api.name}/runtime": self.connect(api) for api in admins}

    @property
    def target(self) -> str:
        """Return ``envoy:<first admin endpoint>`` and how many there are."""
        first = next(iter(self.endpoints)).removesuffix("/runtime")
        more = f" (+{len(self.endpoints) - 1} more)" if len(self.endpoints) > 1 else ""
        return f"envoy:{first}{more}"

    def _managed(self) -> tuple[str, str]:
        return (self.keys.enabled, self.keys.enforced)

    def plan(self, limit: EnvoyRateLimit) -> Plan:
        """Return the plan that sets both runtime keys on every Envoy (GET /runtime each).

        The summary divides ``limit.aggregate_per_min`` among ``limit.replicas``, by default
        the Envoys listed here (each counts alone).
        """
        if limit.replicas is None:
            limit = replace(limit, replicas=len(self.endpoints))
        desired = {
            self.keys.enabled: str(limit.enabled_percent),
            self.keys.enforced: str(limit.enforced_percent),
        }
        text = render_json(desired)
        return self.plan_contents(dict.fromkeys(self.endpoints, text), limit.describe())

    def plan_lift(self) -> Plan:
        """Return the plan that removes both admin overrides: the config's defaults again."""
        text = render_json(dict.fromkeys(self._managed()))
        return self.plan_contents(dict.fromkeys(self.endpoints, text), "no admin overrides")

    def _http(self, target: str) -> HttpApi:
        try:
            return self.endpoints[target]
        except KeyError:
            raise _invalid(f"{target} is not an admin endpoint of {self.target}") from None

    def fetch(self, target: str) -> dict[str, Any]:
        """Return the admin layer's values of the managed keys (GET /runtime)."""
        http = self._http(target)
        runtime = http.call("GET", "/runtime", what="Envoy runtime", idempotent=True)
        return admin_values(
            expect_dict(runtime, f"GET {target}"), self._managed(), self.admin_layer
        )

    def render(self, target: str, state: Any) -> str | None:
        """Return the admin-layer values as JSON text."""
        return render_json(state)

    def send(self, target: str, state: Any, content: str | None) -> None:
        """POST /runtime_modify with every key that changes (absolute values: retried)."""
        desired = parse_json(content, f"content of {target}")
        if not isinstance(desired, dict):
            raise _invalid(f"content of {target} must be a JSON object of runtime keys")
        params = modify_params(state, desired)
        if not params:
            return
        what = f"runtime keys {', '.join(sorted(params))}"
        try:
            self._http(target).call(
                "POST", "/runtime_modify", what=what, idempotent=True, params=params
            )
        except HttpCallError as exc:
            if NO_ADMIN_LAYER in exc.message:
                raise HttpCallError(
                    Reason.NO_ADMIN_LAYER, exc.detail, status=exc.status, message=exc.message
                ) from exc
            raise
