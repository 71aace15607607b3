"""One restart move of a staggered restart, by the controller of the pod's workload.

The step machine hands over one pod per move, in the planned order, spaced. ``PodRestarts``
(a ``PodEvictor``: Eviction API with a UID precondition, PodDisruptionBudgets respected, or a
DELETE) plans each move for the workload's controller:

- Deployment, ReplicaSet, DaemonSet: evict the pod; its controller replaces it;
- StatefulSet: evict the pod; the controller re-creates it under the same name, and the plan
  says with which template: the latest one under ``OnDelete`` (so this restart is what rolls
  a ceilings change out), the current revision for an ordinal below a RollingUpdate
  ``partition`` (a ceilings change does not reach it);
- LeaderWorkerSet: a group (leader and workers) restarts as one unit: the move evicts the
  group's leader pod only (the workers' StatefulSet is owned by the leader pod, so they go
  with it and LWS re-creates the whole group). A worker's leader is read from its labels
  (``leaderworkerset.sigs.k8s.io/worker-index`` 0 is a leader) or its ``leader-name``
  annotation, else from the names LWS gives (leader ``<lws>-<group>``, worker
  ``<lws>-<group>-<worker>``). A move sends nothing when its group was restarted by this
  step already: an earlier pod of the order is of the same group, and the leader this
  actuator evicted for it has been replaced since (what it evicted is kept in memory, so
  after a process restart the group may be restarted once more: the safe side).

An Argo Rollout restarts through ``spec.restartAt`` instead
(:class:`detector.actuators.kubernetes.templates.RolloutRestart`).

Sources: https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#rolling-updates
, https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/ ,
https://lws.sigs.k8s.io/docs/reference/labels-annotations-and-environment-variables/ ,
https://github.com/kubernetes-sigs/lws/blob/main/pkg/controllers/pod_controller.go (the worker
StatefulSet, named after the leader pod, has the leader pod as its controller).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from detector.actuators.base import ActionResult, ActuatorError, Plan, Reason, Status
from detector.actuators.kubernetes.api import PODS, STATEFULSETS, KubeApi, ObjectRef
from detector.actuators.kubernetes.controllers import (
    LWS_GROUP_INDEX,
    LWS_LEADER_NAME,
    LWS_NAME,
    LWS_WORKER_INDEX,
    dig,
)
from detector.actuators.kubernetes.resolve import Workload
from detector.actuators.kubernetes.workloads import PodEvictor

_ORDINAL = re.compile(r"-(\d+)$")


def group_of_name(lws: str, pod: str) -> tuple[str, str] | None:
    """Return (leader pod, group index) that LWS's pod names give, or None.

    ``lws-2`` is the leader of group 2; ``lws-2-3`` worker 3 of group 2.
    """
    rest = pod[len(lws) + 1 :] if pod.startswith(f"{lws}-") else ""
    parts = rest.split("-")
    if not rest or not all(p.isascii() and p.isdigit() for p in parts) or len(parts) > 2:
        return None
    return f"{lws}-{parts[0]}", parts[0]


def _leader_of_name(lws: str, pod: str) -> str | None:
    found = group_of_name(lws, pod)
    return found[0] if found is not None else None


def lws_leader(api: KubeApi, namespace: str, lws: str, pod: str) -> tuple[str, str]:
    """Return (leader pod, group index) of ``pod`` of LeaderWorkerSet ``lws``.

    Raises ActuatorError: ``invalid_request`` (a pod of another workload), ``not_found``.
    """
    obj = api.get(ObjectRef(PODS, namespace, pod))
    meta = (obj or {}).get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if obj is not None and labels.get(LWS_NAME) not in (None, lws):
        raise ActuatorError(
            Reason.INVALID_REQUEST,
            f"pod {namespace}/{pod} belongs to LeaderWorkerSet {labels.get(LWS_NAME)}, not {lws}",
        )
    group = labels.get(LWS_GROUP_INDEX)
    if labels.get(LWS_WORKER_INDEX) == "0" and group is not None:
        return pod, str(group)
    if annotations.get(LWS_LEADER_NAME) and group is not None:
        return str(annotations[LWS_LEADER_NAME]), str(group)
    parsed = group_of_name(lws, pod)
    if parsed is None:
        raise ActuatorError(
            Reason.NOT_FOUND,
            f"pod {namespace}/{pod}: no group of LeaderWorkerSet {lws} found (labels or name)",
        )
    return parsed


class PodRestarts(PodEvictor):
    """Plan each restart move for the pod's workload (see the module docstring).

    ``workload`` None: a plan read back from the store, applied as it stands.
    """

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        workload: Workload | None = None,
        *,
        mode: Literal["evict", "delete"] = "evict",
        grace_period_s: int | None = None,
    ) -> None:
        super().__init__(api, namespace, mode=mode, grace_period_s=grace_period_s)
        self.workload = workload
        self._orders: dict[str, tuple[str, ...]] = {}  # planned leader@UID -> its step's order
        self._evicted: dict[tuple[tuple[str, ...], str], str] = {}  # (order, leader) -> UID

    def plan_move(self, pod: str, order: Sequence[str] = ()) -> Plan:
        """Return the plan of the move that restarts ``pod`` (``order``: the planned pods).

        Raises ActuatorError (``not_found``, ``invalid_request``, the API's).
        """
        kind = self.workload.kind if self.workload is not None else ""
        if kind == "LeaderWorkerSet":
            return self._group(pod, order)
        if kind == "StatefulSet":
            return self.plan(pod, note=self._statefulset_note(pod))
        return self.plan(pod)

    def _group(self, pod: str, order: Sequence[str]) -> Plan:
        assert self.workload is not None
        ns, lws = self.namespace, self.workload.name
        leader, group = lws_leader(self.api, ns, lws, pod)
        earlier = list(order[: list(order).index(pod)]) if pod in order else []
        same = [o for o in earlier if o == leader or _leader_of_name(lws, o) == leader]
        evicted = self._evicted.get((tuple(order), leader))
        if same and evicted is not None:
            now = (self.api.get(ObjectRef(PODS, ns, leader)) or {}).get("metadata") or {}
            if now.get("uid") != evicted:
                return self.skip(
                    pod,
                    f"group {group} of LeaderWorkerSet {lws} was restarted with its leader "
                    f"{leader} by the move of pod {same[0]}: nothing more to send",
                )
        worker = f" (pod {pod} is one of its workers)" if leader != pod else ""
        note = (
            f"restarts group {group} of LeaderWorkerSet {ns}/{lws} as one unit through its "
            f"leader {leader} only{worker}: LWS re-creates the leader and its workers together"
        )
        plan = self.plan(leader, note=note)
        for change in plan.changes:
            self._orders[change.target] = tuple(order)
        return plan

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Evict as ``PodEvictor`` does; remember a group leader evicted for real."""
        result = super().apply(plan, dry_run=dry_run)
        if result.status is Status.OK:
            for change in plan.changes:
                order = self._orders.get(change.target)
                if order is not None:
                    leader, _, uid = change.target.rpartition("/")[2].partition("@")
                    self._evicted[(order, leader)] = uid
        return result

    def _statefulset_note(self, pod: str) -> str:
        assert self.workload is not None
        name = self.workload.name
        sts = self.api.get(ObjectRef(STATEFULSETS, self.namespace, name)) or {}
        strategy = dig(sts, "spec.updateStrategy") or {}
        found = _ORDINAL.search(pod)
        ordinal = int(found.group(1)) if found else None
        if strategy.get("type") == "OnDelete":
            return (
                f"StatefulSet {name} re-creates it under the same name with its latest template "
                "(updateStrategy OnDelete: this restart is what rolls a template change out to "
                "the pod)"
            )
        partition = (strategy.get("rollingUpdate") or {}).get("partition") or 0
        if ordinal is not None and isinstance(partition, int) and ordinal < partition:
            return (
                f"StatefulSet {name} re-creates it under the same name at the current revision: "
                f"ordinal {ordinal} is below partition {partition}, so a template change (new "
                "ceilings) does not reach it"
            )
        return f"StatefulSet {name} re-creates it under the same name"
