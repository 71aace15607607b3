"""The actuator transaction (plan, dry-run, apply, verify, revert, restore) on an in-memory fake."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import pytest

from detector.actuators.base import (
    ActionResult,
    ActivationRefused,
    Actuator,
    ActuatorError,
    Change,
    Operation,
    Plan,
    Status,
)


class FakeActuator(Actuator):
    """Targets in a dict; each hook fails on demand; every activation is counted."""

    action: ClassVar[str] = "enable_rate_limit"

    def __init__(self, **files: str) -> None:
        self.files: dict[str, str] = dict(files)
        self.live: dict[str, str] = dict(files)
        self.activations = 0
        self.fail_write: str | None = None  # target whose write raises OSError
        self.invalid: str | None = None  # content that fails validate
        self.activate_errors: list[ActuatorError] = []  # raised by the next activations
        self.preflight_error: ActuatorError | None = None
        self.locked = False

    @property
    def target(self) -> str:
        return "fake:gateway"

    def read(self, target: str) -> str | None:
        return self.files.get(target)

    def write(self, target: str, content: str | None) -> None:
        if target == self.fail_write:
            raise OSError(28, "No space left on device")
        if content is None:
            self.files.pop(target, None)
        else:
            self.files[target] = content

    def validate(self) -> None:
        if self.invalid is not None and self.invalid in self.files.values():
            raise ActuatorError("config_invalid", f"bad line {self.invalid!r}")

    def activate(self) -> None:
        self.activations += 1
        if self.activate_errors:
            raise self.activate_errors.pop(0)
        self.live = dict(self.files)

    def preflight(self) -> None:
        if self.preflight_error is not None:
            raise self.preflight_error

    @contextmanager
    def lock(self) -> Iterator[None]:
        if self.locked:
            raise ActuatorError("locked", "busy")
        yield


OLD = {"http.conf": "# none\n", "location.conf": "# none\n"}
NEW = {"http.conf": "zone rate=2r/s;\n", "location.conf": "limit_req zone;\n"}


def plan_new(fake: FakeActuator) -> Plan:
    return fake.plan_contents(NEW, "2 r/s")


def test_plan_holds_before_and_after_and_a_unified_diff() -> None:
    fake = FakeActuator(**OLD)
    plan = plan_new(fake)
    assert plan.changes == (
        Change("http.conf", "# none\n", "zone rate=2r/s;\n"),
        Change("location.conf", "# none\n", "limit_req zone;\n"),
    )
    assert plan.diff.splitlines()[:5] == [
        "--- a/http.conf",
        "+++ b/http.conf",
        "@@ -1 +1 @@",
        "-# none",
        "+zone rate=2r/s;",
    ]
    assert not plan.is_empty
    assert plan.inverted().inverted() == plan


def test_diff_of_a_new_or_removed_target_names_dev_null() -> None:
    assert Change("/etc/x.conf", None, "a\n").diff.splitlines()[:2] == [
        "--- /dev/null",
        "+++ b/etc/x.conf",
    ]
    assert Change("x", "a", None).diff.splitlines()[:2] == ["--- a/x", "+++ /dev/null"]
    assert Change("x", "same", "same").diff == ""


def test_dry_run_is_the_default_and_changes_nothing() -> None:
    fake = FakeActuator(**OLD)
    plan = plan_new(fake)
    result = fake.apply(plan)
    assert (result.status, result.operation) == (Status.DRY_RUN, Operation.APPLY)
    assert result.diff == plan.diff
    assert fake.files == OLD and fake.activations == 0
    assert fake.revert(plan).status is Status.UNCHANGED  # nothing to revert yet


def test_apply_then_reapply_is_unchanged_then_revert_restores() -> None:
    fake = FakeActuator(**OLD)
    plan = plan_new(fake)
    applied = fake.apply(plan, dry_run=False)
    assert applied.status is Status.OK and applied.ok
    assert fake.files == NEW == fake.live and fake.activations == 1

    again = fake.apply(plan, dry_run=False)
    assert (again.status, again.diff, again.changes) == (Status.UNCHANGED, "", ())
    assert fake.activations == 1
    assert plan_new(fake).is_empty

    assert fake.verify(plan).status is Status.OK
    reverted = fake.revert(plan, dry_run=False)
    assert (reverted.status, reverted.operation) == (Status.OK, Operation.REVERT)
    assert fake.files == OLD == fake.live and fake.activations == 2
    assert reverted.summary == "2 r/s"
    assert fake.revert(plan, dry_run=False).status is Status.UNCHANGED


def test_apply_recomputes_against_the_current_content() -> None:
    fake = FakeActuator(**OLD)
    plan = plan_new(fake)
    fake.files["http.conf"] = NEW["http.conf"]  # one file already in place
    result = fake.apply(plan, dry_run=False)
    assert [c.target for c in result.changes] == ["location.conf"]


def test_invalid_config_is_written_back_and_never_activated() -> None:
    fake = FakeActuator(**OLD)
    fake.invalid = NEW["location.conf"]
    result = fake.apply(plan_new(fake), dry_run=False)
    assert (result.status, result.reason, result.restored) == (
        Status.FAILED,
        "config_invalid",
        True,
    )
    assert "never activated" in (result.error or "")
    assert fake.files == OLD and fake.activations == 0
    assert len(result.changes) == 2  # what was attempted, for the timeline


def test_failed_write_restores_the_targets_already_written() -> None:
    fake = FakeActuator(**OLD)
    fake.fail_write = "location.conf"
    result = fake.apply(plan_new(fake), dry_run=False)
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "io_error", True)
    assert "No space left" in (result.error or "")
    assert fake.files == OLD and fake.activations == 0


def test_failed_activation_restores_and_activates_the_old_content() -> None:
    fake = FakeActuator(**OLD)
    fake.activate_errors = [ActuatorError("timeout", "reload ran over 10 s")]
    result = fake.apply(plan_new(fake), dry_run=False)
    assert (result.status, result.reason, result.restored) == (Status.FAILED, "timeout", True)
    assert "restored and re-activated" in (result.error or "")
    assert fake.files == OLD == fake.live and fake.activations == 2


def test_refused_activation_restores_without_activating_again() -> None:
    fake = FakeActuator(**OLD)
    fake.activate_errors = [ActivationRefused("reload_failed", "exited 1")]
    result = fake.apply(plan_new(fake), dry_run=False)
    assert (result.reason, result.restored) == ("reload_failed", True)
    assert fake.files == OLD and fake.activations == 1


def test_failed_reactivation_says_not_restored() -> None:
    fake = FakeActuator(**OLD)
    fake.activate_errors = [
        ActuatorError("reload_failed", "no new worker"),
        ActuatorError("reload_failed", "no new worker"),
    ]
    result = fake.apply(plan_new(fake), dry_run=False)
    assert (result.status, result.restored) == (Status.FAILED, False)
    assert "restoring the previous state failed too" in (result.error or "")
    assert result.message().endswith("previous state NOT restored")
    assert fake.files == OLD


@pytest.mark.parametrize("where", ["preflight", "lock"])
def test_errors_before_writing_leave_everything_as_it_was(where: str) -> None:
    fake = FakeActuator(**OLD)
    if where == "preflight":
        fake.preflight_error = ActuatorError("not_running", "no master")
    else:
        fake.locked = True
    result = fake.apply(plan_new(fake), dry_run=False)
    assert result.status is Status.FAILED and result.restored
    assert result.reason == ("not_running" if where == "preflight" else "locked")
    assert fake.files == OLD and fake.activations == 0


def test_verify_reports_drift_as_current_to_planned() -> None:
    fake = FakeActuator(**OLD)
    plan = plan_new(fake)
    fake.apply(plan, dry_run=False)
    fake.files["location.conf"] = "# edited by hand\n"
    result = fake.verify(plan)
    assert (result.status, result.reason, result.operation) == (
        Status.FAILED,
        "drift",
        Operation.VERIFY,
    )
    assert result.changes == (Change("location.conf", "# edited by hand\n", NEW["location.conf"]),)


def test_plan_translates_read_errors() -> None:
    class Unreadable(FakeActuator):
        def read(self, target: str) -> str | None:
            raise PermissionError(13, "Permission denied", target)

    with pytest.raises(ActuatorError) as caught:
        Unreadable().plan_contents(NEW)
    assert caught.value.reason == "io_error"


def test_result_record_is_json_and_message_is_one_line() -> None:
    fake = FakeActuator(**OLD)
    result = fake.apply(plan_new(fake), dry_run=False)
    record = json.loads(json.dumps(result.as_record()))
    assert record["status"] == "ok" and record["operation"] == "apply"
    assert record["changes"][0] == {
        "target": "http.conf",
        "before": "# none\n",
        "after": "zone rate=2r/s;\n",
    }
    assert record["diff"] == result.diff
    assert result.message() == "enable_rate_limit apply on fake:gateway: ok (2 r/s)"
    plan_record = json.loads(json.dumps(plan_new(FakeActuator(**OLD)).as_record()))
    assert plan_record["summary"] == "2 r/s"


def test_results_are_frozen() -> None:
    result = ActionResult("a", "t", Operation.APPLY, Status.OK)
    with pytest.raises(AttributeError):
        result.status = Status.FAILED  # type: ignore[misc]


def test_plan_and_result_records_rebuild_the_plan_for_a_later_revert() -> None:
    fake = FakeActuator(**OLD)
    plan = plan_new(fake)
    applied = fake.apply(plan, dry_run=False)
    for record in (plan.as_record(), applied.as_record()):
        rebuilt = Plan.from_record(json.loads(json.dumps(record)))
        assert rebuilt == plan
    assert fake.revert(Plan.from_record(applied.as_record()), dry_run=False).status is Status.OK
    assert fake.files == OLD


BAD_CHANGE = {"target": "x", "before": 1, "after": None}


@pytest.mark.parametrize(
    "record",
    [
        {},
        {"action": "a", "target": "t", "changes": [{"target": "x"}]},
        {"action": "a", "target": "t", "changes": [BAD_CHANGE]},
    ],
)
def test_bad_plan_records_are_refused(record: dict[str, object]) -> None:
    with pytest.raises(ActuatorError) as caught:
        Plan.from_record(record)
    assert caught.value.reason == "invalid_request"
