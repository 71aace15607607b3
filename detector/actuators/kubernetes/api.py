"""The Kubernetes API calls the actuators make, through the official ``kubernetes`` client.

One adapter (``KubeApi``) does every call: a GET of one object, and the four writes (strategic
merge or JSON merge PATCH, create, delete, pod eviction), each optionally as a server-side
dry run (``dryRun=All``). Every call has a timeout (the client's ``_request_timeout``), asks
for the raw JSON (``_preload_content=False``, so objects stay exactly as the API server sent
them) and turns every failure into an ``ActuatorError`` whose message names the call and the
object (``patch deployments.apps inference/llama``).

A write is described before it is sent (``ApiRequest``: verb, object, body), so a dry run can
record the exact request and the integration tests can compare it with what the server got.

Content types are the client's defaults, the same from client 29 to 37: a dict body PATCHed to
a built-in object goes as ``application/strategic-merge-patch+json``, to a custom object as
``application/merge-patch+json``; creates and deletes as JSON.

Reason codes (``ActuatorError.reason``), as in ``detector.actuators.http``: ``unreachable``,
``timeout``, ``bad_request`` (400, 422), ``forbidden`` (401, 403), ``not_found``, ``conflict``
(409: the object changed since it was read, or already exists), ``throttled`` (429),
``server_error`` (5xx), ``http_error`` (other), ``bad_response``; ``connection_lost`` (the
connection broke after the request was sent: like ``timeout``, the write may have landed);
and ``pdb_blocked`` (an eviction refused by a PodDisruptionBudget, 429 with a
``DisruptionBudget`` cause).

Build the client with ``Configuration.retries = 0``: urllib3 otherwise re-sends a GET or a
DELETE three times after a read timeout.

Sources: https://kubernetes.io/docs/reference/using-api/api-concepts/ (patch types, dry run,
resourceVersion), https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/
(429 from a PodDisruptionBudget), https://github.com/kubernetes-client/python.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from detector.actuators.base import ActuatorError, Reason

log = logging.getLogger(__name__)

FIELD_MANAGER = "gpu-oom-cascade-detector"
_MESSAGE_CHARS = 400
_PDB_NAME = re.compile(r"disruption budget (\S+)")
_REASONS = {
    400: Reason.BAD_REQUEST,
    401: Reason.FORBIDDEN,
    403: Reason.FORBIDDEN,
    404: Reason.NOT_FOUND,
    409: Reason.CONFLICT,
    422: Reason.BAD_REQUEST,
    429: Reason.THROTTLED,
}
IN_DOUBT = frozenset({Reason.TIMEOUT, Reason.CONNECTION_LOST})
"""Reasons after which a write may or may not have been applied."""
SMP = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Kind:
    """One API resource: group ("" for core), version, plural; custom when a CRD."""

    group: str
    version: str
    plural: str
    custom: bool = False

    @property
    def label(self) -> str:
        """Return ``plural.group`` (``deployments.apps``; ``pods`` for the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str, name: str | None = None) -> str:
        """Return the REST path of the collection, or of one object when ``name`` is given."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{prefix}/namespaces/{namespace}/{self.plural}"
        return f"{path}/{name}" if name else path


DEPLOYMENTS = Kind("apps", "v1", "deployments")
STATEFULSETS = Kind("apps", "v1", "statefulsets")
ROLLOUTS = Kind("argoproj.io", "v1alpha1", "rollouts", True)
"""Argo Rollouts: https://argoproj.github.io/argo-rollouts/features/specification/"""
LEADERWORKERSETS = Kind("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", True)
"""LeaderWorkerSet: https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/"""
PODS = Kind("", "v1", "pods")
CONFIGMAPS = Kind("", "v1", "configmaps")
INGRESSES = Kind("networking.k8s.io", "v1", "ingresses")
BACKEND_TRAFFIC_POLICIES = Kind("gateway.envoyproxy.io", "v1alpha1", "backendtrafficpolicies", True)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One namespaced object: its kind, namespace and name."""

    kind: Kind
    namespace: str
    name: str

    @property
    def label(self) -> str:
        """Return ``deployments.apps inference/llama``: how messages name the object."""
        return f"{self.kind.label} {self.namespace}/{self.name}"

    @property
    def path(self) -> str:
        """Return the object's REST path."""
        return self.kind.path(self.namespace, self.name)


class Verb(StrEnum):
    """What a call does; the RBAC verb is the value (eviction: ``create`` on a subresource)."""

    GET = "get"
    PATCH = "patch"
    CREATE = "create"
    DELETE = "delete"
    EVICT = "evict"


@dataclass(frozen=True, slots=True)
class Permission:
    """One RBAC grant a call needs: API group, resource (``pods/eviction``) and verb."""

    api_group: str
    resource: str
    verb: str


def permission(kind: Kind, verb: Verb) -> Permission:
    """Return the RBAC grant that ``verb`` on ``kind`` needs (a dry run needs the same)."""
    if verb is Verb.EVICT:
        return Permission(kind.group, f"{kind.plural}/eviction", "create")
    return Permission(kind.group, kind.plural, verb.value)


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """One write exactly as it will be sent: verb, object, body, content type."""

    verb: Verb
    ref: ObjectRef
    body: dict[str, Any] | None

    @property
    def method(self) -> str:
        """Return the HTTP method."""
        return {Verb.PATCH: "PATCH", Verb.DELETE: "DELETE", Verb.GET: "GET"}.get(self.verb, "POST")

    @property
    def path(self) -> str:
        """Return the REST path (a create posts to the collection)."""
        if self.verb is Verb.CREATE:
            return self.ref.kind.path(self.ref.namespace)
        if self.verb is Verb.EVICT:
            return f"{self.ref.path}/eviction"
        return self.ref.path

    @property
    def content_type(self) -> str:
        """Return the body's media type (the patch type for a PATCH).

        For a JSON body the client may leave the header out; the API server then reads JSON.
        """
        if self.verb is Verb.PATCH:
            return MERGE_PATCH if self.ref.kind.custom else SMP
        return JSON

    def describe(self) -> str:
        """Return ``PATCH /apis/... (content type) {body}``: one line for a dry-run record."""
        body = json.dumps(self.body, sort_keys=True, separators=(",", ":"))
        return f"{self.method} {self.path} ({self.content_type}) {body}"


_Call = Callable[..., Any]

CALLS: frozenset[tuple[Kind, Verb]] = frozenset(
    {
        (DEPLOYMENTS, Verb.GET),
        (DEPLOYMENTS, Verb.PATCH),
        (STATEFULSETS, Verb.GET),
        (STATEFULSETS, Verb.PATCH),
        (ROLLOUTS, Verb.GET),
        (ROLLOUTS, Verb.PATCH),
        (LEADERWORKERSETS, Verb.GET),
        (LEADERWORKERSETS, Verb.PATCH),
        (PODS, Verb.GET),
        (PODS, Verb.EVICT),
        (PODS, Verb.DELETE),
        (CONFIGMAPS, Verb.GET),
        (INGRESSES, Verb.GET),
        (INGRESSES, Verb.PATCH),
        (BACKEND_TRAFFIC_POLICIES, Verb.GET),
        (BACKEND_TRAFFIC_POLICIES, Verb.CREATE),
        (BACKEND_TRAFFIC_POLICIES, Verb.PATCH),
        (BACKEND_TRAFFIC_POLICIES, Verb.DELETE),
    }
)
"""Every (kind, verb) ``KubeApi`` calls; any other is refused before sending."""

ACTUATOR_PERMISSIONS: frozenset[Permission] = frozenset(permission(k, v) for k, v in CALLS)
"""The RBAC grants the actuators' calls need, derived from ``CALLS`` (deploy/rbac.yaml)."""


class KubeApi:
    """Make the actuators' calls through a ``kubernetes.client.ApiClient``.

    ``timeout_s`` bounds each call (connect plus read). Every method raises ActuatorError
    (reasons in the module docstring); nothing else escapes.
    """

    def __init__(self, api_client: client.ApiClient, *, timeout_s: float = 10.0) -> None:
        if not timeout_s > 0:
            raise ActuatorError(Reason.INVALID_REQUEST, f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._apps = client.AppsV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._networking = client.NetworkingV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """Return the object as the API server's JSON, or None when it does not exist (404)."""
        try:
            return self._call(ApiRequest(Verb.GET, ref, None), {})
        except ActuatorError as exc:
            if exc.reason == Reason.NOT_FOUND:
                return None
            raise

    def send(self, request: ApiRequest, *, dry_run: bool = False) -> dict[str, Any] | None:
        """Send one write (``dry_run``: server-side, ``dryRun=All``); return the answer's JSON.

        A PATCH or create answers with the object; a delete with the object or a Status; an
        eviction with a Status. Raises ActuatorError.
        """
        extra: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        if request.verb in (Verb.PATCH, Verb.CREATE):
            extra["field_manager"] = FIELD_MANAGER
        log.info("kubernetes call dry_run=%s request=%s", dry_run, request.describe())
        return self._call(request, extra)

    def _call(self, request: ApiRequest, extra: dict[str, Any]) -> dict[str, Any] | None:
        ref, verb = request.ref, request.verb
        if (ref.kind, verb) not in CALLS:
            raise ActuatorError(
                Reason.INVALID_REQUEST, f"no {verb.value} call for {ref.kind.label}"
            )
        kwargs = {"_preload_content": False, "_request_timeout": self.timeout_s, **extra}
        method, args = self._method(request)
        if verb is Verb.DELETE:  # a keyword argument in every client version
            kwargs["body"] = request.body
        what = f"{verb.value} {ref.label}"
        try:
            data = method(*args, **kwargs).data
        except ApiException as exc:
            raise api_error(exc, what, ref.namespace) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise transport_error(exc, what, self.timeout_s) from exc
        except ValueError as exc:  # the client refused an argument before sending
            raise ActuatorError(Reason.INVALID_REQUEST, f"{what}: {exc}") from exc
        if not data:
            return None
        try:
            value = json.loads(data)
        except ValueError as exc:
            raise ActuatorError(Reason.BAD_RESPONSE, f"{what}: the answer is not JSON") from exc
        if not isinstance(value, dict):
            raise ActuatorError(Reason.BAD_RESPONSE, f"{what}: the answer is not a JSON object")
        return value

    def _method(self, request: ApiRequest) -> tuple[_Call, tuple[Any, ...]]:
        """Return the client method and its positional arguments for ``request``."""
        ref, body, verb = request.ref, request.body, request.verb
        ns, name, kind = ref.namespace, ref.name, ref.kind
        if kind.custom:
            coords = (kind.group, kind.version, ns, kind.plural)
            custom: dict[Verb, tuple[_Call, tuple[Any, ...]]] = {
                Verb.GET: (self._custom.get_namespaced_custom_object, (*coords, name)),
                Verb.PATCH: (self._custom.patch_namespaced_custom_object, (*coords, name, body)),
                Verb.CREATE: (self._custom.create_namespaced_custom_object, (*coords, body)),
                Verb.DELETE: (self._custom.delete_namespaced_custom_object, (*coords, name)),
            }
            return custom[verb]
        methods: dict[tuple[Kind, Verb], _Call] = {
            (DEPLOYMENTS, Verb.GET): self._apps.read_namespaced_deployment,
            (DEPLOYMENTS, Verb.PATCH): self._apps.patch_namespaced_deployment,
            (STATEFULSETS, Verb.GET): self._apps.read_namespaced_stateful_set,
            (STATEFULSETS, Verb.PATCH): self._apps.patch_namespaced_stateful_set,
            (PODS, Verb.GET): self._core.read_namespaced_pod,
            (PODS, Verb.EVICT): self._core.create_namespaced_pod_eviction,
            (PODS, Verb.DELETE): self._core.delete_namespaced_pod,
            (CONFIGMAPS, Verb.GET): self._core.read_namespaced_config_map,
            (INGRESSES, Verb.GET): self._networking.read_namespaced_ingress,
            (INGRESSES, Verb.PATCH): self._networking.patch_namespaced_ingress,
        }
        args = (name, ns) if verb in (Verb.GET, Verb.DELETE) else (name, ns, body)
        return methods[(kind, verb)], args


def status_body(exc: ApiException) -> dict[str, Any]:
    """Return the ``Status`` object of an error answer, or {} when the body is not one."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def pdb_cause(status: dict[str, Any]) -> str | None:
    """Return the ``DisruptionBudget`` cause message of a 429 Status, or None.

    The API server adds a cause ``{"reason": "DisruptionBudget", "message": "The disruption
    budget NAME needs N healthy pods and has M currently"}`` (pkg/registry/core/pod/storage/
    eviction.go in kubernetes/kubernetes).
    """
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else ():
        if isinstance(cause, dict) and cause.get("reason") == "DisruptionBudget":
            return str(cause.get("message") or "")
    return None


def api_error(exc: ApiException, what: str, namespace: str) -> ActuatorError:
    """Translate an error answer of ``what`` (``patch deployments.apps ns/name``)."""
    code = int(exc.status or 0)
    status = status_body(exc)
    message = str(status.get("message") or (exc.body or "").strip() or exc.reason or "")
    message = message[:_MESSAGE_CHARS]
    http = f"{code} {exc.reason or ''}".strip()
    if code == 0:
        return ActuatorError(Reason.UNREACHABLE, f"{what}: {exc.reason}")
    if code == 429:
        cause = pdb_cause(status)
        if cause is not None:
            found = _PDB_NAME.search(cause)
            budget = f"{namespace}/{found.group(1)}" if found else "(name not given)"
            return ActuatorError(
                Reason.PDB_BLOCKED,
                f"{what}: blocked by PodDisruptionBudget {budget} ({http}): {cause or message}",
            )
    reason = Reason.SERVER_ERROR if code >= 500 else _REASONS.get(code, Reason.HTTP_ERROR)
    return ActuatorError(reason, f"{what}: {http}: {message}")


def transport_error(
    exc: urllib3.exceptions.HTTPError, what: str, timeout_s: float
) -> ActuatorError:
    """Translate a failure without an answer: no connection, a timeout, a dropped connection."""
    cause: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        cause = exc.reason
    if isinstance(cause, urllib3.exceptions.ConnectTimeoutError):  # NewConnectionError too
        return ActuatorError(Reason.UNREACHABLE, f"{what}: {cause}")
    if isinstance(cause, urllib3.exceptions.TimeoutError):
        return ActuatorError(Reason.TIMEOUT, f"{what}: no answer within {timeout_s:g} s")
    if isinstance(cause, urllib3.exceptions.ProtocolError):
        return ActuatorError(Reason.CONNECTION_LOST, f"{what}: the connection broke: {cause}")
    return ActuatorError(Reason.UNREACHABLE, f"{what}: {cause}")
