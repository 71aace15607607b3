"""The Signal: one normalized observation parsed from a record of one of the four streams."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MAX_TEXT_CHARS = 2048  # Signal.text keeps at most this much of the raw text


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
        return Signal(
            kind=kind,
            time=self.time,
            source=source,
            namespace=self.namespace,
            pod=self.pod,
            container=self.container,
            node=self.node,
            cluster=self.cluster,
            labels=self.labels,
            owner=self.owner,
            attrs=attrs,
            text=self.text[:MAX_TEXT_CHARS],
        )
