"""Recognize a record's format from its content and turn it into Signals.

JSON objects are told apart by their keys after one ``json.loads``: Fluent Bit (``log``),
Vector (``message`` + ``kubernetes``), prometheus-kafka-adapter (``name``/``value``/``labels``),
Kubernetes Events (``involvedObject`` / ``regarding``), Pods (``kind: Pod`` or
metadata/spec/status), lists (``kind: *List`` with ``items``, or a JSON array) and the envelopes
of event shippers (eventrouter ``event``, OpenTelemetry ``body``, watch ``object``). Other lines
are bare ingress-nginx access lines or Prometheus exposition lines. The file name never decides.
"""

from __future__ import annotations

import json
from typing import Any

from detector.errors import ParseError
from detector.events.container_log import signals_from_log_line
from detector.events.model import LogLine, Signal, SourcePos
from detector.events.sources import ingress_nginx, lb_access
from detector.events.sources.dcgm import signals_from_exposition_line
from detector.events.sources.fluentbit import parse_fluentbit_record
from detector.events.sources.k8s_event import signals_from_event
from detector.events.sources.k8s_pod import signals_from_pod
from detector.events.sources.prom_kafka_adapter import signals_from_adapter_sample
from detector.events.sources.vector import parse_vector_event

MAX_RECORD_BYTES = 1024 * 1024
_MAX_NESTING = 3  # List -> watch envelope -> object


def parse_record(
    raw: bytes | str,
    source: SourcePos,
    *,
    default_time: float | None = None,
    max_bytes: int = MAX_RECORD_BYTES,
) -> list[Signal]:
    """Parse one record (a Kafka message value or a file line) into its signals.

    ``default_time`` (Unix seconds; e.g. the Kafka record or scrape time) times records that
    carry no time of their own. A valid record that says nothing returns ``[]``. Raises
    ``ParseError`` and nothing else; reasons: too_large (over ``max_bytes``), not_utf8,
    invalid_unicode,
    malformed_json, unknown_format, missing_field, missing_timestamp, bad_timestamp, bad_value,
    malformed_metric.
    """
    if len(raw) > max_bytes:
        raise ParseError("too_large", f"{len(raw)} bytes > {max_bytes}")
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError("not_utf8", f"invalid UTF-8 at byte {exc.start}") from None
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "{[":
        try:
            obj = json.loads(stripped)
        except (ValueError, RecursionError) as exc:
            raise ParseError("malformed_json", str(exc)[:200]) from None
        signals = _from_json(obj, source, default_time, 0)
        if "\\u" in stripped:  # only a \uXXXX escape can smuggle in a lone surrogate
            _check_unicode(signals)
        return signals
    if stripped[0] == "\ufeff":
        return parse_record(stripped[1:], source, default_time=default_time, max_bytes=max_bytes)
    sig = ingress_nginx.signal_from_raw_access_line(stripped, source)
    if sig is None:
        sig = lb_access.signal_from_raw_lb_line(stripped, source, default_time)
    if sig is not None:
        return [sig]
    return signals_from_exposition_line(stripped, source, default_time=default_time)


def _check_unicode(signals: list[Signal]) -> None:
    """Reject identity and attribute strings that cannot be stored (lone surrogates)."""
    for sig in signals:
        fields = [sig.namespace, sig.pod, sig.container, sig.node, sig.cluster]
        fields += [*sig.labels, *sig.labels.values(), *map(str, sig.attrs.values())]
        for value in fields:
            try:
                if value is not None:
                    value.encode("utf-8")
            except UnicodeEncodeError:
                raise ParseError("invalid_unicode", "lone surrogate in an identity field") from None


def signals_from_log(line: LogLine, source: SourcePos) -> list[Signal]:
    """Return the signals of one container log line.

    An ingress-nginx access line gives LB_RESPONSE; a Kubernetes Event printed by an event
    exporter's stdout sink gives its event signal; any other line goes to
    ``detector.events.container_log`` (GPU OOM, engine dead, engine config/pressure).
    """
    sig = ingress_nginx.signal_from_access_line(line, source)
    if sig is None:
        sig = lb_access.signal_from_lb_line(line, source)
    if sig is not None:
        return [sig]
    text = line.text
    if text[:1] == "{" and '"involvedObject"' in text:  # an event exporter's stdout sink
        return _event_in_log(line, source)
    return signals_from_log_line(line, source)


def _event_in_log(line: LogLine, source: SourcePos) -> list[Signal]:
    """Parse a Kubernetes Event that an exporter printed as its log line; time from the line."""
    try:
        obj = json.loads(line.text)
    except (ValueError, RecursionError):
        return signals_from_log_line(line, source)
    if not isinstance(obj, dict):
        return signals_from_log_line(line, source)
    return signals_from_event(obj, source, default_time=line.time)


def _from_json(obj: Any, source: SourcePos, default_time: float | None, depth: int) -> list[Signal]:
    if isinstance(obj, dict):
        return _from_object(obj, source, default_time, depth)
    if isinstance(obj, list) and depth == 0:
        return _from_items(obj, source, default_time, depth)
    raise ParseError("unknown_format", f"JSON {type(obj).__name__} is not a record")


def _from_object(
    obj: dict[str, Any], source: SourcePos, default_time: float | None, depth: int
) -> list[Signal]:
    if "log" in obj:
        return signals_from_log(parse_fluentbit_record(obj, default_time=default_time), source)
    if "message" in obj:
        k8s = obj.get("kubernetes")
        if isinstance(k8s, dict) and "namespace_name" in k8s:  # Fluent Bit, log renamed
            return signals_from_log(parse_fluentbit_record(obj, default_time=default_time), source)
        if isinstance(k8s, dict) or obj.get("source_type") == "kubernetes_logs":
            return signals_from_log(parse_vector_event(obj, default_time=default_time), source)
    if ("labels" in obj and "value" in obj) or ("__name__" in obj and "__value__" in obj):
        return signals_from_adapter_sample(obj, source)
    if "involvedObject" in obj or "regarding" in obj:
        return signals_from_event(obj, source, default_time=default_time)
    lb = lb_access.signals_from_lb_json(obj, source)
    if lb is not None:
        return lb
    kind = obj.get("kind")
    if kind == "Pod" or (kind is None and "status" in obj and "spec" in obj and "metadata" in obj):
        return signals_from_pod(obj, source)
    if kind == "Event":
        return signals_from_event(obj, source, default_time=default_time)
    items = obj.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        return _from_items(items, source, default_time, depth)
    inner = _envelope(obj)
    if inner is not None and depth < _MAX_NESTING:
        return _from_object(inner, source, default_time, depth + 1)
    keys = ", ".join(str(k)[:40] for k in list(obj)[:8])
    raise ParseError("unknown_format", f"JSON object with keys: {keys}")


def _envelope(obj: dict[str, Any]) -> dict[str, Any] | None:
    """Return the object inside an eventrouter (``event``), OpenTelemetry stanza (``body``) or
    Kubernetes watch (``object``) envelope, or None.
    """
    for key in ("event", "body", "object"):
        inner = obj.get(key)
        if isinstance(inner, dict):
            return inner
    return None


def _from_items(
    items: list[Any], source: SourcePos, default_time: float | None, depth: int
) -> list[Signal]:
    """Parse the items of a List; skip items that fail unless every item fails."""
    out: list[Signal] = []
    first_error: ParseError | None = None
    parsed = 0
    for item in items:
        try:
            if not isinstance(item, dict) or depth >= _MAX_NESTING:
                raise ParseError("unknown_format", "list item is not an object")
            out.extend(_from_object(item, source, default_time, depth + 1))
            parsed += 1
        except ParseError as exc:
            first_error = first_error or exc
    if parsed == 0 and first_error is not None:
        raise first_error
    return out
