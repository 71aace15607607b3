"""prometheus-kafka-adapter JSON samples (Prometheus remote_write -> Kafka) -> Signal.

One Kafka message per sample::

    {"timestamp": "2020-01-01T00:00:00Z", "value": "79000", "name": "DCGM_FI_DEV_FB_USED",
     "labels": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": "0", "UUID": "GPU-...", ...}}

``timestamp`` is RFC 3339 at second precision, ``value`` a Go-formatted float string ("456",
"+Inf", "NaN"). Releases before 1.0 wrote one flat object with ``__name__``, ``__value__`` and
``__timestamp__`` beside the labels; that shape is read too. Metrics map as in
``detector.events.sources.dcgm``. Source: https://github.com/Telefonica/prometheus-kafka-adapter
(README "output" and serializers.go).
"""

from __future__ import annotations

from typing import Any

from detector.errors import ParseError
from detector.events.model import Signal, SourcePos
from detector.events.sources.dcgm import KNOWN_METRICS, signal_from_sample
from detector.events.sources.timeparse import parse_time, str_map


def signals_from_adapter_sample(sample: dict[str, Any], source: SourcePos) -> list[Signal]:
    """Turn one decoded prometheus-kafka-adapter message into at most one signal.

    Raises ``ParseError("missing_field")`` without a name, value or timestamp,
    ``"bad_value"`` for a value that is not a number, ``"bad_timestamp"`` for a bad time.
    Format: https://github.com/Telefonica/prometheus-kafka-adapter#json
    """
    labels_obj = sample.get("labels")
    if isinstance(labels_obj, dict):
        labels = str_map(labels_obj)
        name, raw_value, raw_time = sample.get("name"), sample.get("value"), sample.get("timestamp")
    else:  # pre-1.0 flat shape
        labels = {k: v for k, v in sample.items() if isinstance(v, str) and k[:2] != "__"}
        name, raw_value = sample.get("__name__"), sample.get("__value__")
        raw_time = sample.get("__timestamp__")
    if not isinstance(name, str) or not name:
        name = labels.get("__name__")
    if not name:
        raise ParseError("missing_field", "name")
    if raw_value is None or raw_time is None:
        raise ParseError("missing_field", "value" if raw_value is None else "timestamp")
    value = _value(raw_value)
    time = parse_time(raw_time)
    if name not in KNOWN_METRICS:
        return []
    sig = signal_from_sample(name, labels, value, time, source, f"{name} {raw_value}"[:2048])
    return [sig] if sig is not None else []


def _value(raw: Any) -> float:
    """Read the sample value: a Go float string ("79000", "+Inf", "NaN") or a JSON number."""
    if isinstance(raw, bool):
        raise ParseError("bad_value", "boolean sample value")
    if isinstance(raw, int | float | str):
        try:
            return float(raw)
        except (ValueError, OverflowError):
            pass
    raise ParseError("bad_value", f"not a number: {str(raw)[:40]!r}")
