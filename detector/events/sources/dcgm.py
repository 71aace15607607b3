"""Prometheus exposition lines (dcgm-exporter, vLLM, SGLang, TGI) and metric samples -> Signal.

One exposition line is one record: ``name{label="value",...} value [timestamp_ms]``.
``# HELP`` / ``# TYPE`` / comments and blank lines say nothing; unknown metric names say
nothing. Mapped metrics:

- dcgm-exporter ``DCGM_FI_DEV_FB_USED`` / ``_FREE`` / ``_TOTAL`` (MiB) -> GPU_MEMORY
  ``used_bytes`` / ``free_bytes`` / ``total_bytes``, with the device ``uuid`` (a MIG instance:
  the UUID plus its ``GPU_I_ID``). With MPS or MIG sharing, dcgm-exporter repeats one device's
  value once per pod: the signals carry the same ``uuid`` and the correlator keys on it, so
  they are never summed;
- serving-engine gauges and counters (vLLM, TGI, SGLang) -> ENGINE_PRESSURE, mapped by
  ``detector.events.sources.engine_metrics``.

Sources: https://prometheus.io/docs/instrumenting/exposition_formats/ ,
https://docs.nvidia.com/datacenter/dcgm/latest/dcgm-api/dcgm-api-field-ids.html ,
https://docs.vllm.ai/en/latest/usage/metrics.html .
"""

from __future__ import annotations

import math
import re
from typing import Any

from detector.errors import ParseError
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources import lb_prometheus
from detector.events.sources.engine_metrics import ENGINE_METRICS, engine_pressure_attrs
from detector.events.sources.lb_prometheus import LB_COUNTERS
from detector.events.sources.timeparse import first_label, parse_epoch

MAX_TEXT_CHARS = 2048
_MIB = 1024 * 1024

GPU_MEMORY_METRICS: dict[str, str] = {
    "DCGM_FI_DEV_FB_USED": "used_bytes",
    "DCGM_FI_DEV_FB_FREE": "free_bytes",
    "DCGM_FI_DEV_FB_TOTAL": "total_bytes",
}
KNOWN_METRICS = frozenset(GPU_MEMORY_METRICS) | frozenset(ENGINE_METRICS) | LB_COUNTERS

# Identity labels, most specific first: with honor_labels=false Prometheus renames the
# exporter's pod/namespace/container to exported_* and puts its own target's in pod/namespace.
_POD_KEYS = ("exported_pod", "pod", "pod_name", "kubernetes_pod_name")
_NAMESPACE_KEYS = ("exported_namespace", "namespace", "kubernetes_namespace")
_CONTAINER_KEYS = ("exported_container", "container", "container_name")
_NODE_KEYS = ("Hostname", "hostname", "node", "kubernetes_node")

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?[ \t]+(\S+)(?:[ \t]+(\S+))?[ \t]*")
_SERIES_ONLY = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?")
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r"\\[\\\"n]")


def signals_from_exposition_line(
    line: str, source: SourcePos, *, default_time: float | None = None
) -> list[Signal]:
    """Parse one exposition line into at most one signal.

    Time: the line's timestamp (ms), else ``default_time`` (the scrape time); raises
    ``ParseError("missing_timestamp")`` for a mapped metric with neither. Raises
    ``ParseError("unknown_format")`` for a line that is not a sample, ``"missing_field"`` for a
    series without a value, ``"bad_value"`` / ``"malformed_metric"`` for a broken sample.
    Format: https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format
    """
    text = line.strip()
    if not text or text[0] == "#":
        return []
    m = _SAMPLE.fullmatch(text)
    if m is None:
        if _SERIES_ONLY.fullmatch(text) and "{" in text:
            raise ParseError("missing_field", "sample value")
        raise ParseError("unknown_format", "not an exposition sample line")
    name = m.group(1)
    value = _number(m.group(3), known=name in KNOWN_METRICS or m.group(2) is not None)
    if name not in KNOWN_METRICS:
        return []
    stamp = m.group(4)
    if stamp is not None:
        time = stamp_time(stamp)
    elif default_time is not None:
        time = default_time
    else:
        raise ParseError("missing_timestamp", f"{name} sample without timestamp or scrape time")
    labels = parse_labels(m.group(2)) if m.group(2) else {}
    sig = signal_from_sample(name, labels, value, time, source, text[:MAX_TEXT_CHARS])
    return [sig] if sig is not None else []


def signal_from_sample(
    name: str,
    labels: dict[str, str],
    value: float,
    time: float,
    source: SourcePos,
    text: str,
) -> Signal | None:
    """Map one metric sample to GPU_MEMORY, ENGINE_PRESSURE or (LB counters) LB_RESPONSE.

    None for other metrics or NaN.
    GPU_MEMORY attrs: used_bytes | free_bytes | total_bytes (MiB x 1048576), gpu, uuid (the
    device UUID, suffixed "/mig<GPU_I_ID>" for a MIG instance), metric. ENGINE_PRESSURE attrs:
    see ``engine_metrics.engine_pressure_attrs`` (engine, kv_cache_usage, requests_waiting ...).
    """
    if name in LB_COUNTERS:
        return lb_prometheus.signal_from_sample(name, labels, value, time, source, text)
    mapped = _sample_attrs(name, labels, value)
    if mapped is None:
        return None
    kind, attrs = mapped
    return Signal(
        kind=kind,
        time=time,
        source=source,
        namespace=first_label(labels, _NAMESPACE_KEYS),
        pod=first_label(labels, _POD_KEYS),
        container=first_label(labels, _CONTAINER_KEYS),
        node=first_label(labels, _NODE_KEYS),
        attrs=attrs,
        text=text,
    )


def _sample_attrs(
    name: str, labels: dict[str, str], value: float
) -> tuple[SignalKind, dict[str, Any]] | None:
    """Return the kind and attrs of a mapped sample; None for other metrics and NaN/Inf."""
    if not math.isfinite(value):  # NaN is Prometheus' staleness marker
        return None
    field = GPU_MEMORY_METRICS.get(name)
    if field is not None:
        size = value * _MIB
        if not math.isfinite(size):
            return None
        uuid = labels.get("UUID") or labels.get("uuid")
        mig = labels.get("GPU_I_ID")
        if uuid and mig:
            uuid = f"{uuid}/mig{mig}"
        memory: dict[str, Any] = {field: int(size), "gpu": labels.get("gpu"), "uuid": uuid}
        memory["metric"] = name
        return SignalKind.GPU_MEMORY, memory
    attrs = engine_pressure_attrs(name, labels, value)
    return (SignalKind.ENGINE_PRESSURE, attrs) if attrs is not None else None


def parse_labels(block: str) -> dict[str, str]:
    """Parse a ``{name="value",...}`` label block; raises ``ParseError("malformed_metric")``.

    Lenient on separators (one ``findall``, for speed); values are unescaped (``\\\\``,
    ``\\"``, ``\\n``).
    """
    inner = block[1:-1]
    pairs = _LABEL_PAIR.findall(inner)
    if not pairs and inner.strip(" \t,"):
        raise ParseError("malformed_metric", f"bad label set {inner[:40]!r}")
    if "\\" not in inner:
        return dict(pairs)
    return {k: _ESCAPE.sub(lambda e: _UNESCAPE[e.group(0)], v) for k, v in pairs}


def _number(token: str, *, known: bool) -> float:
    """Read a sample value ("79000", "1.75e+09", "NaN", "+Inf")."""
    try:
        return float(token)
    except ValueError:
        if known:
            raise ParseError("bad_value", f"not a number: {token[:40]!r}") from None
        raise ParseError("unknown_format", "not an exposition sample line") from None


def stamp_time(token: str) -> float:
    """Read an exposition timestamp (integer ms since the epoch) as Unix seconds."""
    try:
        return parse_epoch(float(token))
    except ValueError:
        raise ParseError("bad_timestamp", f"not a timestamp: {token[:40]!r}") from None
