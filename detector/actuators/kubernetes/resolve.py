"""Which controller a workload's change must go to, and what a person does when it is none.

The correlator names a workload after its pods' owners (``detector.correlate.identity``), and
two serving controllers hide behind others there: a pod of an Argo Rollout is owned by a
ReplicaSet ``<rollout>-<hash>``, so it reads as a Deployment's; a pod of a LeaderWorkerSet is
owned by a StatefulSet (the leaders' ``<lws>``, or a group's workers ``<lws>-<group>``, itself
owned by the group's leader pod), so it reads as a StatefulSet's. ``resolve_workload`` reads
the named object (one GET, two for a Deployment that does not exist) and returns the
controller to act on:

- a Deployment: itself; when there is none, the Rollout of that name if there is one;
- a StatefulSet (or Deployment) with the ``leaderworkerset.sigs.k8s.io/name`` label or a
  LeaderWorkerSet controller reference: that LeaderWorkerSet;
- a Deployment or StatefulSet whose controller reference names anything else: itself,
  ``managed_by`` that owner (a patch to it would be undone: its ceilings are set by hand);
- a Rollout or LeaderWorkerSet: itself; any other kind: itself, and the caller says what to do
  by hand (``manual``).

``ManualStep`` is the actuator of a step the detector does not make: its plan changes nothing
and its summary says exactly what to do (the kubectl command or the field); apply fails with
reason ``manual`` and that text, dry run or not, so the timeline shows it.

Sources: https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/
, https://argoproj.github.io/argo-rollouts/features/specification/ ,
https://lws.sigs.k8s.io/docs/reference/labels-annotations-and-environment-variables/ .
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from detector.actuators.base import (
    ActionResult,
    Actuator,
    ActuatorError,
    Operation,
    Plan,
    Reason,
    Status,
)
from detector.actuators.kubernetes.api import (
    DEPLOYMENTS,
    ROLLOUTS,
    STATEFULSETS,
    KubeApi,
    ObjectRef,
)
from detector.actuators.kubernetes.controllers import LWS_NAME, edit_command, flags_text

SUPPORTED = ("Deployment", "StatefulSet", "Rollout", "LeaderWorkerSet")
"""Kinds whose ceilings the detector patches (unless ``managed_by`` another controller)."""
RESTARTABLE = (*SUPPORTED, "ReplicaSet", "DaemonSet")
"""Kinds whose controller re-creates an evicted pod."""
MANUAL_PREFIX = "kubernetes:manual/"


@dataclass(frozen=True, slots=True)
class Workload:
    """The controller a change goes to; ``managed_by`` the controller that owns it, if any."""

    kind: str
    namespace: str
    name: str
    managed_by: tuple[str, str] | None = None

    @property
    def label(self) -> str:
        """Return ``StatefulSet inference/llama``."""
        return f"{self.kind} {self.namespace}/{self.name}"


def _controller_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return (kind, name) of the object's controller reference, or None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


def _owned(kind: str, namespace: str, name: str, obj: Mapping[str, Any]) -> Workload:
    """Return the workload ``obj`` (a Deployment or StatefulSet) belongs to."""
    lws = ((obj.get("metadata") or {}).get("labels") or {}).get(LWS_NAME)
    owner = _controller_of(obj)
    if lws:
        return Workload("LeaderWorkerSet", namespace, str(lws))
    if owner is not None and owner[0] == "LeaderWorkerSet":
        return Workload("LeaderWorkerSet", namespace, owner[1])
    return Workload(kind, namespace, name, managed_by=owner)


def resolve_workload(api: KubeApi, kind: str, namespace: str, name: str) -> Workload:
    """Return the controller that a change to ``kind`` ``namespace/name`` must go to.

    An object that does not exist resolves to itself (the actuator then says ``not_found``).
    Raises ActuatorError for a failed GET (``forbidden``, ``timeout`` ...).
    """
    if kind in ("", "Deployment"):
        obj = api.get(ObjectRef(DEPLOYMENTS, namespace, name))
        if obj is not None:
            return _owned("Deployment", namespace, name, obj)
        if api.get(ObjectRef(ROLLOUTS, namespace, name)) is not None:
            return Workload("Rollout", namespace, name)
        return Workload("Deployment", namespace, name)
    if kind == "StatefulSet":
        obj = api.get(ObjectRef(STATEFULSETS, namespace, name))
        return (
            Workload(kind, namespace, name) if obj is None else _owned(kind, namespace, name, obj)
        )
    return Workload(kind, namespace, name)


def _resource(kind: str) -> str:
    return {"StatefulSet": "statefulset", "LeaderWorkerSet": "leaderworkerset"}.get(
        kind, kind.lower()
    )


def ceilings_by_hand(
    workload: Workload,
    engine: str,
    ceilings: Mapping[str, int | float | str],
    why: str,
    container: str | None = None,
) -> str:
    """Return what a person does to set ``ceilings``: ``why``, then the command and the values."""
    wanted = flags_text(engine, ceilings)
    where = f"container {container}" if container else "the serving container"
    w = workload
    if w.managed_by is not None:
        owner_kind, owner = w.managed_by
        edit = edit_command(owner_kind.lower(), w.namespace, owner)
        return (
            f"{why}. By hand: {edit}, set {wanted} for {where} in its spec (it renders "
            f"{w.kind} {w.name}); let it roll out one pod at a time"
        )
    if w.kind == "unknown":
        owners = (
            f"kubectl -n {w.namespace} get pod {w.name} -o jsonpath='{{.metadata.ownerReferences}}'"
        )
        return (
            f"{why}. By hand: find what creates pod {w.name} ({owners}) and set {wanted} for "
            f"{where} in its pod template, then restart its pods one at a time"
        )
    edit = edit_command(_resource(w.kind), w.namespace, w.name)
    return (
        f"{why}. By hand: {edit}, set {wanted} in {where} of its pod template, then restart "
        "its pods one at a time"
    )


def restart_by_hand(workload: Workload, pod: str, why: str) -> str:
    """Return what a person does to restart ``pod`` of ``workload``: ``why``, then how."""
    ns = workload.namespace
    if workload.kind == "unknown":
        return (
            f"{why}. By hand: pod {ns}/{pod} has no controller the detector knows, so deleting "
            "it may not bring it back; find what creates it (kubectl -n "
            f"{ns} get pod {pod} -o jsonpath='{{.metadata.ownerReferences}}') and restart it "
            "through that, one pod at a time"
        )
    return (
        f"{why}. By hand: kubectl -n {ns} delete pod {pod} once {workload.label} would "
        "re-create it, one pod at a time, each after the one before is Ready"
    )


class ManualStep(Actuator):
    """Record a step the detector does not make: what to do by hand, as a failed result."""

    action: ClassVar[str] = "manual"

    @property
    def target(self) -> str:
        """Return ``kubernetes:manual``."""
        return MANUAL_PREFIX.rstrip("/")

    def plan(self, action: str, workload: Workload, instructions: str) -> Plan:
        """Return the plan of ``action`` on ``workload``: no change, ``instructions`` as summary."""
        target = f"{MANUAL_PREFIX}{workload.kind}/{workload.namespace}/{workload.name}"
        return Plan(action, target, (), instructions)

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Fail with reason ``manual`` and the plan's instructions (dry run or not)."""
        return self._manual(plan, Operation.APPLY)

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Report ``unchanged``: the detector changed nothing to put back."""
        return ActionResult(
            plan.action, plan.target, Operation.REVERT, Status.UNCHANGED, summary=plan.summary
        )

    def verify(self, plan: Plan) -> ActionResult:
        """Fail with reason ``manual``: what a person does is not the detector's to check."""
        return self._manual(plan, Operation.VERIFY)

    def _manual(self, plan: Plan, operation: Operation) -> ActionResult:
        return ActionResult(
            action=plan.action,
            target=plan.target,
            operation=operation,
            status=Status.FAILED,
            summary=plan.summary,
            reason=Reason.MANUAL,
            error=plan.summary,
            restored=True,
        )

    def read(self, target: str) -> str | None:
        """Return None: a manual step has no content."""
        return None

    def write(self, target: str, content: str | None) -> None:
        """Refuse (``manual``): nothing is written by the detector."""
        raise ActuatorError(Reason.MANUAL, f"{target} is changed by hand")

    def validate(self) -> None:
        """Nothing to validate."""

    def activate(self) -> None:
        """Nothing to activate."""
