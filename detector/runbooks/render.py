"""Render runbook parameter templates in a Jinja2 sandbox with strict undefined variables.

Templates come only from the runbook definition; everything taken from the incident (pod
names, upstreams, numbers parsed from logs) reaches a template as a variable and is never
concatenated into template source, so text from logs cannot become template code.
Sandbox: https://jinja.palletsprojects.com/en/3.1.x/sandbox/
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import Any

from jinja2 import StrictUndefined, Template
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment

from detector.errors import RunbookError
from detector.runbooks.definition import Runbook, Step

MAX_RENDERED_CHARS = 8192  # longest rendered value a parameter may have
_MAX_REPEAT_ITEMS = 8192  # longest string or list that `*` may build
_MAX_EXPONENT = 256  # largest exponent that `**` may take


class _ParamEnvironment(SandboxedEnvironment):
    """A sandbox that also bounds `*` repetition and `**` so a template cannot exhaust memory."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Context, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "**":
            if isinstance(right, int | float) and abs(right) > _MAX_EXPONENT:
                raise SecurityError(f"exponent {right} is over {_MAX_EXPONENT}")
            return operator.pow(left, right)
        for seq, times in ((left, right), (right, left)):
            if (
                isinstance(seq, str | list | tuple)
                and isinstance(times, int)
                and len(seq) * times > _MAX_REPEAT_ITEMS
            ):
                raise SecurityError(f"repetition longer than {_MAX_REPEAT_ITEMS} items")
        return operator.mul(left, right)


@functools.lru_cache(maxsize=1)
def environment() -> SandboxedEnvironment:
    """Return the shared sandboxed environment (StrictUndefined, no autoescape, no loader)."""
    return _ParamEnvironment(undefined=StrictUndefined, autoescape=False)


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> Template:
    """Return the compiled template of ``source`` (cached: a runbook's templates are few and
    fixed, and compiling one costs about a millisecond, on every plan of every incident)."""
    return environment().from_string(source)


def compile_param(step_id: str, name: str, source: str) -> Template:
    """Compile one parameter template; on bad syntax raise RunbookError naming step and param."""
    try:
        return _compiled(source)
    except TemplateSyntaxError as exc:
        raise RunbookError(
            f"step {step_id!r} param {name!r}: template syntax error at line {exc.lineno}: "
            f"{exc.message}"
        ) from exc


def check_templates(runbook: Runbook) -> None:
    """Compile every parameter template of a runbook; raise RunbookError on the first bad one."""
    for step in runbook.steps:
        for name, source in step.params.items():
            compile_param(step.id, name, source)


def render_param(step_id: str, name: str, source: str, variables: Mapping[str, Any]) -> str:
    """Render one parameter template to a stripped string.

    Raises RunbookError naming the step and param for an undefined variable, a sandbox
    violation, an expression error, or a value over MAX_RENDERED_CHARS characters.
    """
    template = compile_param(step_id, name, source)
    where = f"step {step_id!r} param {name!r}"
    try:
        value = template.render(dict(variables))
    except UndefinedError as exc:
        raise RunbookError(f"{where}: undefined variable: {exc.message}") from exc
    except (SecurityError, OverflowError) as exc:  # OverflowError: the sandbox's range() cap
        raise RunbookError(f"{where}: sandbox violation: {exc}") from exc
    except (TemplateError, TypeError, ValueError, ArithmeticError) as exc:
        raise RunbookError(f"{where}: render failed: {type(exc).__name__}: {exc}") from exc
    if len(value) > MAX_RENDERED_CHARS:
        raise RunbookError(f"{where}: rendered value longer than {MAX_RENDERED_CHARS} chars")
    return value.strip()


def render_step(step: Step, variables: Mapping[str, Any]) -> dict[str, str]:
    """Render all parameters of a step, in definition order; raise RunbookError on any failure."""
    return {
        name: render_param(step.id, name, source, variables) for name, source in step.params.items()
    }
