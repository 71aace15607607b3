"""Triton Inference Server: reload a model with lower dynamic-batching ceilings, no restart.

The step (runbook action ``lower_batch_ceiling``) reloads the model with a config override:
``GET v2/models/{name}/config`` gives the loaded config (JSON), then
``POST v2/repository/models/{name}/load`` with ``{"parameters": {"config": "<JSON text>"}}``
loads it with ``max_batch_size`` and ``dynamic_batching`` (``max_queue_delay_microseconds``,
``preferred_batch_size``, ``default_queue_policy``) changed and every other field as it was.
A bounded queue (``default_queue_policy.max_queue_size``) makes Triton reject what does not
fit instead of queueing it into an OOM.

Triton must run with ``--model-control-mode=explicit`` (reason ``explicit_mode_required``
otherwise: Triton answers "explicit model load / unload is not allowed ..."). A reload keeps
the loaded copy serving until the new one is ready, and keeps it when the reload fails. The
load is slow and heavy, so it is sent once, under ``load_timeout_s``; the GET is retried. The
override lives in memory: a restarted Triton loads the repository's ``config.pbtxt`` again.
Each server (a replica of the workload) is one target; ``verify`` also checks
``GET v2/models/{name}/ready``. The target's content is the managed fields; a revert loads the
current config with the previous values of those fields (``dynamic_batching`` removed again
when the model had none). Sources:
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md
https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_management.md
https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_configuration.md
(dynamic batcher, preferred batch sizes, queue policy)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote

from detector.actuators.base import ActuatorError, Change, Plan, Reason
from detector.actuators.http import (
    AdminApi,
    HttpActuator,
    HttpApi,
    HttpCallError,
    expect_dict,
    parse_json,
    render_json,
)

BATCHING_FIELDS = ("max_queue_delay_microseconds", "preferred_batch_size", "default_queue_policy")
NOT_EXPLICIT = "explicit model load / unload is not allowed"
TIMEOUT_ACTIONS = ("REJECT", "DELAY")


def _invalid(detail: str) -> ActuatorError:
    return ActuatorError(Reason.INVALID_REQUEST, detail)


def _int(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _invalid(f"{name} must be an int >= {low}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Triton's ``default_queue_policy``: a bounded queue and what happens on a timeout.

    ``max_queue_size``: requests queued at most (0: unbounded); ``timeout_action``: ``REJECT``
    or ``DELAY``; ``default_timeout_microseconds``: 0 for none.
    """

    max_queue_size: int
    timeout_action: str = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False

    def __post_init__(self) -> None:
        _int(self.max_queue_size, "max_queue_size", 0)
        _int(self.default_timeout_microseconds, "default_timeout_microseconds", 0)
        if self.timeout_action not in TIMEOUT_ACTIONS:
            raise _invalid(f"timeout_action must be one of {TIMEOUT_ACTIONS}")

    def as_json(self) -> dict[str, Any]:
        """Return the policy as model-config JSON."""
        return {
            "max_queue_size": self.max_queue_size,
            "timeout_action": self.timeout_action,
            "default_timeout_microseconds": self.default_timeout_microseconds,
            "allow_timeout_override": self.allow_timeout_override,
        }


@dataclass(frozen=True, slots=True)
class TritonBatching:
    """New batch ceilings; None leaves a field as it is.

    ``max_batch_size`` >= 1; ``preferred_batch_size`` each in 1..max_batch_size (when None and
    the new ``max_batch_size`` is lower than some current preferred sizes, those are dropped).
    Raises ActuatorError(``invalid_request``).
    """

    max_batch_size: int
    max_queue_delay_microseconds: int | None = None
    preferred_batch_size: tuple[int, ...] | None = None
    default_queue_policy: QueuePolicy | None = None

    def __post_init__(self) -> None:
        _int(self.max_batch_size, "max_batch_size", 1)
        if self.max_queue_delay_microseconds is not None:
            _int(self.max_queue_delay_microseconds, "max_queue_delay_microseconds", 0)
        for size in self.preferred_batch_size or ():
            if _int(size, "preferred_batch_size", 1) > self.max_batch_size:
                raise _invalid(f"preferred_batch_size {size} > max_batch_size")

    def describe(self) -> str:
        """Return a one-line summary of the new ceilings."""
        parts = [f"max_batch_size {self.max_batch_size}"]
        if self.max_queue_delay_microseconds is not None:
            parts.append(f"max_queue_delay {self.max_queue_delay_microseconds} us")
        if self.preferred_batch_size is not None:
            parts.append(f"preferred {list(self.preferred_batch_size)}")
        if self.default_queue_policy is not None:
            policy = self.default_queue_policy
            parts.append(f"queue {policy.max_queue_size} ({policy.timeout_action})")
        return "dynamic batching " + ", ".join(parts)


def _numbers(value: Any) -> Any:
    """Return ``value`` with digit strings as ints (protobuf JSON writes 64-bit ints as text)."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return value


def config_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the managed fields of a model config: ``max_batch_size`` and the batcher's three.

    ``dynamic_batching`` is None when the model has none; a field it leaves out stays out.
    """
    batching = config.get("dynamic_batching")
    view: dict[str, Any] = {"max_batch_size": _numbers(config.get("max_batch_size", 0))}
    if isinstance(batching, dict):
        view["dynamic_batching"] = {
            key: _numbers(batching[key]) for key in BATCHING_FIELDS if key in batching
        }
    else:
        view["dynamic_batching"] = None
    return view


def desired_view(current: Mapping[str, Any], batching: TritonBatching) -> dict[str, Any]:
    """Return the managed fields with ``batching`` in force (dynamic batching turned on).

    Raises ActuatorError(``invalid_request``) for a model without batching (``max_batch_size``
    0): its inputs have no batch dimension, so a batch ceiling would change their shapes.
    """
    if not current.get("max_batch_size"):
        raise _invalid("the model does not batch (max_batch_size 0): no batch ceiling to lower")
    dynamic = dict(current.get("dynamic_batching") or {})
    if batching.max_queue_delay_microseconds is not None:
        dynamic["max_queue_delay_microseconds"] = batching.max_queue_delay_microseconds
    if batching.preferred_batch_size is not None:
        dynamic["preferred_batch_size"] = list(batching.preferred_batch_size)
    elif "preferred_batch_size" in dynamic:
        sizes = [s for s in dynamic["preferred_batch_size"] if s <= batching.max_batch_size]
        dynamic["preferred_batch_size"] = sizes
    if batching.default_queue_policy is not None:
        dynamic["default_queue_policy"] = batching.default_queue_policy.as_json()
    return {"max_batch_size": batching.max_batch_size, "dynamic_batching": dynamic}


def merged_config(config: Mapping[str, Any], view: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``config`` with the managed fields of ``view`` in place (the load override)."""
    merged = dict(config)
    merged["max_batch_size"] = view["max_batch_size"]
    dynamic = view.get("dynamic_batching")
    if dynamic is None:
        merged.pop("dynamic_batching", None)
        return merged
    batcher = dict(merged.get("dynamic_batching") or {})
    for key in BATCHING_FIELDS:
        if key in dynamic:
            batcher[key] = dynamic[key]
        else:
            batcher.pop(key, None)
    merged["dynamic_batching"] = batcher
    return merged


def load_body(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the load request: the whole config as one JSON string parameter ``config``."""
    return {"parameters": {"config": json.dumps(config, sort_keys=True)}}


class TritonBatchCeiling(HttpActuator):
    """Reload one model on each Triton server with new dynamic-batching ceilings.

    ``load_timeout_s``: the load call's timeout (a reload can take minutes). Source:
    https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md
    """

    action: ClassVar[str] = "lower_batch_ceiling"

    def __init__(
        self,
        servers: Sequence[AdminApi],
        model: str,
        *,
        load_timeout_s: float = 300.0,
        settle_s: float = 30.0,
    ) -> None:
        super().__init__(settle_s=settle_s)
        if not servers or not model:
            raise _invalid("TritonBatchCeiling needs a model and at least one server")
        self.model = model
        self.load_timeout_s = load_timeout_s
        self._path = quote(model, safe="")
        self.servers = {f"{api.name}/v2/models/{model}": self.connect(api) for api in servers}

    @property
    def target(self) -> str:
        """Return ``triton:<model>``."""
        return f"triton:{self.model}"

    def plan(self, batching: TritonBatching) -> Plan:
        """Return the plan that loads ``batching`` on every server (GET each config first)."""
        changes = []
        for name in self.servers:
            current = config_view(self.fetch(name))
            after = render_json(desired_view(current, batching))
            changes.append(Change(name, render_json(current), after))
        return Plan(self.action, self.target, tuple(changes), batching.describe())

    def _http(self, target: str) -> HttpApi:
        try:
            return self.servers[target]
        except KeyError:
            raise _invalid(f"{target} is not a server of {self.target}") from None

    def fetch(self, target: str) -> dict[str, Any]:
        """Return the loaded model config (GET v2/models/{name}/config)."""
        path = f"/v2/models/{self._path}/config"
        config = self._http(target).call(
            "GET", path, what=f"config of model {self.model}", idempotent=True
        )
        return expect_dict(config, f"GET {target}/config")

    def render(self, target: str, state: Any) -> str | None:
        """Return the managed fields as JSON text."""
        return render_json(config_view(state))

    def send(self, target: str, state: Any, content: str | None) -> None:
        """Load the model with ``state`` overridden by the managed fields (sent once)."""
        view = parse_json(content, f"content of {target}")
        if not isinstance(view, dict):
            raise _invalid(f"{target}: a loaded model always has a config")
        body = load_body(merged_config(state, view))
        path = f"/v2/repository/models/{self._path}/load"
        try:
            self._http(target).call(
                "POST",
                path,
                what=f"load of model {self.model}",
                idempotent=False,
                body=body,
                timeout_s=self.load_timeout_s,
            )
        except HttpCallError as exc:
            if NOT_EXPLICIT in exc.message:
                raise HttpCallError(
                    Reason.EXPLICIT_MODE_REQUIRED,
                    f"{exc.detail} (start Triton with --model-control-mode=explicit)",
                    status=exc.status,
                    message=exc.message,
                ) from exc
            raise

    def check_live(self) -> None:
        """Check the model is ready on every server (GET v2/models/{name}/ready answers 200)."""
        for http in self.servers.values():
            path = f"/v2/models/{self._path}/ready"
            http.call("GET", path, what=f"readiness of model {self.model}", idempotent=True)
