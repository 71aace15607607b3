"""Load and validate a runbook YAML file into a :class:`~detector.runbooks.definition.Runbook`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from detector.errors import RunbookError
from detector.runbooks.definition import Runbook
from detector.runbooks.render import check_templates

DEFAULT_RUNBOOK = "gpu-oom-cascade.yaml"


def runbooks_dir() -> Path:
    """Return the repository's ``runbooks/`` folder."""
    return Path(__file__).resolve().parents[2] / "runbooks"


def default_runbook_path() -> Path:
    """Return the path of the GPU OOM cascade runbook, ``runbooks/gpu-oom-cascade.yaml``."""
    return runbooks_dir() / DEFAULT_RUNBOOK


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that rejects a mapping key given twice instead of keeping the last."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _field_path(loc: tuple[int | str, ...], data: Any) -> str:
    """Format a pydantic error location as ``steps[0] (lower_batch_ceiling).verify.deadline_s``."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            node = node[item] if isinstance(node, list) and item < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("id"), str):
                label += f" ({node['id']})"
            parts.append(label)
        else:
            parts.append(f".{item}" if parts else str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "<root>"


def _parse(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunbookError(f"{path}: cannot read runbook: {exc}") from exc
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise RunbookError(f"{path}: invalid YAML{where}: {problem}") from exc


def load_runbook(path: Path | str) -> Runbook:
    """Read, validate and return the runbook at ``path``.

    Checks the YAML syntax (duplicate keys are errors), the schema (unknown keys and unknown
    actions are errors) and the syntax of every parameter template. Raises RunbookError whose
    message names the file and the offending field.
    """
    path = Path(path)
    data = _parse(path)
    if not isinstance(data, dict):
        raise RunbookError(f"{path}: a runbook must be a mapping, got {type(data).__name__}")
    try:
        runbook = Runbook.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{_field_path(tuple(err['loc']), data)}: {err['msg']}" for err in exc.errors()
        )
        raise RunbookError(f"{path}: invalid runbook: {problems}") from exc
    try:
        check_templates(runbook)
    except RunbookError as exc:
        raise RunbookError(f"{path}: {exc}") from exc
    return runbook
