"""Parameter templates render in a sandbox with StrictUndefined; failures name step and param."""

from __future__ import annotations

from typing import Any

import pytest

from detector.errors import RunbookError
from detector.runbooks.definition import Step
from detector.runbooks.render import MAX_RENDERED_CHARS, render_param, render_step


def make_step(params: dict[str, str]) -> Step:
    return Step.model_validate(
        {
            "id": "lower_batch_ceiling",
            "action": "lower_batch_ceiling",
            "title": "t",
            "description": "d",
            "params": params,
            "approval": "auto",
            "verify": {"deadline_s": 60, "checks": ["ooms_stop"]},
            "on_failure": "escalate",
            "cooldown_s": 0,
        }
    )


@pytest.mark.parametrize(
    ("source", "variables", "expected"),
    [
        ("{{ workload }}", {"workload": "llm"}, "llm"),
        ("{{ n // 2 }}", {"n": 256}, "128"),
        ("{{ pods | tojson }}", {"pods": ["a", "b"]}, '["a", "b"]'),
        ("{{ pods | join(',') }}", {"pods": ["a", "b"]}, "a,b"),
        ("  {{ x }}\n", {"x": 1}, "1"),
        ("{{ 'ab' * 3 }}", {}, "ababab"),
        ("{{ 2 ** 10 }}", {}, "1024"),
        (
            "{{ c.proposed if c.current is not none else 'unknown' }}",
            {"c": {"current": None, "proposed": 3}},
            "unknown",
        ),
    ],
)
def test_renders(source: str, variables: dict[str, Any], expected: str) -> None:
    assert render_param("s", "p", source, variables) == expected


def test_text_from_logs_is_data_not_template() -> None:
    # A pod name or log text that looks like a template is printed, never evaluated.
    hostile = "{{ 7 * 7 }}{% for x in range(3) %}x{% endfor %}"
    assert render_param("s", "p", "{{ pod }}", {"pod": hostile}) == hostile
    assert render_param("s", "p", "{{ pods | tojson }}", {"pods": [hostile]}) == (
        '["{{ 7 * 7 }}{% for x in range(3) %}x{% endfor %}"]'
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ missing }}", "undefined variable"),
        ("{{ ceiling.nope }}", "undefined variable"),
        ("{% if missing %}x{% endif %}", "undefined variable"),
        ("{{ workload.__class__.__mro__ }}", "sandbox violation"),
        ("{{ workload.__class__ }}", "sandbox violation"),
        ("{{ ''.format.__globals__ }}", "sandbox violation"),
        ("{{ 'x' * 100000 }}", "sandbox violation"),
        ("{{ [1] * 100000 }}", "sandbox violation"),
        ("{{ 10 ** 100000 }}", "sandbox violation"),
        ("{{ range(10**9) | list }}", "sandbox violation"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ workload + 1 }}", "TypeError"),
    ],
)
def test_failures_name_step_and_param(source: str, message: str) -> None:
    variables = {"workload": "llm", "ceiling": {"proposed": 1}}
    with pytest.raises(RunbookError) as info:
        render_param("lower_batch_ceiling", "settings", source, variables)
    text = str(info.value)
    assert "step 'lower_batch_ceiling'" in text
    assert "param 'settings'" in text
    assert message in text


def test_syntax_error_names_step_and_param() -> None:
    with pytest.raises(RunbookError, match=r"step 's' param 'p': template syntax error at line 1"):
        render_param("s", "p", "{{ unclosed", {})


def test_overlong_output_is_refused() -> None:
    with pytest.raises(RunbookError, match="longer than"):
        render_param("s", "p", "{{ text }}", {"text": "x" * (MAX_RENDERED_CHARS + 1)})


def test_render_step_keeps_param_order_and_names_the_failing_param() -> None:
    step = make_step({"b": "{{ x }}", "a": "{{ y }}"})
    assert list(render_step(step, {"x": 1, "y": 2})) == ["b", "a"]
    with pytest.raises(RunbookError, match=r"step 'lower_batch_ceiling' param 'a'"):
        render_step(step, {"x": 1})
