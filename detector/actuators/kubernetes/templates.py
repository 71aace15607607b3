"""Engine ceilings in a StatefulSet, an Argo Rollout or a LeaderWorkerSet; Argo's own restart.

``ControllerCeilings`` (runbook action ``lower_batch_ceiling``) does for the controllers of
:mod:`detector.actuators.kubernetes.controllers` what ``DeploymentCeilings`` does for a
Deployment: it sets the serving engine's ceilings in the serving container of the pod
template (of each LeaderWorkerSet template that runs the engine), and in the same patch the
rollout strategy that replaces one pod (one group) at a time; revert restores both. The plan's
summary says how the change rolls out (partition, OnDelete, canary steps).

A StatefulSet is a built-in kind: a strategic merge patch that names the container. A Rollout
and a LeaderWorkerSet are custom resources, which take only a JSON merge patch (RFC 7386),
where a list is replaced whole: the patch carries the template's whole ``containers`` list with
the serving container changed. Either way the patch carries the ``metadata.resourceVersion``
it was computed from (a concurrent change fails with 409 instead of being overwritten), is
first sent as a server-side dry run, and a write in doubt is read back
(:class:`detector.actuators.kubernetes.actuator.KubernetesActuator`).

``RolloutRestart`` (``stagger_restarts``) sets a Rollout's ``spec.restartAt`` to now, Argo's
own restart: its controller evicts every pod created before that time, one at a time, each
after its ReplicaSet is fully available again (PodDisruptionBudgets respected). A later
restart move whose pod Argo restarts already (created before ``restartAt``, or gone) sends
nothing. A restart cannot be undone; revert refuses (``irreversible``).

Sources: https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#update-strategies
, https://argoproj.github.io/argo-rollouts/features/specification/ ,
https://argoproj.github.io/argo-rollouts/features/restart/ ,
https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/ .
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from detector.actuators.base import ActionResult, ActuatorError, Operation, Plan, Reason, Status
from detector.actuators.kubernetes.actuator import KubernetesActuator, resource_version
from detector.actuators.kubernetes.api import PODS, ApiRequest, KubeApi, ObjectRef, Verb
from detector.actuators.kubernetes.controllers import (
    ROLLOUT,
    STRATEGIES,
    Controller,
    StrategyPlan,
    Template,
    apply_container_entry,
    dig,
    edit_command,
    engine_templates,
    flags_text,
    prefixed,
    template_containers,
    unprefixed,
    workload_ref_note,
)
from detector.actuators.kubernetes.patch import (
    Rollout,
    ceiling_fields,
    container_patch,
    deep_merge,
    desired_ceiling_fields,
    engine_params,
    merge_diff,
    nested,
)

RESTART_AT = "spec.restartAt"


@dataclass(frozen=True, slots=True)
class WorkloadTarget:
    """An object of one of the controllers and, when it has several, the serving container."""

    controller: Controller
    namespace: str
    name: str
    container: str | None = None

    @property
    def ref(self) -> ObjectRef:
        """Return the API object."""
        return ObjectRef(self.controller.kind, self.namespace, self.name)


class _ControllerActuator(KubernetesActuator):
    """Shared by the controller actuators: the object, the patch request, the rollout check."""

    def __init__(self, api: KubeApi, workload: WorkloadTarget) -> None:
        super().__init__(api)
        self.workload = workload
        kind = workload.controller.kind
        self._target = f"{kind.label}/{workload.namespace}/{workload.name}"

    @property
    def target(self) -> str:
        """Return ``kubernetes:statefulsets.apps/NAMESPACE/NAME`` (the object's kind)."""
        return f"kubernetes:{self._target}"

    def _ref(self, target: str) -> ObjectRef:
        if target != self._target:
            raise ActuatorError(Reason.INVALID_REQUEST, f"{target} is not {self._target}")
        return self.workload.ref

    @abstractmethod
    def _patch_body(
        self, obj: dict[str, Any], current: Mapping[str, Any], desired: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Return the patch (without its resourceVersion) from ``current`` to ``desired``."""

    def _request(
        self, target: str, obj: dict[str, Any] | None, desired: dict[str, Any] | None
    ) -> ApiRequest | None:
        ref = self._ref(target)
        if obj is None or desired is None:
            raise ActuatorError(Reason.NOT_FOUND, f"{ref.label} does not exist")
        body = self._patch_body(obj, self._fields(target, obj), desired)
        if not body:
            return None
        body = deep_merge(body, {"metadata": {"resourceVersion": resource_version(obj, ref)}})
        return ApiRequest(Verb.PATCH, ref, body)

    def check_live(self) -> None:
        """Fail (``rollout_stalled``) when a Rollout is Degraded or ran past its deadline."""
        if self.workload.controller is not ROLLOUT:
            return
        status = (self._objects.get(self._target) or {}).get("status") or {}
        stalled = [
            f"{c.get('reason')}: {c.get('message')}"
            for c in status.get("conditions") or []
            if c.get("type") == "Progressing" and c.get("status") == "False"
        ]
        if status.get("phase") == "Degraded":
            stalled.insert(0, f"Degraded: {status.get('message', '')}")
        if stalled:
            raise ActuatorError(
                Reason.ROLLOUT_STALLED, f"{self.workload.ref.label}: {'; '.join(stalled)}"
            )


class ControllerCeilings(_ControllerActuator):
    """Set a serving engine's ceilings in a StatefulSet, Rollout or LeaderWorkerSet."""

    action: ClassVar[str] = "lower_batch_ceiling"

    def __init__(
        self, api: KubeApi, workload: WorkloadTarget, engine: str, *, rollout: Rollout = "surge"
    ) -> None:
        engine_params(engine)  # ActuatorError for an unknown engine
        super().__init__(api, workload)
        self.engine = engine
        self.rollout: Rollout = rollout

    def plan(self, ceilings: Mapping[str, int | float | str]) -> Plan:
        """Return the plan that sets ``ceilings`` (engine names: ``max_num_seqs`` ...).

        Raises ActuatorError: ``not_found`` (object or container), ``invalid_request``
        (unknown ceiling, several containers and none named), ``unsupported`` (flags in a
        shell string, env from ``valueFrom``), ``manual`` (a Rollout with ``workloadRef`` or
        blueGreen: the message says what to do by hand), and the API's errors.
        """
        if not ceilings:
            raise ActuatorError(Reason.INVALID_REQUEST, "no ceiling to set")
        with self._mutex:
            self.read(self._target)
            obj = self._objects[self._target] or {}
            strategy = self._strategy(obj, ceilings)
            controller = self.workload.controller
            pairs = template_containers(controller, obj, self.workload.container)
            chosen = engine_templates(pairs, self.engine)
            desired: dict[str, Any] = {}
            if strategy.value is not None:
                desired[controller.strategy] = strategy.value
            for template, container in pairs:
                fields = (
                    desired_ceiling_fields(container, self.engine, ceilings)
                    if (template, container) in chosen
                    else ceiling_fields(container, self.engine)
                )
                desired.update(prefixed(template.prefix, fields))
            self._request(self._target, obj, desired)  # refuses now what it could not write
            values = ", ".join(f"{k}={v}" for k, v in ceilings.items())
            where = " and ".join(self._where(t, c) for t, c in chosen)
            notes = [strategy.note] if strategy.note else []
            notes += [
                f"{self._where(t, c)} sets none of {self.engine}'s ceilings: left as is"
                for t, c in pairs
                if (t, c) not in chosen
            ]
            summary = f"{self.engine} {values} in {where}; {'; '.join(notes)}"
            return self._plan(self._target, desired, summary)

    def _strategy(
        self, obj: Mapping[str, Any], ceilings: Mapping[str, int | float | str]
    ) -> StrategyPlan:
        """Return the strategy to leave in place; ActuatorError(``manual``) says what to do."""
        controller, ns, name = self.workload.controller, self.workload.namespace, self.workload.name
        wanted = flags_text(self.engine, ceilings)
        container = self.workload.container or "the serving container"
        ref_note = workload_ref_note(obj) if controller is ROLLOUT else None
        if ref_note is not None:
            ref = (obj.get("spec") or {}).get("workloadRef") or {}
            edit = edit_command(
                str(ref.get("kind", "deployment")).lower(), ns, str(ref.get("name"))
            )
            raise ActuatorError(
                Reason.MANUAL, f"{ref_note}. By hand: {edit}, set {wanted} in {container}"
            )
        try:
            return STRATEGIES[controller.name](obj, self.rollout)
        except ActuatorError as exc:
            if exc.reason != Reason.MANUAL:
                raise
            edit = edit_command(controller.resource, ns, name)
            raise ActuatorError(
                Reason.MANUAL,
                f"{exc.detail}. By hand, when there is capacity: {edit}, set {wanted} in "
                f"{container}",
            ) from exc

    @staticmethod
    def _where(template: Template, container: Mapping[str, Any]) -> str:
        label = "" if template.label == "pod template" else f"{template.label} "
        return f"{label}container {container.get('name')}"

    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        controller = self.workload.controller
        fields: dict[str, Any] = {}
        strategy = dig(obj, controller.strategy)
        if strategy is not None:
            fields[controller.strategy] = strategy
        if controller is ROLLOUT and workload_ref_note(obj) is not None:
            return fields  # no template of its own: ``plan`` says where it is
        for template, container in template_containers(controller, obj, self.workload.container):
            fields.update(prefixed(template.prefix, ceiling_fields(container, self.engine)))
        return fields

    def _patch_body(
        self, obj: dict[str, Any], current: Mapping[str, Any], desired: Mapping[str, Any]
    ) -> dict[str, Any]:
        controller = self.workload.controller
        key = controller.strategy
        body: dict[str, Any] = {}
        if current.get(key) != desired.get(key):
            body = nested(key, merge_diff(current.get(key), desired.get(key)))
        for template, container in template_containers(controller, obj, self.workload.container):
            entry = container_patch(
                container,
                unprefixed(template.prefix, current),
                unprefixed(template.prefix, desired),
            )
            if entry is None:
                continue
            containers: list[Any] = [entry]
            if controller.kind.custom:  # JSON merge patch: the whole list
                every = dig(obj, f"{template.path}.spec.containers") or []
                containers = [
                    apply_container_entry(c, entry) if c.get("name") == entry["name"] else c
                    for c in every
                ]
            body = deep_merge(body, nested(f"{template.path}.spec", {"containers": containers}))
        return body


def _instant(stamp: str) -> datetime:
    """Return an RFC 3339 time (``2025-03-04T05:06:07Z``); ActuatorError when it is not one."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ActuatorError(Reason.BAD_RESPONSE, f"not an RFC 3339 time: {stamp!r}") from exc


class RolloutRestart(_ControllerActuator):
    """Restart every pod of an Argo Rollout, one at a time, through ``spec.restartAt``."""

    action: ClassVar[str] = "stagger_restarts"

    def __init__(self, api: KubeApi, namespace: str, name: str) -> None:
        super().__init__(api, WorkloadTarget(ROLLOUT, namespace, name))

    def plan(self, at: datetime) -> Plan:
        """Return the plan that sets ``spec.restartAt`` to ``at`` (timezone-aware, to UTC).

        Raises ActuatorError (``invalid_request`` for a naive time; ``not_found``; the API's).
        """
        if at.tzinfo is None:
            raise ActuatorError(Reason.INVALID_REQUEST, "the restart time must be timezone-aware")
        stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._mutex:
            self.read(self._target)
            summary = (
                f"Argo Rollouts restarts every pod of Rollout {self.workload.namespace}/"
                f"{self.workload.name} created before {stamp}, one at a time, by eviction "
                "(PodDisruptionBudgets respected), each after its ReplicaSet is fully "
                "available again: all its pods, not only the planned ones"
            )
            return self._plan(self._target, {RESTART_AT: stamp}, summary)

    def plan_move(self, pod: str, at: datetime) -> Plan:
        """Return the plan of the restart move of ``pod``: ``restartAt`` only when needed.

        Nothing is sent when Argo restarts the pod already: it was created before the
        Rollout's ``spec.restartAt`` (an earlier move set it; Argo restarts every such pod), or
        it no longer exists (replaced). Otherwise the plan sets ``spec.restartAt`` to ``at``.
        Raises ActuatorError (``invalid_request`` for a naive time; ``not_found``; the API's).
        """
        ns = self.workload.namespace
        found = self.api.get(ObjectRef(PODS, ns, pod))
        if found is None:
            why = f"pod {ns}/{pod} no longer exists (already replaced): nothing to restart"
            return Plan(self.action, self.target, (), why)
        created = str((found.get("metadata") or {}).get("creationTimestamp") or "")
        with self._mutex:
            self.read(self._target)
            restart_at = str(
                ((self._objects[self._target] or {}).get("spec") or {}).get("restartAt") or ""
            )
        if created and restart_at and _instant(created) < _instant(restart_at):
            why = (
                f"pod {ns}/{pod} (created {created}) is restarted by Argo Rollouts under "
                f"spec.restartAt {restart_at}: nothing more to send"
            )
            return Plan(self.action, self.target, (), why)
        return self.plan(at)

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Refuse (``irreversible``): restarted pods cannot be brought back."""
        return ActionResult(
            action=plan.action,
            target=plan.target,
            operation=Operation.REVERT,
            status=Status.FAILED,
            summary=plan.summary,
            reason=Reason.IRREVERSIBLE,
            error="a restart cannot be undone; the pods already run again",
            restored=True,
        )

    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        at = (obj.get("spec") or {}).get("restartAt")
        return {RESTART_AT: at} if at else {}

    def _patch_body(
        self, obj: dict[str, Any], current: Mapping[str, Any], desired: Mapping[str, Any]
    ) -> dict[str, Any]:
        if current.get(RESTART_AT) == desired.get(RESTART_AT):
            return {}
        return nested(RESTART_AT, desired.get(RESTART_AT))
