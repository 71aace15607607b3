"""The runbook schema is strict and the loader's errors name the file and the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from detector.errors import RunbookError
from detector.runbooks.definition import Action, Floors, Runbook
from detector.runbooks.loader import default_runbook_path, load_runbook


def minimal() -> dict[str, Any]:
    step = {
        "id": "lower_batch_ceiling",
        "action": "lower_batch_ceiling",
        "title": "Lower",
        "description": "Lower the ceiling.",
        "params": {"workload": "{{ workload }}"},
        "approval": "auto",
        "verify": {"deadline_s": 60, "checks": ["ooms_stop"]},
        "on_failure": "escalate",
        "cooldown_s": 30,
        "floors": {"batch_ceiling": 1},
    }
    guidance = {"id": "g", "title": "G", "description": "Do g."}
    return {
        "version": 1,
        "name": "test-runbook",
        "title": "Test",
        "description": "A test runbook.",
        "max_actions_per_hour": 3,
        "steps": [step],
        "remediation": [guidance],
        "prevention": [guidance],
    }


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "runbook.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_minimal_runbook_loads(tmp_path: Path) -> None:
    runbook = load_runbook(write(tmp_path, minimal()))
    assert runbook.steps[0].action is Action.LOWER_BATCH_CEILING
    assert runbook.steps[0].approver is None
    assert runbook.step("lower_batch_ceiling").cooldown_s == 30


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    node: Any = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node[key]
    last = keys[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value


INVALID: list[tuple[str, str, Any, str]] = [
    ("unknown top-level key", "extra", 1, "extra: Extra inputs are not permitted"),
    ("unknown step key", "steps.0.timeout", 5, "steps[0] (lower_batch_ceiling).timeout"),
    (
        "unknown action",
        "steps.0.action",
        "delete_namespace",
        "steps[0] (lower_batch_ceiling).action",
    ),
    ("bad approval", "steps.0.approval", "maybe", "steps[0] (lower_batch_ceiling).approval"),
    ("bad approver", "steps.0.approval", "approver:", "approval"),
    ("unknown check", "steps.0.verify.checks", ["vibes"], "verify.checks[0]"),
    ("empty checks", "steps.0.verify.checks", [], "verify.checks"),
    (
        "repeated check",
        "steps.0.verify.checks",
        ["ooms_stop", "ooms_stop"],
        "checks must not repeat",
    ),
    ("zero deadline", "steps.0.verify.deadline_s", 0, "verify.deadline_s"),
    ("bad on_failure", "steps.0.on_failure", "ignore", "on_failure"),
    ("negative cooldown", "steps.0.cooldown_s", -1, "cooldown_s"),
    ("string cooldown", "steps.0.cooldown_s", "30", "cooldown_s"),
    ("bool version", "version", True, "version"),
    ("unknown floor", "steps.0.floors.max_gpus", 1, "floors.max_gpus"),
    ("zero floor", "steps.0.floors.batch_ceiling", 0, "floors.batch_ceiling"),
    ("non-string param", "steps.0.params.workload", 3, "params.workload"),
    ("bad param name", "steps.0.params", {"Bad-Name": "x"}, "params.Bad-Name"),
    ("no steps", "steps", [], "steps"),
    ("missing field", "steps.0.title", None, "steps[0] (lower_batch_ceiling).title"),
    ("no remediation", "remediation", [], "remediation"),
]


@pytest.mark.parametrize(
    ("path", "value", "fragment"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_runbook_names_file_and_field(
    tmp_path: Path, path: str, value: Any, fragment: str
) -> None:
    data = minimal()
    set_path(data, path, value)
    if value is None:
        del data["steps"][0]["title"]
    file = write(tmp_path, data)
    with pytest.raises(RunbookError) as info:
        load_runbook(file)
    assert str(file) in str(info.value)
    assert fragment in str(info.value)


def test_duplicate_step_ids(tmp_path: Path) -> None:
    data = minimal()
    second = copy.deepcopy(data["steps"][0])
    second["floors"] = {}
    data["steps"].append(second)
    with pytest.raises(RunbookError, match="repeated: lower_batch_ceiling"):
        load_runbook(write(tmp_path, data))


def test_floor_set_in_two_steps(tmp_path: Path) -> None:
    data = minimal()
    second = copy.deepcopy(data["steps"][0])
    second["id"] = "again"
    data["steps"].append(second)
    with pytest.raises(RunbookError, match="floor 'batch_ceiling' set in both"):
        load_runbook(write(tmp_path, data))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("steps: [\n", "invalid YAML at line"),
        ("version: 1\nversion: 2\n", "duplicate key 'version'"),
        ("- a\n- b\n", "must be a mapping, got list"),
        ("", "must be a mapping, got NoneType"),
        ("x: !!python/object:os.system {}\n", "invalid YAML"),
    ],
)
def test_bad_yaml(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RunbookError) as info:
        load_runbook(path)
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RunbookError, match="cannot read runbook"):
        load_runbook(tmp_path / "nope.yaml")


def test_template_syntax_error_is_caught_at_load(tmp_path: Path) -> None:
    data = minimal()
    data["steps"][0]["params"]["broken"] = "{% if x %}"
    file = write(tmp_path, data)
    with pytest.raises(RunbookError) as info:
        load_runbook(file)
    text = str(info.value)
    assert str(file) in text
    assert "step 'lower_batch_ceiling' param 'broken': template syntax error" in text


def test_floors_merge_across_steps() -> None:
    runbook = load_runbook(default_runbook_path())
    assert runbook.floors() == Floors(
        batch_ceiling=1, batched_tokens=512, rate_limit_rps=1, limit_connections=1, spacing_s=60
    )


def test_models_are_frozen() -> None:
    runbook = Runbook.model_validate(minimal())
    with pytest.raises(ValueError):
        runbook.steps[0].cooldown_s = 5  # type: ignore[misc]


def test_step_lookup_unknown_id() -> None:
    with pytest.raises(KeyError):
        Runbook.model_validate(minimal()).step("nope")


@pytest.mark.parametrize(
    ("action", "fields", "policy", "approval"),
    [
        ("lower_batch_ceiling", {}, "approval", "approver:approvers"),  # restarts pods
        ("stagger_restarts", {}, "approval", "approver:approvers"),
        ("enable_rate_limit", {}, "auto", "auto"),  # restarts nothing
        ("stagger_restarts", {"approval": "auto"}, "auto", "auto"),
        ("enable_rate_limit", {"approval": "approver:sre"}, "approval", "approver:sre"),
        ("enable_rate_limit", {"policy": "approval"}, "approval", "approver:approvers"),
        ("stagger_restarts", {"policy": "auto"}, "auto", "auto"),
        (
            "stagger_restarts",
            {"policy": "approval", "approval": "approver:sre"},
            "approval",
            "approver:sre",
        ),
    ],
)
def test_policy_defaults_follow_the_action_and_the_approval(
    tmp_path: Path, action: str, fields: dict[str, str], policy: str, approval: str
) -> None:
    data = minimal()
    step = data["steps"][0]
    del step["approval"], step["floors"]
    step.update(action=action, **fields)
    loaded = load_runbook(write(tmp_path, data)).steps[0]
    assert (loaded.policy.value, loaded.approval) == (policy, approval)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"policy": "auto", "approval": "approver:sre"}, "contradicts"),
        ({"policy": "approval", "approval": "auto"}, "contradicts"),
        ({"policy": "sometimes"}, "policy"),
        ({"approval_expiry_s": 0}, "approval_expiry_s"),
        ({"lift": {"params": ["limit_rps"], "interval_s": 60}}, "does not have"),
        ({"lift": {"params": ["workload"], "interval_s": 60, "factor": 1}}, "factor"),
        ({"lift": {"params": ["workload"], "interval_s": 60, "until": "nope"}}, "['nope']"),
        ({"lift": {"params": [], "interval_s": 60}}, "params"),
    ],
)
def test_bad_policy_expiry_and_lift(tmp_path: Path, fields: dict[str, Any], fragment: str) -> None:
    data = minimal()
    data["steps"][0].update(fields)
    with pytest.raises(RunbookError, match="steps") as info:
        load_runbook(write(tmp_path, data))
    assert fragment in str(info.value)


def test_lift_is_kept(tmp_path: Path) -> None:
    data = minimal()
    data["steps"][0]["lift"] = {"params": ["workload"], "interval_s": 60, "until": "workload"}
    lift = load_runbook(write(tmp_path, data)).steps[0].lift
    assert lift is not None
    assert (lift.factor, lift.interval_s, lift.max_steps, lift.until) == (2.0, 60, 4, "workload")
