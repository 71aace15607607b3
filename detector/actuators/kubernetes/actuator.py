"""Kubernetes actuators: API objects as targets, patched with optimistic concurrency.

Each target is one API object (``deployments.apps/inference/llama``); its content is the part
of the object the actuator manages, as ``key: <JSON>`` lines
(:mod:`detector.actuators.kubernetes.patch`). ``read`` is a GET; ``write`` sends one request
that moves the object from what was read to the planned content: a strategic-merge (built-in
kinds) or JSON merge (custom kinds) PATCH that carries the ``metadata.resourceVersion`` it was
computed from, so a change made by anyone else since the read fails with 409 Conflict instead
of being overwritten; or a create, delete or eviction. A PATCH is live when the API answers
(the controllers roll it out), so ``validate`` and ``activate`` have nothing left to do.

The transaction of :class:`detector.actuators.base.Actuator` applies: a plan with several
objects is written in order and, when one write fails, the objects already written are patched
back. On top of it:

- ``apply``/``revert`` with ``dry_run=True`` (the default) only GET; the result's summary
  records the exact request each change would send (``would send: PATCH /apis/... {body}``);
- before a real write, every request is first sent with ``dryRun=All`` (``preflight``), so
  admission, validation, RBAC and PodDisruptionBudgets are checked before anything changes;
- a write in doubt (a timeout, or the connection lost after sending) is read back: landed
  means done, unchanged means failed (a request still in flight at the API server could land
  later: ``verify`` shows it); anything else, or no answer, is reported as a previous state
  NOT restored.

The workload actuators are in :mod:`detector.actuators.kubernetes.workloads`, the gateway ones
in :mod:`detector.actuators.kubernetes.gateways`; the API calls and their RBAC grants in
:mod:`detector.actuators.kubernetes.api`. Sources:
https://kubernetes.io/docs/reference/using-api/api-concepts/#patch-and-apply ,
https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run .
"""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from detector.actuators.base import (
    ActionResult,
    Actuator,
    ActuatorError,
    Change,
    Plan,
    Reason,
    Status,
)
from detector.actuators.kubernetes.api import (
    ACTUATOR_PERMISSIONS,
    IN_DOUBT,
    ApiRequest,
    KubeApi,
    ObjectRef,
    Permission,
    Verb,
)
from detector.actuators.kubernetes.patch import parse_fields, render_fields

log = logging.getLogger(__name__)

DEFAULT_CONTROLLER_CONFIGMAP = ("ingress-nginx", "ingress-nginx-controller")
"""Namespace and name of the ingress-nginx controller ConfigMap (the Helm chart's default)."""

READ_PERMISSIONS: frozenset[Permission] = frozenset(
    {
        Permission("apps", "deployments", "list"),
        Permission("apps", "deployments", "watch"),
        Permission("apps", "statefulsets", "list"),
        Permission("apps", "statefulsets", "watch"),
        Permission("argoproj.io", "rollouts", "list"),
        Permission("argoproj.io", "rollouts", "watch"),
        Permission("leaderworkerset.x-k8s.io", "leaderworkersets", "list"),
        Permission("leaderworkerset.x-k8s.io", "leaderworkersets", "watch"),
        Permission("", "pods", "list"),
        Permission("", "pods", "watch"),
        Permission("", "events", "get"),
        Permission("", "events", "list"),
        Permission("", "events", "watch"),
        Permission("policy", "poddisruptionbudgets", "get"),
        Permission("policy", "poddisruptionbudgets", "list"),
    }
)
"""Read-only grants the detector needs beside the actuators' own calls (least privilege):
watching pods, the serving controllers (Deployments, StatefulSets, Argo Rollouts,
LeaderWorkerSets) and events for signals and for the staggered-restart planner, and reading
PodDisruptionBudgets."""

RBAC_PERMISSIONS: frozenset[Permission] = ACTUATOR_PERMISSIONS | READ_PERMISSIONS
"""Every grant of deploy/rbac.yaml; the manifest test checks the file against it."""

RESOURCE_NAMES: dict[Permission, tuple[str, ...]] = {
    Permission("", "configmaps", "get"): (DEFAULT_CONTROLLER_CONFIGMAP[1],),
}
"""Grants limited to named objects: a Role in the controller's namespace, not the ClusterRole."""


class KubernetesActuator(Actuator):
    """Base of the Kubernetes actuators: GET to read, one request to write, dry runs first.

    Subclasses give ``_ref`` (the object of a target), ``_fields`` (its managed fields) and
    ``_request`` (the write from an object to desired fields); ``absent_ok`` says whether a
    missing object is a state (None) or an error (``not_found``). One operation at a time per
    instance (a re-entrant lock); errors are ActuatorError, as results from apply, revert and
    verify.
    """

    absent_ok: ClassVar[bool] = False

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._objects: dict[str, dict[str, Any] | None] = {}
        self._staged: Plan | None = None
        self._unknown: list[str] = []
        self._mutex = threading.RLock()

    @abstractmethod
    def _ref(self, target: str) -> ObjectRef:
        """Return the object ``target`` names."""

    @abstractmethod
    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Return the managed fields of ``obj``, in display order."""

    @abstractmethod
    def _request(
        self, target: str, obj: dict[str, Any] | None, desired: dict[str, Any] | None
    ) -> ApiRequest | None:
        """Return the write that turns ``obj`` into ``desired`` fields (None: nothing to do)."""

    def _present(self, target: str, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        """Return ``obj`` when it is the object ``target`` means, else None (hook for pods)."""
        return obj

    # -- the Actuator hooks ---------------------------------------------------------------

    def read(self, target: str) -> str | None:
        """GET the object; return its managed fields as text, None when it is absent."""
        ref = self._ref(target)
        obj = self._present(target, self.api.get(ref))
        if obj is None and not self.absent_ok:
            raise ActuatorError(Reason.NOT_FOUND, f"get {ref.label}: 404 Not Found")
        self._objects[target] = obj
        return None if obj is None else render_fields(self._fields(target, obj))

    def write(self, target: str, content: str | None) -> None:
        """Send the one request that gives the object ``content``; see the module docstring."""
        if target not in self._objects:
            self.read(target)
        obj = self._objects[target]
        before = None if obj is None else render_fields(self._fields(target, obj))
        request = self._request(target, obj, None if content is None else parse_fields(content))
        if request is None:
            return
        try:
            answer = self.api.send(request)
        except ActuatorError as exc:
            if exc.reason not in IN_DOUBT:
                raise
            self._settle(target, before, content, exc)
            return
        keeps = request.verb in (Verb.PATCH, Verb.CREATE)
        self._objects[target] = self._present(target, answer) if keeps else None

    def _settle(
        self, target: str, before: str | None, content: str | None, exc: ActuatorError
    ) -> None:
        """After a write in doubt, return if it landed; else raise, noting an unknown state."""
        label = self._ref(target).label
        try:
            now = self.read(target)
        except ActuatorError as again:
            self._unknown.append(label)
            raise ActuatorError(
                exc.reason, f"{exc.detail}; reading it back failed: {again}"
            ) from exc
        if now == content:
            log.warning("kubernetes write in doubt landed object=%s reason=%s", label, exc.reason)
            return
        if now == before:
            raise ActuatorError(
                exc.reason,
                f"{exc.detail}; a GET after it shows {label} unchanged (a request still in "
                "flight could land later: verify shows it)",
            ) from exc
        self._unknown.append(label)
        raise ActuatorError(
            exc.reason, f"{exc.detail}; {label} now holds neither the old nor the new content"
        ) from exc

    def validate(self) -> None:
        """Nothing to check after writing: the server-side dry run ran before (preflight)."""
        return None

    def activate(self) -> None:
        """Nothing to activate: a PATCH is live when the API server answers."""
        return None

    def preflight(self) -> None:
        """Send every pending write of the plan being applied with ``dryRun=All`` first."""
        plan = self._staged
        for change in plan.changes if plan is not None else ():
            request = self._pending_request(change)
            if request is not None:
                self.api.send(request, dry_run=True)

    # -- operations -----------------------------------------------------------------------

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Give every object of ``plan`` its planned fields; dry-run (GETs only) by default."""
        return self._operate(plan, lambda: Actuator.apply(self, plan, dry_run=dry_run))

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Put every object of ``plan`` back to its fields before it; dry-run by default."""
        return self._operate(plan.inverted(), lambda: Actuator.revert(self, plan, dry_run=dry_run))

    def verify(self, plan: Plan) -> ActionResult:
        """Check every object holds its planned fields (and ``check_live``)."""
        with self._mutex:
            return super().verify(plan)

    def requests(self, plan: Plan) -> tuple[ApiRequest, ...]:
        """Return the writes applying ``plan`` would send now (GETs each object first).

        Raises ActuatorError when an object cannot be read or a write cannot be built.
        """
        with self._mutex:
            for change in plan.changes:
                self.read(change.target)
            found = (self._pending_request(change) for change in plan.changes)
            return tuple(request for request in found if request is not None)

    def _operate(self, staged: Plan, run: Callable[[], ActionResult]) -> ActionResult:
        with self._mutex:
            self._staged, self._unknown = staged, []
            try:
                result = run()
            finally:
                self._staged = None
            return self._finish(result)

    def _pending_request(self, change: Change) -> ApiRequest | None:
        """Return the write ``change`` needs from the object last read (None: in place)."""
        obj = self._objects.get(change.target)
        current = None if obj is None else render_fields(self._fields(change.target, obj))
        if current == change.after:
            return None
        desired = None if change.after is None else parse_fields(change.after)
        return self._request(change.target, obj, desired)

    def _finish(self, result: ActionResult) -> ActionResult:
        """Add the exact requests to a dry-run result; mark an unknown state not restored."""
        if result.status is Status.DRY_RUN:
            try:
                found = [self._pending_request(change) for change in result.changes]
            except ActuatorError as exc:
                return replace(
                    result, status=Status.FAILED, reason=exc.reason, error=exc.detail, restored=True
                )
            sent = "; ".join(request.describe() for request in found if request is not None)
            summary = "; ".join(part for part in (result.summary, f"would send: {sent}") if part)
            return replace(result, summary=summary)
        if result.status is Status.FAILED and self._unknown:
            error = f"{result.error}; state unknown: {', '.join(self._unknown)}"
            return replace(result, restored=False, error=error)
        return result

    def _plan(self, target: str, desired: dict[str, Any] | None, summary: str) -> Plan:
        """Return the one-object plan from the object last read to ``desired`` fields."""
        obj = self._objects.get(target)
        before = None if obj is None else render_fields(self._fields(target, obj))
        after = None if desired is None else render_fields(desired)
        return Plan(self.action, self.target, (Change(target, before, after),), summary)


def resource_version(obj: dict[str, Any], ref: ObjectRef) -> str:
    """Return ``metadata.resourceVersion``; ActuatorError(``bad_response``) when missing."""
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if not version:
        raise ActuatorError(Reason.BAD_RESPONSE, f"{ref.label} has no metadata.resourceVersion")
    return str(version)
