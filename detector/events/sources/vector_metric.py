"""Vector metric events (``prometheus_scrape`` and other metric sources, JSON codec) -> Signal.

A metric event as Vector's ``json`` codec writes it on a sink (Kafka, file, stdout)::

    {"name": "DCGM_FI_DEV_FB_USED", "namespace": null,
     "tags": {"gpu": "0", "UUID": "GPU-...", "Hostname": "node-1", "pod": "vllm-...", ...},
     "timestamp": "2025-03-14T09:03:30.123456789Z", "kind": "absolute",
     "gauge": {"value": 79000.0}}

``counter`` {``value``} instead of ``gauge`` for a counter. The ``native_json`` codec wraps the
same object as ``{"metric": {...}}``; both are read. With ``namespace`` set, the Prometheus
name is ``<namespace>_<name>`` (how Vector's ``prometheus_exporter`` sink joins them). Only
``absolute`` values are samples of the series (an ``incremental`` counter is a change since
the last event, not a total; an incremental gauge, a change of the value): incremental events
say nothing. Metrics map as in ``detector.events.sources.dcgm`` (GPU memory, engine pressure,
load-balancer counters). Sources: https://vector.dev/docs/architecture/data-model/metric ,
https://vector.dev/docs/reference/configuration/sources/prometheus_scrape/ ,
https://vector.dev/highlights/2022-03-31-native-event-codecs/ (``native_json``).
"""

from __future__ import annotations

from typing import Any

from detector.errors import ParseError
from detector.events.model import Signal, SourcePos
from detector.events.sources.dcgm import KNOWN_METRICS, signal_from_sample
from detector.events.sources.timeparse import parse_time, str_map

MAX_TEXT_CHARS = 2048
_VALUE_KINDS = ("gauge", "counter")
# every value type of the data model: one of them makes an object a metric event
_ALL_VALUE_KINDS = frozenset(
    {"gauge", "counter", "set", "distribution", "histogram", "summary"}
    | {"aggregated_histogram", "aggregated_summary", "sketch"}
)


def is_vector_metric(obj: dict[str, Any]) -> bool:
    """Return whether a decoded JSON object is a Vector metric event (flat or ``native_json``)."""
    inner = obj.get("metric")
    if isinstance(inner, dict) and len(obj) == 1:
        obj = inner
    return "name" in obj and "kind" in obj and not _ALL_VALUE_KINDS.isdisjoint(obj)


def signals_from_vector_metric(
    obj: dict[str, Any], source: SourcePos, *, default_time: float | None = None
) -> list[Signal]:
    """Turn one decoded Vector metric event into at most one signal.

    Gauges and absolute counters of mapped metrics become GPU_MEMORY, ENGINE_PRESSURE or
    LB_RESPONSE signals (attrs: see ``dcgm.signal_from_sample``); other metrics, value types
    (distribution, histogram, set, summary) and incremental values say nothing. The time is
    ``timestamp`` (RFC 3339), else ``default_time``. Raises ``ParseError("missing_field")``
    without a name or (for a mapped gauge or counter) a value or time, ``"bad_value"`` for a
    value that is not a number, ``"bad_timestamp"`` for a bad time.
    Format: https://vector.dev/docs/architecture/data-model/metric
    """
    inner = obj.get("metric")
    event = inner if isinstance(inner, dict) and len(obj) == 1 else obj
    name = event.get("name")
    if not isinstance(name, str) or not name:
        raise ParseError("missing_field", "name")
    namespace = event.get("namespace")
    if isinstance(namespace, str) and namespace:
        name = f"{namespace}_{name}"
    if name not in KNOWN_METRICS or event.get("kind") != "absolute":
        return []
    holder = next((event[k] for k in _VALUE_KINDS if isinstance(event.get(k), dict)), None)
    if holder is None:
        return []  # a distribution, histogram, set or summary: no mapped metric is one
    value = _value(holder.get("value"))
    raw_time = event.get("timestamp")
    if raw_time is None:
        if default_time is None:
            raise ParseError("missing_field", "timestamp")
        time = default_time
    else:
        time = parse_time(raw_time)
    tags = event.get("tags")
    labels = str_map(tags) if isinstance(tags, dict) else {}
    text = f"{name} {holder.get('value')}"[:MAX_TEXT_CHARS]
    sig = signal_from_sample(name, labels, value, time, source, text)
    return [sig] if sig is not None else []


def _value(raw: Any) -> float:
    """Read a value: a JSON number (Vector writes floats; NaN and infinities as strings)."""
    if raw is None:
        raise ParseError("missing_field", "value")
    if isinstance(raw, bool):
        raise ParseError("bad_value", "boolean metric value")
    if isinstance(raw, int | float | str):
        try:
            return float(raw)
        except (ValueError, OverflowError):
            pass
    raise ParseError("bad_value", f"not a number: {str(raw)[:40]!r}")
