"""Workload actuators: engine ceilings and rolling restarts of a Deployment, pod evictions.

``DeploymentCeilings`` (runbook action ``lower_batch_ceiling``) sets the serving engine's
ceilings in one container of a Deployment: vLLM and SGLang flags in the container's args (or
command), TGI env variables (or its flags, when the command line already has them, since they
win over env). The engines read them only at start, so the change is rolled out. The plan makes
the rollout replace one pod at a time: a strategy that already does (``maxSurge``/
``maxUnavailable`` 1/0 or 0/1) is kept, any other is changed to the chosen one in the same
patch, and the plan's diff shows the ``spec.strategy`` line either way; revert restores the
user's strategy with the old ceilings (so that rollout runs at the user's pace).

``DeploymentRestart`` (``stagger_restarts``) restarts every pod, one at a time, the way
``kubectl rollout restart`` does: it sets the pod template annotation
``kubectl.kubernetes.io/restartedAt``. Its revert puts the old annotation back, which is one
more rollout, not an undo.

``PodEvictor`` (``stagger_restarts``) evicts one pod through the Eviction API (policy/v1, so
PodDisruptionBudgets are respected: a refusal is ``pdb_blocked`` naming the budget, never
retried here) or deletes it. Both carry a UID precondition, so a pod re-created under the same
name (StatefulSet) is never hit by an old plan. An eviction cannot be reverted.

Sources: https://kubernetes.io/docs/concepts/workloads/controllers/deployment/ ,
https://kubernetes.io/docs/reference/kubectl/generated/kubectl_rollout/kubectl_rollout_restart/ ,
https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/ .
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from detector.actuators.base import ActionResult, ActuatorError, Operation, Plan, Reason, Status
from detector.actuators.kubernetes.actuator import KubernetesActuator, resource_version
from detector.actuators.kubernetes.api import (
    DEPLOYMENTS,
    PODS,
    ApiRequest,
    KubeApi,
    ObjectRef,
    Verb,
)
from detector.actuators.kubernetes.patch import (
    RESTARTED_AT,
    STRATEGY,
    Rollout,
    annotation_fields,
    annotations_patch,
    ceiling_fields,
    container_patch,
    deep_merge,
    describe_strategy,
    desired_ceiling_fields,
    engine_params,
    merge_diff,
    one_pod_strategy,
)

_TEMPLATE_ANNOTATIONS = "spec.template.metadata.annotations"


@dataclass(frozen=True, slots=True)
class DeploymentTarget:
    """A Deployment and, when it has several, the serving container to change."""

    namespace: str
    name: str
    container: str | None = None

    @property
    def ref(self) -> ObjectRef:
        """Return the API object."""
        return ObjectRef(DEPLOYMENTS, self.namespace, self.name)


class _DeploymentActuator(KubernetesActuator):
    """Shared by the Deployment actuators: the object, its strategy, the rollout check."""

    def __init__(self, api: KubeApi, deployment: DeploymentTarget, *, rollout: Rollout) -> None:
        super().__init__(api)
        self.deployment = deployment
        self.rollout: Rollout = rollout
        self._target = f"{DEPLOYMENTS.label}/{deployment.namespace}/{deployment.name}"

    @property
    def target(self) -> str:
        """Return ``kubernetes:deployments.apps/NAMESPACE/NAME``."""
        return f"kubernetes:{self._target}"

    def _ref(self, target: str) -> ObjectRef:
        if target != self._target:
            raise ActuatorError(Reason.INVALID_REQUEST, f"{target} is not {self._target}")
        return self.deployment.ref

    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        strategy = (obj.get("spec") or {}).get("strategy")
        return {STRATEGY: strategy} if strategy is not None else {}

    def _patch_body(
        self, obj: dict[str, Any], current: Mapping[str, Any], desired: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Return the strategy and annotation part of the patch (subclasses add to it)."""
        body: dict[str, Any] = annotations_patch(current, desired)
        if current.get(STRATEGY) != desired.get(STRATEGY):
            strategy = merge_diff(current.get(STRATEGY), desired.get(STRATEGY))
            body = deep_merge(body, {"spec": {"strategy": strategy}})
        return body

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

    def _strategy_note(self, obj: dict[str, Any], desired: Mapping[str, Any]) -> str:
        before = (obj.get("spec") or {}).get("strategy")
        after = desired.get(STRATEGY)
        if before == after:
            return f"rollout {describe_strategy(after)}: one pod at a time, strategy unchanged"
        return (
            f"rollout strategy changed to {describe_strategy(after)} so one pod at a time is "
            f"replaced (was {describe_strategy(before)}; revert restores it)"
        )

    def check_live(self) -> None:
        """Fail (``rollout_stalled``) when the rollout ran past its progress deadline."""
        obj = self._objects.get(self._target) or {}
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Progressing" and condition.get("status") == "False":
                raise ActuatorError(
                    Reason.ROLLOUT_STALLED,
                    f"{self.deployment.ref.label}: {condition.get('reason')}: "
                    f"{condition.get('message')}",
                )


class DeploymentCeilings(_DeploymentActuator):
    """Set a serving engine's ceilings in a Deployment, rolled out one pod at a time."""

    action: ClassVar[str] = "lower_batch_ceiling"

    def __init__(
        self,
        api: KubeApi,
        deployment: DeploymentTarget,
        engine: str,
        *,
        rollout: Rollout = "surge",
    ) -> None:
        engine_params(engine)  # ActuatorError for an unknown engine
        super().__init__(api, deployment, rollout=rollout)
        self.engine = engine

    def plan(self, ceilings: Mapping[str, int | float | str]) -> Plan:
        """Return the plan that sets ``ceilings`` (engine names: ``max_num_seqs`` ...).

        Raises ActuatorError: ``not_found`` (Deployment or container), ``invalid_request``
        (unknown ceiling, several containers and none named), ``unsupported`` (flags in a
        shell string, env from ``valueFrom``), and the API's errors.
        """
        if not ceilings:
            raise ActuatorError(Reason.INVALID_REQUEST, "no ceiling to set")
        with self._mutex:
            self.read(self._target)
            obj = self._objects[self._target] or {}
            container = self._container(obj)
            desired = {
                STRATEGY: one_pod_strategy((obj.get("spec") or {}).get("strategy"), self.rollout),
                **desired_ceiling_fields(container, self.engine, ceilings),
            }
            self._request(self._target, obj, desired)  # refuses now what it could not write
            values = ", ".join(f"{k}={v}" for k, v in ceilings.items())
            summary = (
                f"{self.engine} {values} in container {container.get('name')}; "
                f"{self._strategy_note(obj, desired)}"
            )
            return self._plan(self._target, desired, summary)

    def _container(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        containers = spec.get("containers") or []
        names = [str(c.get("name")) for c in containers]
        label = self.deployment.ref.label
        wanted = self.deployment.container
        if wanted is None:
            if len(containers) != 1:
                raise ActuatorError(
                    Reason.INVALID_REQUEST,
                    f"{label} has containers {', '.join(names)}: name the serving one",
                )
            return dict(containers[0])
        for container in containers:
            if container.get("name") == wanted:
                return dict(container)
        raise ActuatorError(
            Reason.NOT_FOUND, f"{label} has no container {wanted} ({', '.join(names)})"
        )

    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        return {**super()._fields(target, obj), **ceiling_fields(self._container(obj), self.engine)}

    def _patch_body(
        self, obj: dict[str, Any], current: Mapping[str, Any], desired: Mapping[str, Any]
    ) -> dict[str, Any]:
        body = super()._patch_body(obj, current, desired)
        entry = container_patch(self._container(obj), current, desired)
        if entry is None:
            return body
        return deep_merge(body, {"spec": {"template": {"spec": {"containers": [entry]}}}})


class DeploymentRestart(_DeploymentActuator):
    """Restart a Deployment's pods one at a time (``kubectl rollout restart``)."""

    action: ClassVar[str] = "stagger_restarts"

    def __init__(
        self, api: KubeApi, deployment: DeploymentTarget, *, rollout: Rollout = "surge"
    ) -> None:
        super().__init__(api, deployment, rollout=rollout)

    def plan(self, at: datetime) -> Plan:
        """Return the plan that stamps ``restartedAt`` with ``at`` (timezone-aware, to UTC).

        Raises ActuatorError (``invalid_request`` for a naive time; ``not_found``; the API's).
        """
        if at.tzinfo is None:
            raise ActuatorError(Reason.INVALID_REQUEST, "the restart time must be timezone-aware")
        stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._mutex:
            self.read(self._target)
            obj = self._objects[self._target] or {}
            desired = {
                **self._fields(self._target, obj),
                STRATEGY: one_pod_strategy((obj.get("spec") or {}).get("strategy"), self.rollout),
                f"{_TEMPLATE_ANNOTATIONS}[{RESTARTED_AT}]": stamp,
            }
            summary = f"rolling restart at {stamp}; {self._strategy_note(obj, desired)}"
            return self._plan(self._target, desired, summary)

    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        stamp = annotation_fields(obj, _TEMPLATE_ANNOTATIONS, (RESTARTED_AT,))
        return {**super()._fields(target, obj), **stamp}


class PodEvictor(KubernetesActuator):
    """Evict (PodDisruptionBudget-aware) or delete one pod, with a UID precondition.

    ``mode`` ``evict`` (default) POSTs an Eviction; ``delete`` DELETEs the pod and skips the
    budgets. ``grace_period_s`` overrides the pod's termination grace period.
    """

    action: ClassVar[str] = "stagger_restarts"
    absent_ok: ClassVar[bool] = True

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        *,
        mode: Literal["evict", "delete"] = "evict",
        grace_period_s: int | None = None,
    ) -> None:
        if mode not in ("evict", "delete"):
            raise ActuatorError(
                Reason.INVALID_REQUEST, f"mode must be evict or delete, not {mode!r}"
            )
        super().__init__(api)
        self.namespace = namespace
        self.mode = mode
        self.grace_period_s = grace_period_s

    @property
    def target(self) -> str:
        """Return ``kubernetes:pods/NAMESPACE``."""
        return f"kubernetes:pods/{self.namespace}"

    def plan(self, pod: str, *, note: str = "") -> Plan:
        """Return the plan that evicts (or deletes) ``pod``; ActuatorError(``not_found``).

        ``note`` is added to the summary (what the pod's controller does next).
        """
        ref = ObjectRef(PODS, self.namespace, pod)
        with self._mutex:
            obj = self.api.get(ref)
            uid = ((obj or {}).get("metadata") or {}).get("uid")
            if obj is None or not uid:
                raise ActuatorError(Reason.NOT_FOUND, f"{ref.label} does not exist")
            target = f"pods/{self.namespace}/{pod}@{uid}"
            self._objects[target] = self._present(target, obj)
            how = (
                "through the Eviction API (PodDisruptionBudgets respected)"
                if self.mode == "evict"
                else "by DELETE (PodDisruptionBudgets NOT consulted)"
            )
            summary = f"{self.mode} pod {self.namespace}/{pod} {how}"
            return self._plan(target, None, f"{summary}; {note}" if note else summary)

    def skip(self, pod: str, why: str) -> Plan:
        """Return the empty plan of a restart move that has nothing to send (``why`` says)."""
        return Plan(self.action, self.target, (), f"pod {self.namespace}/{pod}: {why}")

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Refuse (``irreversible``): an evicted pod is gone; its controller replaces it."""
        return ActionResult(
            action=plan.action,
            target=plan.target,
            operation=Operation.REVERT,
            status=Status.FAILED,
            summary=plan.summary,
            reason=Reason.IRREVERSIBLE,
            error="an evicted or deleted pod cannot be brought back; its controller replaces it",
            restored=True,
        )

    def _ref(self, target: str) -> ObjectRef:
        path, _, _ = target.partition("@")
        kind, namespace, name = [*path.split("/"), "", "", ""][:3]
        if kind != "pods" or namespace != self.namespace or not name:
            raise ActuatorError(
                Reason.INVALID_REQUEST, f"{target} is not a pod of {self.namespace}"
            )
        return ObjectRef(PODS, namespace, name)

    def _present(self, target: str, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        """Return the pod only while it is the planned one (same UID) and not terminating."""
        meta = (obj or {}).get("metadata") or {}
        if meta.get("uid") != target.partition("@")[2] or meta.get("deletionTimestamp"):
            return None
        return obj

    def _fields(self, target: str, obj: dict[str, Any]) -> dict[str, Any]:
        status = obj.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        restarts = sum(
            int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or []
        )
        return {
            "metadata.uid": (obj.get("metadata") or {}).get("uid"),
            "spec.nodeName": (obj.get("spec") or {}).get("nodeName"),
            "status.phase": status.get("phase"),
            "status.ready": ready,
            "status.restarts": restarts,
        }

    def _request(
        self, target: str, obj: dict[str, Any] | None, desired: dict[str, Any] | None
    ) -> ApiRequest | None:
        ref = self._ref(target)
        if desired is not None:
            raise ActuatorError(Reason.IRREVERSIBLE, f"{ref.label} cannot be re-created")
        if obj is None:
            return None
        options: dict[str, Any] = {"preconditions": {"uid": target.partition("@")[2]}}
        if self.grace_period_s is not None:
            options["gracePeriodSeconds"] = self.grace_period_s
        if self.mode == "delete":
            return ApiRequest(Verb.DELETE, ref, options)
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": ref.name, "namespace": ref.namespace},
            "deleteOptions": options,
        }
        return ApiRequest(Verb.EVICT, ref, eviction)
