"""Pure patch building for the Kubernetes actuators: fields as text, engine flags, strategies.

An actuator sees the part of an API object it manages as *fields*: an ordered mapping from a
field key to a JSON value, rendered one per line as ``key: <JSON>`` (so a plan's unified diff
shows each changed value on its own line, and the text parses back exactly). Keys:

- ``spec.strategy``: a Deployment's whole rollout strategy;
- ``containers[NAME].args[--flag]`` / ``containers[NAME].command[--flag]``: an engine flag's
  value in the container's args (or command) list, in whichever form it is written there
  (``--flag value`` or ``--flag=value``);
- ``containers[NAME].env[VAR]``: an env variable's ``value`` (or its ``valueFrom`` object);
- ``metadata.annotations[KEY]``, ``spec.template.metadata.annotations[KEY]``: one annotation;
- any other dotted path (``spec.rateLimit``): that field's whole value.

A field that is absent is left out, so a revert to a plan's "before" removes what the plan
added. Engine flags and env names: vLLM https://docs.vllm.ai/en/latest/configuration/engine_args.html
, TGI https://huggingface.co/docs/text-generation-inference/reference/launcher , SGLang
https://docs.sglang.ai/advanced_features/server_arguments.html . Every function here raises
ActuatorError (``invalid_request``, ``unsupported``) and touches no network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from detector.actuators.base import ActuatorError, Reason

STRATEGY = "spec.strategy"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
_CONTAINER_KEY = re.compile(
    r"^containers\[(?P<c>[^\]]+)\]\.(?P<where>args|command|env)\[(?P<n>[^\]]+)\]$"
)
_ANNOTATION_KEY = re.compile(
    r"^(?P<path>(?:spec\.template\.)?metadata\.annotations)\[(?P<n>[^\]]+)\]$"
)
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh"})

Rollout = Literal["surge", "unavailable"]


def render_fields(fields: Mapping[str, Any]) -> str:
    """Return ``key: <JSON>`` lines, in the mapping's order (sorted JSON keys inside)."""
    return "".join(f"{key}: {json.dumps(value, sort_keys=True)}\n" for key, value in fields.items())


def parse_fields(text: str) -> dict[str, Any]:
    """Parse ``render_fields`` text back; raise ActuatorError(``invalid_request``)."""
    fields: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        key, sep, value = line.partition(": ")
        try:
            if not sep or not key:
                raise ValueError("no 'key: value'")
            fields[key] = json.loads(value)
        except ValueError as exc:
            raise ActuatorError(
                Reason.INVALID_REQUEST, f"field line {number} {line!r}: {exc}"
            ) from exc
    return fields


def merge_diff(current: Any, desired: Any) -> Any:
    """Return the JSON merge patch (RFC 7386) that turns ``current`` into ``desired``.

    Maps are diffed key by key (a removed key becomes null); anything else is replaced
    whole. Source: https://www.rfc-editor.org/rfc/rfc7386 .
    """
    if not isinstance(current, dict) or not isinstance(desired, dict):
        return desired
    patch: dict[str, Any] = {}
    for key in current.keys() | desired.keys():
        if key not in desired:
            patch[key] = None
        elif key not in current or current[key] != desired[key]:
            patch[key] = merge_diff(current.get(key), desired[key])
    return patch


# Rollout strategy ------------------------------------------------------------------------

ONE_AT_A_TIME: dict[Rollout, dict[str, Any]] = {
    "surge": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
    "unavailable": {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    },
}
"""Strategies that replace one pod at a time: one extra pod first (needs a spare GPU), or one
pod down first. https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#rolling-update-deployment"""


def rolls_one_at_a_time(strategy: Mapping[str, Any] | None) -> bool:
    """Return True when ``strategy`` replaces at most one pod at a time (counts, not %)."""
    if not strategy or strategy.get("type") != "RollingUpdate":
        return False
    rolling = strategy.get("rollingUpdate") or {}
    pair = (rolling.get("maxSurge"), rolling.get("maxUnavailable"))
    return pair in ((1, 0), (0, 1))


def describe_strategy(strategy: Mapping[str, Any] | None) -> str:
    """Return ``RollingUpdate maxSurge=1 maxUnavailable=0`` or ``Recreate`` for people."""
    if not strategy:
        return "default (RollingUpdate maxSurge=25% maxUnavailable=25%)"
    rolling = strategy.get("rollingUpdate") or {}
    parts = [str(strategy.get("type", "?"))]
    parts += [f"{key}={rolling[key]}" for key in ("maxSurge", "maxUnavailable") if key in rolling]
    return " ".join(parts)


def one_pod_strategy(current: Mapping[str, Any] | None, rollout: Rollout) -> dict[str, Any]:
    """Return ``current`` when it already rolls one pod at a time, else ``ONE_AT_A_TIME``."""
    if current is not None and rolls_one_at_a_time(current):
        return dict(current)
    return dict(ONE_AT_A_TIME[rollout])


# Engine parameters -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineParam:
    """One engine ceiling: its flag and/or env variable, and where a new value goes."""

    flag: str | None
    env: str | None = None
    default: Literal["args", "env"] = "args"


ENGINE_PARAMS: dict[str, dict[str, EngineParam]] = {
    "vllm": {
        "max_num_seqs": EngineParam("--max-num-seqs"),
        "max_num_batched_tokens": EngineParam("--max-num-batched-tokens"),
        "max_model_len": EngineParam("--max-model-len"),
        "gpu_memory_utilization": EngineParam("--gpu-memory-utilization"),
    },
    "tgi": {
        "max_concurrent_requests": EngineParam(
            "--max-concurrent-requests", "MAX_CONCURRENT_REQUESTS", "env"
        ),
        "max_batch_total_tokens": EngineParam(
            "--max-batch-total-tokens", "MAX_BATCH_TOTAL_TOKENS", "env"
        ),
        "max_input_tokens": EngineParam("--max-input-tokens", "MAX_INPUT_TOKENS", "env"),
        "max_total_tokens": EngineParam("--max-total-tokens", "MAX_TOTAL_TOKENS", "env"),
    },
    "sglang": {
        "max_running_requests": EngineParam("--max-running-requests"),
        "mem_fraction_static": EngineParam("--mem-fraction-static"),
        "max_total_tokens": EngineParam("--max-total-tokens"),
        "chunked_prefill_size": EngineParam("--chunked-prefill-size"),
        "context_length": EngineParam("--context-length"),
    },
}
"""Ceilings by engine, under the names ``SafeCeilings.settings(engine)`` gives them. TGI reads
each from its env variable unless the flag is on the command line (clap: the flag wins)."""


def engine_params(engine: str) -> dict[str, EngineParam]:
    """Return ``engine``'s ceilings; ActuatorError(``invalid_request``) for an unknown one."""
    try:
        return ENGINE_PARAMS[engine]
    except KeyError:
        known = ", ".join(ENGINE_PARAMS)
        raise ActuatorError(
            Reason.INVALID_REQUEST, f"unknown engine {engine!r} (known: {known})"
        ) from None


def format_value(value: int | float | str) -> str:
    """Return a ceiling as the engine reads it (``64``, ``0.85``); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ActuatorError(Reason.INVALID_REQUEST, f"not a ceiling value: {value!r}")
    return repr(value) if isinstance(value, float) else str(value)


def _spellings(flag: str) -> tuple[str, ...]:
    """Return the flag and its underscore spelling (vLLM's parser accepts both)."""
    underscored = "--" + flag[2:].replace("-", "_")
    return (flag,) if underscored == flag else (flag, underscored)


def find_flag(argv: Sequence[str], flag: str) -> tuple[int, str, bool] | None:
    """Return (index, value, inline) of the last ``flag`` in ``argv``; None when absent.

    ``inline`` is True for ``--flag=value``. Raises ActuatorError(``invalid_request``) for a
    flag with no value after it.
    """
    found = None
    for index, token in enumerate(argv):
        for spelling in _spellings(flag):
            if token == spelling:
                if index + 1 >= len(argv):
                    raise ActuatorError(Reason.INVALID_REQUEST, f"{flag} has no value after it")
                found = (index, argv[index + 1], False)
            elif token.startswith(spelling + "="):
                found = (index, token[len(spelling) + 1 :], True)
    return found


def set_flag(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """Return ``argv`` with the last ``flag`` set to ``value`` in its own form, or appended."""
    out = list(argv)
    found = find_flag(out, flag)
    if found is None:
        return [*out, f"{flag}={value}"]
    index, _, inline = found
    if inline:
        out[index] = f"{out[index].split('=', 1)[0]}={value}"
    else:
        out[index + 1] = value
    return out


def remove_flag(argv: Sequence[str], flag: str) -> list[str]:
    """Return ``argv`` without any ``flag`` (either form, either spelling) and its value."""
    out: list[str] = []
    skip = False
    spellings = _spellings(flag)
    for token in argv:
        if skip:
            skip = False
        elif token in spellings:
            skip = True
        elif not any(token.startswith(s + "=") for s in spellings):
            out.append(token)
    return out


def _shell_form(container: Mapping[str, Any]) -> bool:
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    return bool(argv) and argv[0].rsplit("/", 1)[-1] in _SHELLS and "-c" in argv


def _in_shell_string(container: Mapping[str, Any], flag: str) -> bool:
    tokens = [*(container.get("command") or []), *(container.get("args") or [])]
    return any(" " in t and any(s in t for s in _spellings(flag)) for t in tokens)


def container_key(container: str, where: str, name: str) -> str:
    """Return the field key ``containers[NAME].WHERE[NAME]``."""
    return f"containers[{container}].{where}[{name}]"


def _env_value(entry: Mapping[str, Any]) -> Any:
    return entry["valueFrom"] if "valueFrom" in entry else entry.get("value", "")


def ceiling_fields(container: Mapping[str, Any], engine: str) -> dict[str, Any]:
    """Return the fields of ``engine``'s ceilings set in ``container`` (a Container object)."""
    name = str(container.get("name"))
    env = {str(e.get("name")): e for e in container.get("env") or []}
    fields: dict[str, Any] = {}
    for param in engine_params(engine).values():
        key = _locate(container, param)
        if key is None:
            continue
        where, ident = key
        if where == "env":
            fields[container_key(name, where, ident)] = _env_value(env[ident])
        else:
            found = find_flag(container.get(where) or [], ident)
            fields[container_key(name, where, ident)] = found[1] if found else None
    return fields


def _locate(container: Mapping[str, Any], param: EngineParam) -> tuple[str, str] | None:
    """Return (args|command|env, flag or variable) where ``param`` is set now, else None."""
    if param.flag is not None:
        for where in ("args", "command"):
            if find_flag(container.get(where) or [], param.flag) is not None:
                return where, param.flag
    names = {str(e.get("name")) for e in container.get("env") or []}
    if param.env is not None and param.env in names:
        return "env", param.env
    return None


def desired_ceiling_fields(
    container: Mapping[str, Any], engine: str, ceilings: Mapping[str, int | float | str]
) -> dict[str, Any]:
    """Return ``container``'s ceiling fields with ``ceilings`` (engine names) put in.

    A ceiling already set is changed where it is; a new one goes to the engine's default
    place (a ``--flag=value`` arg, or a TGI env variable). Raises ActuatorError: an unknown
    ceiling name, or (``unsupported``) flags inside a shell command string.
    """
    params = engine_params(engine)
    name = str(container.get("name"))
    fields = ceiling_fields(container, engine)
    for ceiling, value in ceilings.items():
        param = params.get(ceiling)
        if param is None:
            known = ", ".join(params)
            raise ActuatorError(
                Reason.INVALID_REQUEST, f"{engine} has no ceiling {ceiling!r} ({known})"
            )
        flag_or_env = param.flag or param.env or ceiling
        if _in_shell_string(container, flag_or_env) or (
            _locate(container, param) is None and param.default == "args" and _shell_form(container)
        ):
            raise ActuatorError(
                Reason.UNSUPPORTED,
                f"container {name} starts through a shell string: {flag_or_env} cannot be "
                "set as an argument; change the command by hand",
            )
        where, ident = _locate(container, param) or (
            ("env", param.env) if param.default == "env" and param.env else ("args", param.flag)
        )
        fields[container_key(name, where, str(ident))] = format_value(value)
    return fields


def container_patch(
    container: Mapping[str, Any], current: Mapping[str, Any], desired: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Return the strategic-merge entry for ``container`` that turns ``current`` into ``desired``.

    Only ``containers[...]`` keys of this container are looked at; args and command are
    sent whole (a list of strings is replaced), env entries by name (``$patch: delete``
    removes one). None when nothing changes. Raises ActuatorError (``unsupported``) to change
    an env variable that comes from ``valueFrom``.
    """
    name = str(container.get("name"))
    lists = {w: list(container.get(w) or []) for w in ("args", "command")}
    env: list[dict[str, Any]] = []
    for key in [*current, *(k for k in desired if k not in current)]:
        match = _CONTAINER_KEY.match(key)
        if match is None or match["c"] != name or current.get(key) == desired.get(key):
            continue
        where, ident = match["where"], match["n"]
        if where == "env":
            env.append(_env_patch(container, ident, desired.get(key)))
        elif key in desired:
            lists[where] = set_flag(lists[where], ident, str(desired[key]))
        else:
            lists[where] = remove_flag(lists[where], ident)
    entry: dict[str, Any] = {"name": name}
    for where, argv in lists.items():
        if argv != list(container.get(where) or []):
            entry[where] = argv
    if env:
        entry["env"] = env
    return entry if len(entry) > 1 else None


def _env_patch(container: Mapping[str, Any], var: str, value: Any) -> dict[str, Any]:
    existing = next((e for e in container.get("env") or [] if e.get("name") == var), None)
    if existing is not None and "valueFrom" in existing:
        raise ActuatorError(
            Reason.UNSUPPORTED,
            f"env {var} of container {container.get('name')} comes from valueFrom (a "
            "ConfigMap, Secret or field): change it at its source",
        )
    if value is None:
        return {"name": var, "$patch": "delete"}
    if not isinstance(value, str):
        raise ActuatorError(Reason.INVALID_REQUEST, f"env {var} can only be set to a string value")
    return {"name": var, "value": value}


def annotation_fields(obj: Mapping[str, Any], path: str, keys: Sequence[str]) -> dict[str, Any]:
    """Return ``path[KEY]`` fields for the ``keys`` set in the annotations at ``path``."""
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    annotations = node if isinstance(node, Mapping) else {}
    return {f"{path}[{k}]": annotations[k] for k in keys if k in annotations}


def annotations_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """Return the nested patch setting (or nulling) every annotation field that changes."""
    patch: dict[str, Any] = {}
    for key in current.keys() | desired.keys():
        match = _ANNOTATION_KEY.match(key)
        if match is None or current.get(key) == desired.get(key):
            continue
        node = patch
        for part in match["path"].split("."):
            node = node.setdefault(part, {})
        node[match["n"]] = desired.get(key)
    return patch


def nested(path: str, value: Any) -> dict[str, Any]:
    """Return ``{"a": {"b": value}}`` for the dotted ``path`` ``a.b``."""
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return dict(out)


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``extra`` merged in, maps recursively (neither is changed)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
