"""Gateway rate limits as Kubernetes objects: ingress-nginx annotations, Envoy Gateway policy.

``IngressNginxRateLimit`` (runbook action ``enable_rate_limit``) patches the rate-limit
annotations of one or more Ingresses served by ingress-nginx: ``limit-rps`` (requests per
second), ``limit-connections`` (concurrent connections) and ``limit-burst-multiplier`` (burst =
rps x multiplier, default 5). Both limits count per client IP, in each controller replica,
so N clients get N x limit-rps in all (the binding adds what the step says they bound to the
summary). Requests over them get ``limit-req-status-code`` / ``limit-conn-status-code`` from
the controller ConfigMap, 503 unless set to ``"429"``: the plan reads that ConfigMap and says
so in its summary (the result's note), since a 503 looks like the cascade to clients and
retries.
Source: https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/annotations/#rate-limiting
, https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/configmap/ .

``IngressNginxAdmission`` (``quarantine_requests``) sets ``proxy-body-size`` on the same
Ingresses: ingress-nginx renders it as nginx's ``client_max_body_size`` in their locations, so
a request with a larger body is answered 413 before it is proxied; revert restores the value
the Ingress had (none: the controller's ConfigMap ``proxy-body-size``, 1m by default). Source:
https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/annotations/ ("Custom
max body size").

``EnvoyGatewayRateLimit`` (``enable_rate_limit``) puts a local rate limit (answers 429) on a
route through an Envoy Gateway ``BackendTrafficPolicy`` (gateway.envoyproxy.io/v1alpha1): it
creates the policy, or changes ``spec.rateLimit`` of an existing one of that name; revert
deletes a policy it created, or restores the old ``spec.rateLimit``. A local limit counts in
each Envoy replica and for each route: the aggregate a route gets is the limit x the replicas
(a global limit, through a rate limit service, is one count for all). Source:
https://gateway.envoyproxy.io/docs/tasks/traffic/local-rate-limit/ ,
https://gateway.envoyproxy.io/docs/api/extension_types/#backendtrafficpolicy .
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from detector.actuators.base import ActuatorError, Change, Plan, Reason
from detector.actuators.kubernetes.actuator import (
    DEFAULT_CONTROLLER_CONFIGMAP,
    KubernetesActuator,
    resource_version,
)
from detector.actuators.kubernetes.api import (
    BACKEND_TRAFFIC_POLICIES,
    CONFIGMAPS,
    INGRESSES,
    ApiRequest,
    KubeApi,
    ObjectRef,
    Verb,
)
from detector.actuators.kubernetes.patch import (
    annotation_fields,
    annotations_patch,
    deep_merge,
    merge_diff,
    nested,
    render_fields,
)
from detector.actuators.nginx.config import AdmissionRule

PREFIX = "nginx.ingress.kubernetes.io/"
LIMIT_RPS = PREFIX + "limit-rps"
LIMIT_CONNECTIONS = PREFIX + "limit-connections"
LIMIT_BURST_MULTIPLIER = PREFIX + "limit-burst-multiplier"
ANNOTATIONS = (LIMIT_RPS, LIMIT_CONNECTIONS, LIMIT_BURST_MULTIPLIER)
PROXY_BODY_SIZE = PREFIX + "proxy-body-size"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-oom-cascade-detector"}
RATE_LIMIT_UNITS = ("Second", "Minute", "Hour", "Day")
_POLICY_FIELDS = ("spec.targetRefs", "spec.rateLimit")


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"{name} must be a whole number >= 1, got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class IngressRateLimit:
    """ingress-nginx limits per client IP; None leaves that annotation as it is."""

    rps: int | None = None
    connections: int | None = None
    burst_multiplier: int | None = None

    def __post_init__(self) -> None:
        for name in ("rps", "connections", "burst_multiplier"):
            _positive(name, getattr(self, name))
        if self.rps is None and self.connections is None:
            raise ActuatorError(Reason.INVALID_REQUEST, "set rps, connections or both")

    def annotations(self) -> dict[str, str]:
        """Return the annotations to set (values are strings, as annotations must be)."""
        values = {
            LIMIT_RPS: self.rps,
            LIMIT_CONNECTIONS: self.connections,
            LIMIT_BURST_MULTIPLIER: self.burst_multiplier,
        }
        return {key: str(value) for key, value in values.items() if value is not None}


def status_code_note(
    data: Mapping[str, Any] | None, limit: IngressRateLimit, configmap: str, error: str = ""
) -> str:
    """Return what ingress-nginx answers over the limit when that is not 429 ("" when it is).

    ``data`` is the controller ConfigMap's ``data`` (None: not readable, ``error`` says why).
    """
    if data is None:
        return (
            f"could not read ConfigMap {configmap} ({error}): over-limit requests get 503 unless "
            'it sets limit-req-status-code / limit-conn-status-code to "429"'
        )
    notes = []
    checks = (("limit-req-status-code", limit.rps), ("limit-conn-status-code", limit.connections))
    for key, value in checks:
        code = data.get(key)
        if value is not None and code != "429":
            now = f"{key}={code}" if code is not None else f"no {key} (default 503)"
            notes.append(now)
    if not notes:
        return ""
    return (
        f"ingress-nginx answers over-limit requests with 503, not 429: ConfigMap {configmap} "
        f'has {", ".join(notes)}; set it to "429"'
    )


class IngressNginxRateLimit(KubernetesActuator):
    """Set ingress-nginx rate-limit annotations on Ingresses; note a 503 status code."""

    action: ClassVar[str] = "enable_rate_limit"
    annotations: ClassVar[tuple[str, ...]] = ANNOTATIONS  # the ones it sets and restores

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        ingresses: Sequence[str],
        *,
        controller_configmap: tuple[str, str] = DEFAULT_CONTROLLER_CONFIGMAP,
    ) -> None:
        if not ingresses or len(set(ingresses)) != len(ingresses):
            raise ActuatorError(Reason.INVALID_REQUEST, "name one or more distinct Ingresses")
        super().__init__(api)
        self.namespace = namespace
        self.ingresses = tuple(ingresses)
        self.configmap = ObjectRef(CONFIGMAPS, *controller_configmap)

    @property
    def target(self) -> str:
        """Return ``kubernetes:ingresses.networking.k8s.io/NAMESPACE/NAME[,NAME...]``."""
        return f"kubernetes:{INGRESSES.label}/{self.namespace}/{','.join(self.ingresses)}"

    def plan(self, limit: IngressRateLimit) -> Plan:
        """Return the plan that sets ``limit`` on every Ingress, in the order given.

        The summary says when the controller answers 503 instead of 429. Raises
        ActuatorError (``not_found``, the API's errors); a ConfigMap that cannot be read
        only makes a note.
        """
        changes = []
        with self._mutex:
            for name in self.ingresses:
                target = f"{INGRESSES.label}/{self.namespace}/{name}"
                before = self.read(target)
                obj = self._objects[target] or {}
                desired = {**self._fields(target, obj), **_keyed(limit.annotations())}
                changes.append(Change(target, before, render_fields(desired)))
            note = self._status_note(limit)
        values = ", ".join(f"{k.removeprefix(PREFIX)}={v}" for k, v in limit.annotations().items())
        summary = f"{values} (per client IP, per controller replica)"
        return Plan(
            self.action, self.target, tuple(changes), f"{summary}; {note}" if note else summary
        )

    def _status_note(self, limit: IngressRateLimit) -> str:
        label = f"{self.configmap.namespace}/{self.configmap.name}"
        try:
            configmap = self.api.get(self.configmap)
        except ActuatorError as exc:
            return status_code_note(None, limit, label, exc.reason)
        if configmap is None:
            return status_code_note(None, limit, label, "not found")
        return status_code_note(configmap.get("data") or {}, limit, label)

    def _ref(self, target: str) -> ObjectRef:
        kind, namespace, name = [*target.split("/"), "", ""][:3]
        if kind != INGRESSES.label or namespace != self.namespace or name not in self.ingresses:
            raise ActuatorError(
                Reason.INVALID_REQUEST, f"{target} is not an Ingress of {self.target}"
            )
        return ObjectRef(INGRESSES, namespace, name)

    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        return annotation_fields(obj, "metadata.annotations", self.annotations)

    def _request(
        self, target: str, obj: dict[str, Any] | None, desired: dict[str, Any] | None
    ) -> ApiRequest | None:
        ref = self._ref(target)
        if obj is None or desired is None:
            raise ActuatorError(Reason.NOT_FOUND, f"{ref.label} does not exist")
        body = annotations_patch(self._fields(target, obj), desired)
        if not body:
            return None
        body = deep_merge(body, {"metadata": {"resourceVersion": resource_version(obj, ref)}})
        return ApiRequest(Verb.PATCH, ref, body)


class IngressNginxAdmission(IngressNginxRateLimit):
    """Refuse requests over a body size with 413 on Ingresses (``proxy-body-size``)."""

    action: ClassVar[str] = "quarantine_requests"
    annotations: ClassVar[tuple[str, ...]] = (PROXY_BODY_SIZE,)

    def plan(self, rule: AdmissionRule) -> Plan:  # type: ignore[override]
        """Return the plan that sets ``proxy-body-size`` to the rule's size on every Ingress.

        Raises ActuatorError (``not_found``, the API's errors).
        """
        changes = []
        with self._mutex:
            for name in self.ingresses:
                target = f"{INGRESSES.label}/{self.namespace}/{name}"
                before = self.read(target)
                desired = _keyed({PROXY_BODY_SIZE: rule.size})
                changes.append(Change(target, before, render_fields(desired)))
        summary = f"proxy-body-size {rule.size}: larger requests get 413 (ingress-nginx)"
        return Plan(self.action, self.target, tuple(changes), summary)


def _keyed(annotations: Mapping[str, str]) -> dict[str, str]:
    return {f"metadata.annotations[{k}]": v for k, v in annotations.items()}


def local_rate_limit(requests: int, unit: str) -> dict[str, Any]:
    """Return a ``spec.rateLimit`` of type Local: ``requests`` per ``unit`` for all clients."""
    _positive("requests", requests)
    if unit not in RATE_LIMIT_UNITS:
        raise ActuatorError(Reason.INVALID_REQUEST, f"unit must be one of {RATE_LIMIT_UNITS}")
    rule = {"limit": {"requests": requests, "unit": unit}}
    return {"type": "Local", "local": {"rules": [rule]}}


class EnvoyGatewayRateLimit(KubernetesActuator):
    """Put a local rate limit on a route with an Envoy Gateway BackendTrafficPolicy.

    ``route`` is the HTTPRoute (or ``route_kind``) in ``namespace``; ``policy`` names the
    policy (default ``ROUTE-detector-rate-limit``).
    """

    action: ClassVar[str] = "enable_rate_limit"
    absent_ok: ClassVar[bool] = True

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        route: str,
        *,
        route_kind: str = "HTTPRoute",
        policy: str | None = None,
    ) -> None:
        super().__init__(api)
        self.namespace = namespace
        self.route = route
        self.route_kind = route_kind
        self.policy = ObjectRef(
            BACKEND_TRAFFIC_POLICIES, namespace, policy or f"{route}-detector-rate-limit"
        )
        self._target = f"{BACKEND_TRAFFIC_POLICIES.label}/{namespace}/{self.policy.name}"

    @property
    def target(self) -> str:
        """Return ``kubernetes:backendtrafficpolicies.gateway.envoyproxy.io/NAMESPACE/NAME``."""
        return f"kubernetes:{self._target}"

    def plan(self, requests: int, unit: str = "Second", *, replicas: int = 1) -> Plan:
        """Return the plan that limits the route to ``requests`` per ``unit`` (429 beyond).

        The limit counts in each Envoy replica: the summary says what ``replicas`` of them let
        through in all. Raises ActuatorError (``invalid_request``; the API's errors).
        """
        rate_limit = local_rate_limit(requests, unit)
        with self._mutex:
            self.read(self._target)
            obj = self._objects[self._target]
            desired = self._fields(self._target, obj) if obj is not None else {}
            if obj is None:
                ref = {
                    "group": "gateway.networking.k8s.io",
                    "kind": self.route_kind,
                    "name": self.route,
                }
                desired["spec.targetRefs"] = [ref]
            desired["spec.rateLimit"] = rate_limit
            how = "new policy" if obj is None else "existing policy"
            total = (
                f"; x {replicas} Envoy replicas = {requests * replicas} per {unit} in all"
                if replicas > 1
                else ""
            )
            summary = (
                f"local rate limit {requests} per {unit} on {self.route_kind} {self.route} "
                f"({how} {self.policy.name}; per Envoy replica and route{total}; 429 beyond)"
            )
            return self._plan(self._target, desired, summary)

    def _ref(self, target: str) -> ObjectRef:
        if target != self._target:
            raise ActuatorError(Reason.INVALID_REQUEST, f"{target} is not {self._target}")
        return self.policy

    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        spec = obj.get("spec") or {}
        return {f"spec.{k}": spec[k] for k in ("targetRefs", "rateLimit") if k in spec}

    def _request(
        self, target: str, obj: dict[str, Any] | None, desired: dict[str, Any] | None
    ) -> ApiRequest | None:
        ref = self._ref(target)
        if obj is None and desired is None:
            return None
        if obj is None:
            spec: dict[str, Any] = {}
            for key, value in (desired or {}).items():
                spec = deep_merge(spec, nested(key, value))
            kind = {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy"}
            meta = {"name": ref.name, "namespace": ref.namespace, "labels": dict(MANAGED_BY)}
            return ApiRequest(Verb.CREATE, ref, {**kind, "metadata": meta, **spec})
        version = resource_version(obj, ref)
        if desired is None:
            uid = (obj.get("metadata") or {}).get("uid")
            preconditions = {"uid": uid, "resourceVersion": version}
            return ApiRequest(Verb.DELETE, ref, {"preconditions": preconditions})
        current = self._fields(target, obj)
        body: dict[str, Any] = {}
        for key in _POLICY_FIELDS:
            if current.get(key) != desired.get(key):
                change = merge_diff(current.get(key), desired.get(key))
                body = deep_merge(body, nested(key, change))
        if not body:
            return None
        return ApiRequest(
            Verb.PATCH, ref, deep_merge(body, {"metadata": {"resourceVersion": version}})
        )

    def check_live(self) -> None:
        """Fail (``not_accepted``) when a gateway reports the policy not Accepted."""
        obj = self._objects.get(self._target) or {}
        for ancestor in (obj.get("status") or {}).get("ancestors") or []:
            for condition in ancestor.get("conditions") or []:
                if condition.get("type") == "Accepted" and condition.get("status") == "False":
                    raise ActuatorError(
                        Reason.NOT_ACCEPTED,
                        f"{self.policy.label}: {condition.get('reason')}: "
                        f"{condition.get('message')}",
                    )
