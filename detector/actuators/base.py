"""The actuator interface: plan -> diff, apply, verify, revert; results for the timeline.

An actuator owns a few text *targets* (config files, API objects rendered as text). ``plan``
reads their current content and returns the exact change as data (``Change``: target, before,
after; ``None`` means absent) with a unified diff for people. ``apply`` makes that change in one
transaction: write every target, ``validate`` the whole, ``activate`` it (reload, roll out);
if any stage fails, every target gets its previous content back (re-activated when activation
had started) and the result says whether that worked. ``revert`` applies the inverted plan
through the same transaction. ``verify`` checks the planned content is what is in place.

Rules every actuator keeps:

- dry-run by default: ``apply(plan)`` and ``revert(plan)`` only record the change they would
  make (status ``dry_run``) unless called with ``dry_run=False``;
- idempotent: the change is recomputed against the current content, so applying a plan whose
  content is already in place touches nothing and reports ``unchanged`` (empty diff);
- no half-applied change: on failure the previous content is restored (``restored``);
- errors become results: ``ActuatorError`` and ``OSError`` never escape apply, revert or verify.
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar

from detector.errors import DetectorError


class Reason(StrEnum):
    """Why an actuator operation failed: ``ActuatorError.reason`` and ``ActionResult.reason``.

    A member equals its string, so stored results and their JSON carry the plain code.
    """

    # the request, the settings or the target
    INVALID_REQUEST = "invalid_request"  # a bad value, step, plan or target: nothing was sent
    NOT_CONFIGURED = "not_configured"  # the settings name no object for this step's workload
    UNSUPPORTED = "unsupported"  # the object cannot be changed this way (shell string, valueFrom)
    MANUAL = "manual"  # the detector does not make this change: the error says what to do by hand
    NOT_FOUND = "not_found"  # the object does not exist (HTTP 404 too)
    # the actuator's own state
    IO_ERROR = "io_error"  # an OSError from a hook (reading or writing a file)
    LOCKED = "locked"  # another operation on the same target holds its lock
    DRIFT = "drift"  # the live content is not the planned one (verify, a late write)
    IRREVERSIBLE = "irreversible"  # the change cannot be undone (an evicted pod)
    ERROR = "error"  # the step runner caught an exception from plan_step, apply or revert
    # nginx
    NOT_RUNNING = "not_running"  # no running nginx master (from its pid file)
    BINARY_MISSING = "binary_missing"  # the nginx binary was not found
    CONFIG_INVALID = "config_invalid"  # ``nginx -t`` rejected the written configuration
    RELOAD_FAILED = "reload_failed"  # the reload failed or old workers still serve
    # transport
    TIMEOUT = "timeout"  # no answer (or no finished command or deploy) in time
    UNREACHABLE = "unreachable"  # could not connect (admin APIs: or the connection failed)
    CONNECTION_LOST = "connection_lost"  # the Kubernetes API connection broke mid-request
    BAD_RESPONSE = "bad_response"  # an answer the actuator cannot use (not JSON, fields missing)
    # HTTP error statuses of the admin APIs and the Kubernetes API
    BAD_REQUEST = "bad_request"  # 400 or 422
    FORBIDDEN = "forbidden"  # 401 or 403
    NOT_ALLOWED = "not_allowed"  # 405
    CONFLICT = "conflict"  # 409
    THROTTLED = "throttled"  # 429
    SERVER_ERROR = "server_error"  # 5xx
    HTTP_ERROR = "http_error"  # any other 4xx
    # refusals specific to one system
    NO_ADMIN_LAYER = "no_admin_layer"  # Envoy has no admin runtime layer to write to
    READ_ONLY = "read_only"  # a DB-less Kong refuses Admin API writes (405)
    EXPLICIT_MODE_REQUIRED = "explicit_mode_required"  # Triton not in explicit model control
    NOT_DECLARATIVE = "not_declarative"  # a Ray Serve app without a deployed_app_config
    DEPLOY_FAILED = "deploy_failed"  # Ray Serve reports DEPLOY_FAILED
    ROLLOUT_STALLED = "rollout_stalled"  # a Deployment rollout stopped progressing
    PDB_BLOCKED = "pdb_blocked"  # a PodDisruptionBudget refused the eviction
    NOT_ACCEPTED = "not_accepted"  # Envoy Gateway did not accept the BackendTrafficPolicy


class ActuatorError(DetectorError):
    """An actuator could not plan, apply, verify or revert a change.

    ``reason`` says why, as a ``Reason`` member; the message gives the detail.
    """

    reason: Reason

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(reason, detail)  # the tree's one constructor, ``reason`` typed


class ActivationRefused(ActuatorError):
    """Activation was refused before anything went live (e.g. the reload command failed).

    Raised by ``activate`` only when the old configuration is certainly still the live one,
    so a restore writes the targets back without activating them again.
    """


class Status(StrEnum):
    """Outcome of one actuator operation."""

    OK = "ok"  # the change is in place (apply, revert) or checked (verify)
    UNCHANGED = "unchanged"  # the content was already in place: nothing written or reloaded
    DRY_RUN = "dry_run"  # the change was recorded, not made
    FAILED = "failed"  # nothing changed, or the previous state was restored (see ``restored``)


class Operation(StrEnum):
    """Which actuator operation a result is for."""

    APPLY = "apply"
    REVERT = "revert"
    VERIFY = "verify"


def _label(target: str, content: str | None, side: str) -> str:
    return "/dev/null" if content is None else f"{side}/{target.lstrip('/')}"


@dataclass(frozen=True, slots=True)
class Change:
    """One target's content before and after a change; ``None`` means the target is absent."""

    target: str
    before: str | None
    after: str | None

    @property
    def diff(self) -> str:
        """Return the unified diff (``a/`` before, ``b/`` after; empty when nothing changes)."""
        if self.before == self.after:
            return ""
        lines = difflib.unified_diff(
            (self.before or "").splitlines(keepends=True),
            (self.after or "").splitlines(keepends=True),
            fromfile=_label(self.target, self.before, "a"),
            tofile=_label(self.target, self.after, "b"),
        )
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

    def inverted(self) -> Change:
        """Return the change that undoes this one."""
        return Change(self.target, self.after, self.before)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"content must be str or None, got {type(value).__name__}")


def _diff(changes: tuple[Change, ...]) -> str:
    return "".join(change.diff for change in changes)


def _changes_record(changes: tuple[Change, ...]) -> list[dict[str, str | None]]:
    return [{"target": c.target, "before": c.before, "after": c.after} for c in changes]


@dataclass(frozen=True, slots=True)
class Plan:
    """The exact change an actuator would make: ``changes`` read against the current content.

    ``action`` is the runbook action (``enable_rate_limit`` ...); ``target`` names the system
    acted on (``nginx:/etc/nginx/nginx.conf``); ``summary`` says what the change means.
    """

    action: str
    target: str
    changes: tuple[Change, ...]
    summary: str = ""

    @property
    def diff(self) -> str:
        """Return the unified diff of every change (empty when the plan changes nothing)."""
        return _diff(self.changes)

    @property
    def is_empty(self) -> bool:
        """Return True when every target already has its planned content."""
        return all(change.before == change.after for change in self.changes)

    def inverted(self) -> Plan:
        """Return the plan that puts every target back to its content before this plan."""
        return replace(self, changes=tuple(change.inverted() for change in self.changes))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Plan:
        """Rebuild a plan from ``Plan.as_record`` or ``ActionResult.as_record`` data.

        So a change kept on the timeline can be reverted after a restart. Raises
        ActuatorError (``invalid_request``) when a key is missing or has the wrong type.
        """
        try:
            changes = tuple(
                Change(str(c["target"]), _text(c["before"]), _text(c["after"]))
                for c in record["changes"]
            )
            summary = str(record.get("summary") or "")
            return cls(str(record["action"]), str(record["target"]), changes, summary)
        except (KeyError, TypeError) as exc:
            raise ActuatorError(Reason.INVALID_REQUEST, f"not a plan record: {exc!r}") from exc

    def as_record(self) -> dict[str, Any]:
        """Return the plan as JSON-ready data (action, target, summary, diff, changes)."""
        return {
            "action": self.action,
            "target": self.target,
            "summary": self.summary,
            "diff": self.diff,
            "changes": _changes_record(self.changes),
        }


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What one apply, revert or verify did, ready for an incident's timeline.

    ``changes`` are the changes made (``ok``), that would be made (``dry_run``), that were
    attempted (``failed``), or, for verify, the drift found (current -> planned). ``reason`` is
    a ``Reason`` and ``error`` its message, both None unless ``failed``.
    ``restored`` is True when a failed operation left the previous state in place (nothing had
    been written, or every target was written back and, unless activation was refused
    outright, re-activated); False means the live state is unknown and needs a person.
    """

    action: str
    target: str
    operation: Operation
    status: Status
    changes: tuple[Change, ...] = ()
    summary: str = ""
    reason: Reason | None = None
    error: str | None = None
    restored: bool = False

    @property
    def diff(self) -> str:
        """Return the unified diff of ``changes``."""
        return _diff(self.changes)

    @property
    def ok(self) -> bool:
        """Return True unless the operation failed."""
        return self.status is not Status.FAILED

    def message(self) -> str:
        """Return one line for the timeline: action, operation, target, status and error."""
        text = f"{self.action} {self.operation.value} on {self.target}: {self.status.value}"
        if self.summary:
            text += f" ({self.summary})"
        if self.status is Status.FAILED:
            state = "previous state restored" if self.restored else "previous state NOT restored"
            text += f" - {self.reason}: {self.error}; {state}"
        return text

    def as_record(self) -> dict[str, Any]:
        """Return the result as JSON-ready data for ``RunbookStep.result`` and the timeline."""
        return {
            "action": self.action,
            "target": self.target,
            "operation": self.operation.value,
            "status": self.status.value,
            "summary": self.summary,
            "diff": self.diff,
            "changes": _changes_record(self.changes),
            "reason": self.reason,
            "error": self.error,
            "restored": self.restored,
        }


class Actuator(ABC):
    """Base of every actuator: subclasses give read/write/validate/activate, this does the rest.

    Subclasses implement ``read`` and ``write`` for their targets, ``validate`` (the whole
    configuration, after writing, before activating), ``activate`` (make it live), and may
    override ``preflight`` (can a change land at all?), ``check_live`` (used by verify) and
    ``lock`` (serialize concurrent operations). Those hooks raise ``ActuatorError`` or
    ``OSError``; ``apply``, ``revert`` and ``verify`` turn them into an ``ActionResult``.
    """

    action: ClassVar[str]

    @property
    @abstractmethod
    def target(self) -> str:
        """Return the name of the system acted on, for results and the timeline."""

    @abstractmethod
    def read(self, target: str) -> str | None:
        """Return the current content of ``target``, or None when it is absent."""

    @abstractmethod
    def write(self, target: str, content: str | None) -> None:
        """Replace ``target`` with ``content`` atomically (None: remove it)."""

    @abstractmethod
    def validate(self) -> None:
        """Check the written configuration as a whole; raise ActuatorError when invalid."""

    @abstractmethod
    def activate(self) -> None:
        """Make the written configuration live; raise ActuatorError when that fails."""

    def preflight(self) -> None:
        """Check that a change can land (e.g. the service runs); default: nothing to check."""
        return None

    def check_live(self) -> None:
        """Check that the service is up with the configuration in place; default: nothing."""
        return None

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold a lock for one operation; default: none."""
        yield

    def plan_contents(self, desired: Mapping[str, str | None], summary: str = "") -> Plan:
        """Return the plan that gives each target in ``desired`` its content.

        Raises ActuatorError (``io_error``) when a target cannot be read.
        """
        try:
            changes = tuple(Change(t, self.read(t), after) for t, after in desired.items())
        except OSError as exc:
            raise ActuatorError(Reason.IO_ERROR, f"cannot read the current content: {exc}") from exc
        return Plan(self.action, self.target, changes, summary)

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Give every target of ``plan`` its planned content; dry-run unless told otherwise."""
        return self._transact(plan, Operation.APPLY, dry_run=dry_run)

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Put every target of ``plan`` back to its content before it; dry-run by default."""
        return self._transact(plan.inverted(), Operation.REVERT, dry_run=dry_run)

    def verify(self, plan: Plan) -> ActionResult:
        """Check that every target holds its planned content, validates, and is live."""
        drift: tuple[Change, ...] = ()
        try:
            with self.lock():
                drift = self._pending(plan)
                if drift:
                    names = ", ".join(change.target for change in drift)
                    raise ActuatorError(Reason.DRIFT, f"not the planned content: {names}")
                self.validate()
                self.check_live()
        except (ActuatorError, OSError) as exc:
            reason, error = _reason(exc)
            changes = drift if reason == Reason.DRIFT else ()
            return self._result(plan, Operation.VERIFY, Status.FAILED, changes, reason, error)
        return self._result(plan, Operation.VERIFY, Status.OK)

    def _pending(self, plan: Plan) -> tuple[Change, ...]:
        """Return current -> planned for every target not yet at its planned content."""
        current = ((change, self.read(change.target)) for change in plan.changes)
        return tuple(Change(c.target, now, c.after) for c, now in current if now != c.after)

    def _transact(self, plan: Plan, operation: Operation, *, dry_run: bool) -> ActionResult:
        try:
            with self.lock():
                pending = self._pending(plan)
                if not pending:
                    return self._result(plan, operation, Status.UNCHANGED)
                if dry_run:
                    return self._result(plan, operation, Status.DRY_RUN, pending)
                self.preflight()
                return self._commit(plan, operation, pending)
        except (ActuatorError, OSError) as exc:  # raised before anything was written
            reason, error = _reason(exc)
            result = self._result(plan, operation, Status.FAILED, (), reason, error)
            return replace(result, restored=True)

    def _commit(
        self, plan: Plan, operation: Operation, pending: tuple[Change, ...]
    ) -> ActionResult:
        written: list[Change] = []
        activating = False
        try:
            for change in pending:
                self.write(change.target, change.after)  # atomic: a failed write changed nothing
                written.append(change)
            self.validate()
            activating = True
            self.activate()
        except (ActuatorError, OSError) as exc:
            reason, error = _reason(exc)
            reactivate = activating and not isinstance(exc, ActivationRefused)
            restored, note = self._restore(written, reactivate=reactivate)
            result = self._result(
                plan, operation, Status.FAILED, pending, reason, f"{error}; {note}"
            )
            return replace(result, restored=restored)
        return self._result(plan, operation, Status.OK, pending)

    def _restore(self, written: list[Change], *, reactivate: bool) -> tuple[bool, str]:
        """Write back every written target (re-activating if needed); return (ok, note)."""
        try:
            for change in reversed(written):
                self.write(change.target, change.before)
            if not reactivate:
                return True, "previous content restored, never activated"
            self.validate()
            self.activate()
        except (ActuatorError, OSError) as exc:
            return False, f"restoring the previous state failed too: {exc}"
        return True, "previous content restored and re-activated"

    def _result(
        self,
        plan: Plan,
        operation: Operation,
        status: Status,
        changes: tuple[Change, ...] = (),
        reason: Reason | None = None,
        error: str | None = None,
    ) -> ActionResult:
        return ActionResult(
            action=plan.action,
            target=plan.target,
            operation=operation,
            status=status,
            changes=changes,
            summary=plan.summary,
            reason=reason,
            error=error,
        )


def _reason(exc: ActuatorError | OSError) -> tuple[Reason, str]:
    """Return (reason code, message) for an error raised by an actuator hook."""
    if isinstance(exc, ActuatorError):
        return exc.reason, exc.detail or exc.reason
    return Reason.IO_ERROR, str(exc)
