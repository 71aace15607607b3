"""The serving controllers besides Deployments: where their pod templates and rollout
strategies live, and how each rolls a template change out. Pure: no network.

A ``Controller`` names an API resource, its pod templates (each with the prefix its field keys
carry, see :mod:`detector.actuators.kubernetes.patch`) and its rollout strategy field. The
``*_strategy`` functions return the strategy a ceilings patch sets so the change reaches one
pod (or one group) at a time, and what people must know about that rollout:

- **StatefulSet** (apps/v1): ``spec.updateStrategy``. ``RollingUpdate`` (the default)
  replaces one pod at a time, highest ordinal first, unless ``rollingUpdate.maxUnavailable``
  says more (then it is set to 1, restored on revert). A ``partition`` P above 0 keeps pods
  with an ordinal below P at the old template, even when they are deleted: the plan says so
  and leaves the partition alone. ``OnDelete`` never rolls: each pod gets the new template
  when it is deleted, so the restart step is what rolls it out.
  https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#update-strategies
- **Rollout** (argoproj.io/v1alpha1): ``spec.strategy``. A canary rolls like a Deployment
  (``canary.maxSurge``/``maxUnavailable`` are set to one pod at a time, its ``steps`` run as
  written: an indefinite pause waits for a promotion). A blueGreen brings up a whole preview
  ReplicaSet (a spare GPU per replica) before switching, and a Rollout with
  ``spec.workloadRef`` takes its template from a Deployment: both are left to a person
  (``manual``). https://argoproj.github.io/argo-rollouts/features/specification/
- **LeaderWorkerSet** (leaderworkerset.x-k8s.io/v1): ``spec.rolloutStrategy``; a group (one
  leader, ``size - 1`` workers) is the unit of a rollout, ``rollingUpdateConfiguration``
  maxUnavailable 1 / maxSurge 0 (the defaults) replace one group at a time; a ``partition``
  keeps the groups below it at the old template. The templates are
  ``spec.leaderWorkerTemplate.leaderTemplate`` (optional: the worker template serves the
  leader too) and ``.workerTemplate``.
  https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from detector.actuators.base import ActuatorError, Reason
from detector.actuators.kubernetes.api import LEADERWORKERSETS, ROLLOUTS, STATEFULSETS, Kind
from detector.actuators.kubernetes.patch import (
    ONE_AT_A_TIME,
    Rollout,
    ceiling_fields,
    deep_merge,
    engine_params,
    format_value,
)

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_LEADER_NAME = "leaderworkerset.sigs.k8s.io/leader-name"
"""Labels (and the workers' annotation) LWS puts on its pods and StatefulSets:
https://lws.sigs.k8s.io/docs/reference/labels-annotations-and-environment-variables/"""


@dataclass(frozen=True, slots=True)
class Template:
    """One pod template of a controller: the prefix of its field keys and its dotted path."""

    prefix: str
    path: str

    @property
    def label(self) -> str:
        """Return how people call it (``workerTemplate``; ``pod template`` for the only one)."""
        return self.prefix.rstrip(".") or "pod template"


@dataclass(frozen=True, slots=True)
class Controller:
    """A controller kind: its API resource, pod templates, strategy field, kubectl name."""

    name: str
    kind: Kind
    templates: tuple[Template, ...]
    strategy: str
    resource: str


_POD_TEMPLATE = (Template("", "spec.template"),)
STATEFULSET = Controller(
    "StatefulSet", STATEFULSETS, _POD_TEMPLATE, "spec.updateStrategy", "statefulset"
)
ROLLOUT = Controller("Rollout", ROLLOUTS, _POD_TEMPLATE, "spec.strategy", "rollout")
LEADERWORKERSET = Controller(
    "LeaderWorkerSet",
    LEADERWORKERSETS,
    (
        Template("leaderTemplate.", "spec.leaderWorkerTemplate.leaderTemplate"),
        Template("workerTemplate.", "spec.leaderWorkerTemplate.workerTemplate"),
    ),
    "spec.rolloutStrategy",
    "leaderworkerset",
)
CONTROLLERS = {c.name: c for c in (STATEFULSET, ROLLOUT, LEADERWORKERSET)}
"""The controllers :class:`detector.actuators.kubernetes.templates.ControllerCeilings` acts on."""


@dataclass(frozen=True, slots=True)
class StrategyPlan:
    """The strategy a ceilings patch leaves in place (None: the field stays absent) and why."""

    value: Any
    note: str


def dig(obj: Any, path: str) -> Any:
    """Return the value at dotted ``path`` in nested maps, or None."""
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def flags_text(engine: str, ceilings: Mapping[str, int | float | str]) -> str:
    """Return ``--max-num-seqs=13`` / ``env MAX_CONCURRENT_REQUESTS=8`` for people to set."""
    params = engine_params(engine)
    parts = []
    for name, value in ceilings.items():
        param = params.get(name)
        text = format_value(value)
        if param is None:
            parts.append(f"{name}={text}")
        elif param.default == "env" and param.env:
            parts.append(f"env {param.env}={text}")
        else:
            parts.append(f"{param.flag}={text}")
    return " ".join(parts)


def edit_command(resource: str, namespace: str, name: str) -> str:
    """Return ``kubectl -n NS edit RESOURCE NAME``."""
    return f"kubectl -n {namespace} edit {resource} {name}"


def patch_command(resource: str, namespace: str, name: str, body: Mapping[str, Any]) -> str:
    """Return ``kubectl -n NS patch RESOURCE NAME --type merge -p '{...}'``."""
    text = json.dumps(body, separators=(",", ":"))
    return f"kubectl -n {namespace} patch {resource} {name} --type merge -p '{text}'"


# StatefulSet ---------------------------------------------------------------------------------


def statefulset_strategy(obj: Mapping[str, Any], rollout: Rollout) -> StrategyPlan:
    """Return the StatefulSet's update strategy for a one-pod-at-a-time rollout, with notes.

    ``rollout`` is unused: a StatefulSet has no surge (it always takes a pod down first).
    """
    spec = obj.get("spec") or {}
    current = spec.get("updateStrategy")
    meta = obj.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    if (current or {}).get("type") == "OnDelete":
        note = (
            "updateStrategy OnDelete: the StatefulSet controller does not roll this out; each "
            "pod gets it only when it is deleted: the stagger_restarts step (one pod at a "
            f"time) is what rolls it out (by hand: kubectl -n {ns} delete pod {name}-N, one "
            "at a time, each after the one before is Ready)"
        )
        return StrategyPlan(current, note)
    rolling = (current or {}).get("rollingUpdate") or {}
    notes = []
    value = current
    if rolling.get("maxUnavailable", 1) != 1:
        value = deep_merge(current or {}, {"rollingUpdate": {"maxUnavailable": 1}})
        notes.append(
            f"rollingUpdate.maxUnavailable {rolling['maxUnavailable']} -> 1 so one pod at a "
            "time is replaced (revert restores it)"
        )
    else:
        notes.append("RollingUpdate: one pod at a time, highest ordinal first")
    partition = _int(rolling.get("partition"))
    if partition > 0:
        notes.append(_partition_note("pods", ns, name, partition, _int(spec.get("replicas"), 1)))
    return StrategyPlan(value, "; ".join(notes))


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _ordinals(name: str, first: int, last: int) -> str:
    """Return ``name-0`` or ``name-0 .. name-3``."""
    return f"{name}-{first}" if first == last else f"{name}-{first} .. {name}-{last}"


def _partition_note(unit: str, ns: str, name: str, partition: int, replicas: int) -> str:
    """Return the partition warning: which pods (or groups) the change will not reach."""
    kept = _ordinals(name, 0, min(partition, replicas) - 1)
    reached = _ordinals(name, partition, replicas - 1) if partition < replicas else "none"
    resource = "statefulset" if unit == "pods" else "leaderworkerset"
    field = "updateStrategy" if unit == "pods" else "rolloutStrategy"
    inner = "rollingUpdate" if unit == "pods" else "rollingUpdateConfiguration"
    lower = patch_command(resource, ns, name, {"spec": {field: {inner: {"partition": 0}}}})
    return (
        f"partition {partition}: the change reaches {unit} {reached} only; {unit} {kept} keep "
        "the old template even when restarted (they come back at the current revision). To "
        f"reach them, lower the partition by hand: {lower}"
    )


# Argo Rollout --------------------------------------------------------------------------------


def rollout_strategy(obj: Mapping[str, Any], rollout: Rollout) -> StrategyPlan:
    """Return the Rollout's strategy with a canary that replaces one pod at a time, and notes.

    Raises ActuatorError(``manual``) for a blueGreen strategy (see the module docstring).
    """
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    strategy = spec.get("strategy") or {}
    if "blueGreen" in strategy:
        raise ActuatorError(
            Reason.MANUAL,
            f"Rollout {ns}/{name} uses blueGreen: a template change brings up a whole preview "
            "ReplicaSet (a spare GPU for every replica) before the switch, not one pod at a "
            "time, so the detector does not start it during a GPU OOM cascade",
        )
    canary = strategy.get("canary") or {}
    wanted = ONE_AT_A_TIME[rollout]["rollingUpdate"]
    pair = (canary.get("maxSurge", "25%"), canary.get("maxUnavailable", "25%"))
    notes = []
    value: Any = strategy or None
    if pair in ((1, 0), (0, 1)):
        notes.append("canary: one pod at a time, maxSurge/maxUnavailable unchanged")
    else:
        value = deep_merge(strategy, {"canary": dict(wanted)})
        notes.append(
            f"canary maxSurge/maxUnavailable {pair[0]}/{pair[1]} -> "
            f"{wanted['maxSurge']}/{wanted['maxUnavailable']} so one pod at a time is "
            "replaced (revert restores them)"
        )
    steps = canary.get("steps") or []
    waits = [i for i, step in enumerate(steps, 1) if _indefinite_pause(step)]
    if waits:
        notes.append(
            f"the canary steps run as written: step {waits[0]} pauses until promoted "
            f"(kubectl argo rollouts promote -n {ns} {name})"
        )
    elif steps:
        notes.append(f"the {len(steps)} canary steps run as written")
    if spec.get("paused"):
        notes.append(
            f"the Rollout is paused (spec.paused): nothing rolls until it is resumed "
            f"(kubectl argo rollouts resume -n {ns} {name})"
        )
    return StrategyPlan(value, "; ".join(notes))


def _indefinite_pause(step: Mapping[str, Any]) -> bool:
    """Return True for a canary step ``pause: {}`` (no duration: it waits for a promotion)."""
    return "pause" in step and not (step["pause"] or {}).get("duration")


def workload_ref_note(obj: Mapping[str, Any]) -> str | None:
    """Return why a Rollout's template cannot be patched (``spec.workloadRef``), else None."""
    ref = (obj.get("spec") or {}).get("workloadRef")
    if not ref:
        return None
    meta = obj.get("metadata") or {}
    kind, name = ref.get("kind", "Deployment"), ref.get("name", "?")
    return (
        f"Rollout {meta.get('namespace')}/{meta.get('name')} takes its pod template from "
        f"{kind} {name} (spec.workloadRef): change the template there, and the Rollout rolls "
        "it out with its own strategy"
    )


# LeaderWorkerSet -----------------------------------------------------------------------------


def lws_strategy(obj: Mapping[str, Any], rollout: Rollout) -> StrategyPlan:
    """Return the LeaderWorkerSet's rollout strategy for one group at a time, with notes."""
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    current = spec.get("rolloutStrategy")
    config = (current or {}).get("rollingUpdateConfiguration") or {}
    pair = (config.get("maxSurge", 0), config.get("maxUnavailable", 1))
    notes = []
    value = current
    if pair in ((0, 1), (1, 0)):
        notes.append("one group (leader and workers) at a time, rolloutStrategy unchanged")
    else:
        wanted = ONE_AT_A_TIME[rollout]["rollingUpdate"]
        base = current or {"type": "RollingUpdate"}
        value = deep_merge(base, {"rollingUpdateConfiguration": dict(wanted)})
        extra = " (surge: a whole extra group needs its GPUs first)" if rollout == "surge" else ""
        notes.append(
            f"maxSurge/maxUnavailable {pair[0]}/{pair[1]} -> {wanted['maxSurge']}/"
            f"{wanted['maxUnavailable']} so one group at a time is replaced{extra} (revert "
            "restores them)"
        )
    partition = _int(config.get("partition"))
    if partition > 0:
        replicas = _int(spec.get("replicas"), 1)
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        notes.append(_partition_note("groups", ns, name, partition, replicas))
    return StrategyPlan(value, "; ".join(notes))


STRATEGIES = {
    STATEFULSET.name: statefulset_strategy,
    ROLLOUT.name: rollout_strategy,
    LEADERWORKERSET.name: lws_strategy,
}


# pod templates -------------------------------------------------------------------------------


def template_containers(
    controller: Controller, obj: Mapping[str, Any], wanted: str | None
) -> list[tuple[Template, dict[str, Any]]]:
    """Return (template, serving container) of every pod template that has one.

    The serving container is the one named ``wanted``, else a template's only container.
    Raises ActuatorError: ``not_found`` (no template has ``wanted``), ``invalid_request``
    (several containers in every template and none named).
    """
    found: list[tuple[Template, dict[str, Any]]] = []
    names: list[str] = []
    for template in controller.templates:
        containers = dig(obj, f"{template.path}.spec.containers") or []
        names += [str(c.get("name")) for c in containers]
        matches = [c for c in containers if c.get("name") == wanted] if wanted else containers
        if len(matches) == 1:
            found.append((template, dict(matches[0])))
    if found:
        return found
    meta = obj.get("metadata") or {}
    label = f"{controller.kind.label} {meta.get('namespace')}/{meta.get('name')}"
    if wanted:
        raise ActuatorError(
            Reason.NOT_FOUND, f"{label} has no container {wanted} ({', '.join(names)})"
        )
    raise ActuatorError(
        Reason.INVALID_REQUEST, f"{label} has containers {', '.join(names)}: name the serving one"
    )


def engine_templates(
    pairs: Sequence[tuple[Template, dict[str, Any]]], engine: str
) -> list[tuple[Template, dict[str, Any]]]:
    """Return the templates that get the ceilings: those whose container already sets one.

    When none does, the first (the leader's, or the only template): a worker that does not
    run the engine's command line (a Ray worker) is never given its flags.
    """
    setting = [(t, c) for t, c in pairs if ceiling_fields(c, engine)]
    return setting or list(pairs[:1])


def prefixed(prefix: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``fields`` with every key prefixed (``workerTemplate.containers[...]``)."""
    return {f"{prefix}{key}": value for key, value in fields.items()}


def unprefixed(prefix: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``fields`` of one template (keys with ``prefix``), without the prefix."""
    return {k[len(prefix) :]: v for k, v in fields.items() if k.startswith(prefix)}


def apply_container_entry(container: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``container`` with a ``container_patch`` entry applied, as the API server would.

    ``args``/``command`` are replaced, env entries merged by name (``$patch: delete`` removes
    one). For a JSON merge patch, which replaces a list whole.
    """
    out = dict(container)
    for where in ("args", "command"):
        if where in entry:
            out[where] = list(entry[where])
    if "env" in entry:
        env = [dict(e) for e in container.get("env") or []]
        for change in entry["env"]:
            index = next((i for i, e in enumerate(env) if e.get("name") == change["name"]), None)
            if change.get("$patch") == "delete":
                if index is not None:
                    env.pop(index)
            elif index is None:
                env.append(dict(change))
            else:
                env[index] = dict(change)
        if env:
            out["env"] = env
        else:
            out.pop("env", None)
    return out
