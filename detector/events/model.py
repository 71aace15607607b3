"""The Signal: one normalized observation parsed from a record of one of the four streams."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar, cast

MAX_TEXT_CHARS = 2048  # Signal.text keeps at most this much of the raw text

_T = TypeVar("_T")


class _Factory:
    """The default of a field with a default factory: "not given", call the factory."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def slot_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an ``__init__`` that stores through the slots directly.

    The ``__init__`` that ``dataclasses`` writes for a frozen class calls
    ``object.__setattr__`` once per field, which costs about as much as the rest of a record's
    parsing for the classes made once per record (``SourcePos``, ``LogLine``, ``Signal``,
    ``Parsed``). This one has the same parameters and defaults (a default factory is called
    per instance) and calls each slot descriptor's ``__set__``: the same instance, still
    frozen (assignment raises ``FrozenInstanceError``), at about half the cost. Raises
    TypeError for a class it cannot reproduce (not slotted, ``__post_init__``, keyword-only,
    ``InitVar`` or ``init=False`` fields).
    """
    params = getattr(cls, "__dataclass_params__", None)
    frozen_slots = params is not None and params.frozen and "__slots__" in cls.__dict__
    if not frozen_slots or hasattr(cls, "__post_init__"):
        raise TypeError(f"slot_init needs a frozen, slotted dataclass: {cls.__name__}")
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    args: list[str] = []
    body: list[str] = []
    for f in fields(cast(Any, cls)):
        if not f.init or f.kw_only:
            raise TypeError(f"slot_init cannot set field {f.name} of {cls.__name__}")
        namespace[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        value = f.name
        if f.default_factory is not MISSING:
            namespace[f"_new_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_FACTORY")
            value = f"_new_{f.name}() if {f.name} is _FACTORY else {f.name}"
        elif f.default is not MISSING:
            namespace[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        else:
            args.append(f.name)
        body.append(f"    _set_{f.name}(self, {value})")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)  # the pattern of dataclasses' own generated methods
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


class SignalKind(StrEnum):
    """What a signal says about a pod or workload."""

    GPU_OOM = "gpu_oom"  # a CUDA/GPU out-of-memory error in a container log
    ENGINE_DEAD = (
        "engine_dead"  # a serving engine's "engine dead" line (consequence, not a new OOM)
    )
    CRASH_LOOP = "crash_loop"  # BackOff event, CrashLoopBackOff waiting state, restarts
    HOST_OOM = "host_oom"  # container OOMKilled / exit 137 / kernel OOM killer: a look-alike
    POD_READY = "pod_ready"  # recovery: pod Ready / container started and ready
    LB_RESPONSE = "lb_response"  # one load-balancer access-log line (status, upstream)
    GPU_MEMORY = "gpu_memory"  # framebuffer used/total of one GPU
    ENGINE_PRESSURE = "engine_pressure"  # KV-cache usage, queue depth, preemptions
    ENGINE_CONFIG = "engine_config"  # engine startup arguments / ceilings seen in its logs
    CRASH_CAUSE = "crash_cause"  # a known non-memory crash cause (CUDA fault, NCCL, Xid)
    # a pod's IP from an EndpointSlice endpoint (targetRef kind Pod): identity only, it feeds
    # the resolver's IP -> pod map and is evidence of nothing (a not-Ready pod has one too)
    POD_ADDRESS = "pod_address"
    # an engine that could not start because its GPU's memory is held: the dead engine's not
    # yet freed, or another process's (vLLM's start-up free-memory check, vllm#42017)
    START_FAILED = "start_failed"


@slot_init
@dataclass(frozen=True, slots=True)
class SourcePos:
    """Where a record came from: a file and 1-based line, or a Kafka topic/partition/offset."""

    origin: str  # file path or Kafka topic
    position: int  # line number (files) or offset (Kafka)
    partition: int | None = None  # Kafka partition; None for files

    def __str__(self) -> str:
        if self.partition is None:
            return f"{self.origin}:{self.position}"
        return f"{self.origin}[{self.partition}]@{self.position}"


@slot_init
@dataclass(frozen=True, slots=True)
class Signal:
    """One observation, in event time.

    ``time`` is event time in Unix seconds (UTC). Identity fields are what the record
    carried; the correlator maps them to a workload. ``attrs`` holds the kind-specific
    fields, all optional:

    - gpu_oom: framework, bytes_tried, capacity_bytes, free_bytes, gpu_index (ints, bytes);
      ambiguous=True when the line alone cannot decide (the correlator then needs context);
      quoted=True when the OOM is another component's copy (an HTTP error body)
    - engine_dead: framework
    - start_failed: framework, free_bytes, capacity_bytes, gpu_index (ints, bytes)
    - crash_loop: reason, restart_count, exit_code, last_reason, count
    - host_oom: reason, exit_code
    - pod_ready: ready (bool)
    - lb_response: status, upstream_status, upstream, upstream_addr, count; a Prometheus
      counter sample instead carries counter_total (cumulative) and series (its identity),
      and the correlator turns successive samples into counts; sidecar=True when the line
      was logged by the serving pod's own proxy (the pod, not the upstream, names the workload)
    - gpu_memory: used_bytes, total_bytes (or free_bytes), gpu, uuid (the device; with MIG
      or MPS several pods report one device: never sum them; None from nvidia-smi without
      one), metric
    - engine_pressure: engine, kv_cache_usage (0..1), requests_waiting, requests_running,
      requests_swapped, preemptions (running total), batch_max_tokens, metric, model
    - engine_config: engine, and any of max_num_seqs, max_num_batched_tokens, max_model_len,
      gpu_memory_utilization, enable_prefix_caching, kv_cache_bytes, max_concurrency ...
    - crash_cause: cause (illegal_memory_access, device_side_assert, nccl_timeout, xid ...),
      cause_text, xid
    - pod_address: pod_ip, ready (bool or None), service (the EndpointSlice's service)
    """

    kind: SignalKind
    time: float
    source: SourcePos
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    node: str | None = None
    cluster: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    owner: tuple[str, str] | None = None  # (kind, name) from ownerReferences, if carried
    attrs: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the raw text that produced the signal, truncated to 2 KiB


@slot_init
@dataclass(frozen=True, slots=True)
class LogLine:
    """One container log line taken out of its shipper envelope (Fluent Bit, Vector ...).

    ``time`` is event time in Unix seconds; ``text`` is the line without its trailing newline.
    """

    time: float
    text: str
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    node: str | None = None
    cluster: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    owner: tuple[str, str] | None = None
    stream: str | None = None  # stdout / stderr

    def to_signal(self, kind: SignalKind, source: SourcePos, attrs: dict[str, Any]) -> Signal:
        """Return a signal of ``kind`` carrying this line's time, identity and text (2 KiB)."""
        return Signal(  # positional: kind, time, source, namespace ... text (once per signal)
            kind,
            self.time,
            source,
            self.namespace,
            self.pod,
            self.container,
            self.node,
            self.cluster,
            self.labels,
            self.owner,
            attrs,
            self.text[:MAX_TEXT_CHARS],
        )
