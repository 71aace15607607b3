"""Ray Serve: lower a deployment's ``max_ongoing_requests`` live, through the Serve REST API.

The step (runbook action ``lower_batch_ceiling``) caps how many requests each replica of a
deployment holds at once. ``max_ongoing_requests`` is a lightweight config update: Serve applies
it to the running replicas without restarting them.

Calls, on the dashboard port (8265 by default):

- ``GET /api/serve/applications/``: ``applications.<app>.deployed_app_config`` is the config
  as deployed (only the options it sets), ``status`` the application's state; retried;
- ``PUT /api/serve/applications/`` with the full multi-application config: every
  application's ``deployed_app_config`` (an application left out would be deleted) with the
  deployment's ``max_ongoing_requests`` changed, plus ``proxy_location``, ``http_options``,
  ``grpc_options`` and ``target_capacity`` as read; declarative, so retried.

Apply then waits (``deploy_timeout_s``) while the application is ``DEPLOYING``; a
``DEPLOY_FAILED`` fails the step and the previous config is put back. Applications deployed
with ``serve.run`` have no ``deployed_app_config`` and cannot be changed this way (reason
``not_declarative``). The target's content is ``{"max_ongoing_requests": N}``, null when the
config leaves it to the code's value; a revert puts the previous config back (and drops a
deployment entry the apply added). ``verify`` also checks the live
``deployment_config.max_ongoing_requests``. Sources:
https://docs.ray.io/en/latest/serve/api/index.html#serve-rest-api
https://docs.ray.io/en/latest/serve/advanced-guides/inplace-updates.html (lightweight updates)
https://docs.ray.io/en/latest/serve/configure-serve-deployment.html (``max_ongoing_requests``)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from detector.actuators.base import ActuatorError, Plan, Reason
from detector.actuators.http import (
    AdminApi,
    HttpActuator,
    expect_dict,
    parse_json,
    render_json,
)

PATH = "/api/serve/applications/"
TOP_LEVEL = ("proxy_location", "http_options", "grpc_options", "target_capacity")
WAITING = frozenset({"DEPLOYING", "NOT_STARTED"})
FIELD = "max_ongoing_requests"
_POLL_S = 0.1


def _invalid(detail: str) -> ActuatorError:
    return ActuatorError(Reason.INVALID_REQUEST, detail)


def app_details(details: Mapping[str, Any], app: str) -> dict[str, Any]:
    """Return one application's details from ``GET /api/serve/applications/``.

    Raises ActuatorError (``not_found``) when the application is not deployed.
    """
    apps = details.get("applications")
    if not isinstance(apps, dict) or not isinstance(apps.get(app), dict):
        names = sorted(apps) if isinstance(apps, dict) else []
        raise ActuatorError(
            Reason.NOT_FOUND, f"Serve application {app!r} not deployed (has {names})"
        )
    return apps[app]


def app_config(details: Mapping[str, Any], app: str) -> dict[str, Any]:
    """Return the application's ``deployed_app_config``; ActuatorError(``not_declarative``)."""
    config = app_details(details, app).get("deployed_app_config")
    if not isinstance(config, dict):
        raise ActuatorError(
            Reason.NOT_DECLARATIVE,
            f"Serve application {app!r} has no deployed_app_config (deployed with serve.run): "
            "the REST API cannot change it without replacing it",
        )
    return config


def deployment_view(details: Mapping[str, Any], app: str, deployment: str) -> dict[str, Any]:
    """Return ``{"max_ongoing_requests": N or None}`` as the app's config sets it."""
    for entry in app_config(details, app).get("deployments") or []:
        if isinstance(entry, dict) and entry.get("name") == deployment:
            return {FIELD: entry.get(FIELD)}
    return {FIELD: None}


def with_deployment(
    config: Mapping[str, Any], deployment: str, value: int | None
) -> dict[str, Any]:
    """Return the app config with the deployment's ``max_ongoing_requests`` set (None: unset).

    An entry is added when the deployment has none; the deployment's entry is dropped when
    nothing but its name is left (the same config for Serve). Other entries stay as they are.
    """
    result = copy.deepcopy(dict(config))
    entries = [e for e in result.get("deployments") or [] if isinstance(e, dict)]
    entry = next((e for e in entries if e.get("name") == deployment), None)
    if entry is None:
        entry = {"name": deployment}
        entries.append(entry)
    if value is None:
        entry.pop(FIELD, None)
    else:
        entry[FIELD] = value
    if set(entry) == {"name"}:
        entries.remove(entry)
    result["deployments"] = entries
    return result


def put_body(details: Mapping[str, Any], app: str, new_config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the PUT body: every application's deployed config, ``app``'s replaced.

    Raises ActuatorError(``not_declarative``) when any application lacks a deployed config:
    a PUT without it would delete that application.
    """
    apps = details.get("applications") or {}
    configs = [dict(new_config) if name == app else app_config(details, name) for name in apps]
    body: dict[str, Any] = {k: details[k] for k in TOP_LEVEL if details.get(k) is not None}
    body["applications"] = configs
    return body


class RayServeOngoingRequests(HttpActuator):
    """Set one Serve deployment's ``max_ongoing_requests`` through the REST API.

    ``deploy_timeout_s``: how long apply waits while the application deploys. Source:
    https://docs.ray.io/en/latest/serve/api/index.html#serve-rest-api
    """

    action: ClassVar[str] = "lower_batch_ceiling"

    def __init__(
        self,
        api: AdminApi,
        app: str,
        deployment: str,
        *,
        deploy_timeout_s: float = 60.0,
        settle_s: float = 5.0,
    ) -> None:
        super().__init__(settle_s=settle_s)
        if not app or not deployment:
            raise _invalid("RayServeOngoingRequests needs an application and a deployment")
        self.api = api
        self.http = self.connect(api)
        self.app = app
        self.deployment = deployment
        self.deploy_timeout_s = deploy_timeout_s
        self.name = f"applications/{app}/deployments/{deployment}"

    @property
    def target(self) -> str:
        """Return ``rayserve:<dashboard URL>``."""
        return f"rayserve:{self.api.base_url}"

    def plan(self, max_ongoing_requests: int) -> Plan:
        """Return the plan that sets ``max_ongoing_requests`` (>= 1) on the deployment."""
        if isinstance(max_ongoing_requests, bool) or not isinstance(max_ongoing_requests, int):
            raise _invalid(f"max_ongoing_requests must be an int, got {max_ongoing_requests!r}")
        if max_ongoing_requests < 1:
            raise _invalid(f"max_ongoing_requests must be >= 1, got {max_ongoing_requests}")
        summary = f"{self.app}/{self.deployment} max_ongoing_requests {max_ongoing_requests}"
        text = render_json({FIELD: max_ongoing_requests})
        return self.plan_contents({self.name: text}, summary)

    def fetch(self, target: str) -> dict[str, Any]:
        """Return the Serve details (GET /api/serve/applications/)."""
        if target != self.name:
            raise _invalid(f"{target} is not the deployment of {self.target}")
        details = self.http.call("GET", PATH, what="Serve applications", idempotent=True)
        return expect_dict(details, f"GET {PATH}")

    def render(self, target: str, state: Any) -> str | None:
        """Return the deployment's configured ``max_ongoing_requests`` as JSON text."""
        return render_json(deployment_view(state, self.app, self.deployment))

    def send(self, target: str, state: Any, content: str | None) -> None:
        """PUT the full config with the deployment's value changed (declarative: retried)."""
        view = parse_json(content, f"content of {target}")
        if not isinstance(view, dict):
            raise _invalid(f"content of {target} must be a JSON object")
        config = with_deployment(app_config(state, self.app), self.deployment, view.get(FIELD))
        body = put_body(state, self.app, config)
        what = f"Serve config with {self.app}/{self.deployment} {FIELD}={view.get(FIELD)}"
        self.http.call("PUT", PATH, what=what, idempotent=True, body=body)

    def activate(self) -> None:
        """Wait while the application deploys; ActuatorError(``deploy_failed``, ``timeout``)."""
        deadline = time.monotonic() + self.deploy_timeout_s
        while True:
            details = app_details(self.fetch(self.name), self.app)
            status = details.get("status")
            if status == "DEPLOY_FAILED":
                message = str(details.get("message") or "")[:300]
                raise ActuatorError(
                    Reason.DEPLOY_FAILED, f"Serve application {self.app!r} DEPLOY_FAILED: {message}"
                )
            if status not in WAITING:
                return
            if time.monotonic() >= deadline:
                raise ActuatorError(
                    Reason.TIMEOUT,
                    f"Serve application {self.app!r} still {status} after "
                    f"{self.deploy_timeout_s:g} s",
                )
            time.sleep(_POLL_S)

    def check_live(self) -> None:
        """Check the live ``deployment_config`` has the configured value (when one is set)."""
        details = self.fetch(self.name)
        wanted = deployment_view(details, self.app, self.deployment)[FIELD]
        deployments = app_details(details, self.app).get("deployments") or {}
        live = (deployments.get(self.deployment) or {}).get("deployment_config") or {}
        if wanted is not None and live.get(FIELD) != wanted:
            raise ActuatorError(
                Reason.DRIFT,
                f"{self.app}/{self.deployment} runs with {FIELD}={live.get(FIELD)}, "
                f"configured {wanted}",
            )
