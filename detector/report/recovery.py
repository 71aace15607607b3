"""Who contained an incident: its containment, or its pods coming back by themselves.

The correlator calls an incident ``contained`` after no new GPU OOM for ``contained_after_s``
and 5xx under threshold, whatever brought that about. The read model says which, once, on each
``stage -> contained`` timeline entry (``attribute``, run by ``IncidentOut``): its ``detail``
gets the ``Recovery`` and its message ends with ``Recovery.text``, so every face that shows
the stage (console, Slack, web page, postmortem) shows the attribution with it.

The rule, decided from the incident's own timeline alone, over the entries recorded before the
stage entry (lower ``id``: the store's order, so a later entry never changes it):

- a step is *in force* once an entry says it acted on the cluster: ``applied`` or
  ``restarted`` with ``mode`` ``live`` and a state other than ``failed`` (a failed apply
  restored the previous state or says it did not); it stops being in force when an entry says
  it was undone: ``rolled_back`` to state ``rolled_back``, or ``removed`` to state ``lifted``.
  A ``withdrawn`` step never acted (its precondition went before it did). Relaxations
  (``lifted``) and resizes leave a step in force.
- ``containment`` when at least one step is in force at the stage change; otherwise the cascade
  stopped without containment (``pods``: no new death and the 5xx under the threshold, which
  says nothing of whether a dead pod is back): no step had changed the cluster (dry-run steps only
  recorded what they would do: ``dry_run_steps``), or what changed it had been undone
  (``reverted_steps``).

Entry shapes: ``detector.incidents.schemas.TimelineEntryOut``; a step entry's ``detail`` is
``detector.runbooks.transitions.Transition.detail()`` (step, position, event, state, mode).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from detector.incidents.schemas import TimelineEntryOut
from detector.runbooks.steps import StepState
from detector.runbooks.transitions import ACTUATOR_MOVES, Move

CONTAINED_HEAD = "stage -> contained"
ACTED = frozenset({Move.APPLY.value, Move.RESTART.value})  # moves that change the cluster
UNDONE = {
    Move.ROLLBACK.value: StepState.ROLLED_BACK.value,
    Move.REMOVE.value: StepState.LIFTED.value,
}
MOVED = frozenset(m.value for m in ACTUATOR_MOVES)
LIVE = "live"


class RecoveredBy(StrEnum):
    """What brought an incident to ``contained``."""

    CONTAINMENT = "containment"  # a step that changed the cluster was in force
    PODS = "pods"  # no step changed the cluster: the cascade stopped without containment


@dataclass(frozen=True, slots=True)
class StepRef:
    """A runbook step as the timeline names it: its 1-based position and its step id."""

    position: int
    step: str

    def __str__(self) -> str:
        return f"{self.position} {self.step}"


@dataclass(frozen=True, slots=True)
class Recovery:
    """The attribution of one ``contained`` stage change (the rule: the module docstring).

    ``in_force``: the steps that changed the cluster and were still in force at the stage
    change, by position; ``dry_run_steps``: the steps that moved in dry-run only;
    ``reverted_steps``: the steps that changed the cluster and were undone before it.
    """

    by: RecoveredBy
    in_force: tuple[StepRef, ...] = ()
    dry_run_steps: tuple[StepRef, ...] = ()
    reverted_steps: tuple[StepRef, ...] = ()

    @property
    def text(self) -> str:
        """Return the attribution in one phrase, e.g. ``containment did it (steps 1
        lower_batch_ceiling, 3 enable_rate_limit applied)``."""
        if self.by is RecoveredBy.CONTAINMENT:
            return f"containment did it ({_steps(self.in_force)} applied)"
        if self.reverted_steps:
            why = ["no step in force", f"{_steps(self.reverted_steps)} undone before"]
        else:
            why = ["no step changed the cluster"]
        if self.dry_run_steps:
            why.append("dry-run")
        elif not self.reverted_steps:
            why.append("none was applied")
        return f"the cascade stopped without containment ({'; '.join(why)})"

    def as_detail(self) -> dict[str, Any]:
        """Return the stage entry's ``detail``: recovered_by, steps, dry_run_steps,
        reverted_steps (lists of {position, step}) and attribution (``text``)."""

        def refs(steps: tuple[StepRef, ...]) -> list[dict[str, Any]]:
            return [{"position": s.position, "step": s.step} for s in steps]

        return {
            "recovered_by": self.by.value,
            "steps": refs(self.in_force),
            "dry_run_steps": refs(self.dry_run_steps),
            "reverted_steps": refs(self.reverted_steps),
            "attribution": self.text,
        }


def _steps(steps: tuple[StepRef, ...]) -> str:
    """Return ``step 3 enable_rate_limit`` or ``steps 1 lower_batch_ceiling, 3 ...``."""
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(str(s) for s in steps)


def is_contained(entry: TimelineEntryOut) -> bool:
    """Return whether ``entry`` is a ``stage -> contained`` entry."""
    return entry.kind == "stage" and entry.message.split(":", 1)[0].strip() == CONTAINED_HEAD


def recovery(earlier: Sequence[Mapping[str, Any] | None]) -> Recovery:
    """Return the attribution of a stage change from the ``detail`` of the step entries
    recorded before it, in the order they were recorded (the rule: the module docstring)."""
    in_force: dict[int, StepRef] = {}
    dry: dict[int, StepRef] = {}
    reverted: dict[int, StepRef] = {}
    for d in earlier:
        event = (d or {}).get("event")
        if d is None or event not in MOVED or not isinstance(d.get("position"), int):
            continue
        ref = StepRef(d["position"], str(d.get("step") or ""))
        if d.get("mode") != LIVE:
            dry.setdefault(ref.position, ref)
        elif event in ACTED and d.get("state") != StepState.FAILED.value:
            in_force[ref.position] = ref
            reverted.pop(ref.position, None)
        elif UNDONE.get(str(event)) == d.get("state") and ref.position in in_force:
            reverted[ref.position] = in_force.pop(ref.position)
    if in_force:
        return Recovery(RecoveredBy.CONTAINMENT, _sorted(in_force), _sorted(dry))
    return Recovery(RecoveredBy.PODS, (), _sorted(dry), _sorted(reverted))


def _sorted(steps: Mapping[int, StepRef]) -> tuple[StepRef, ...]:
    return tuple(steps[p] for p in sorted(steps))


def attribute(timeline: Sequence[TimelineEntryOut]) -> list[TimelineEntryOut]:
    """Return ``timeline`` (same order) with each ``contained`` stage entry attributed: its
    ``detail`` is ``Recovery.as_detail()``, its message ends with ``; `` + the attribution.

    An entry attributed already (a re-read dump) is kept as it is.
    """
    by_id = sorted(timeline, key=lambda e: e.id)
    done: dict[int, TimelineEntryOut] = {}
    for i, entry in enumerate(by_id):
        if not is_contained(entry) or (entry.detail or {}).get("recovered_by"):
            continue
        found = recovery([e.detail for e in by_id[:i] if e.kind == "step"])
        update = {"detail": found.as_detail(), "message": f"{entry.message}; {found.text}"}
        done[entry.id] = entry.model_copy(update=update)
    return [done.get(e.id, e) for e in timeline]
