"""OpenTelemetry Collector logs, ``otlp_json`` encoding (its kafka exporter) -> log records.

One Kafka message is one ``ExportLogsServiceRequest`` in the protobuf JSON mapping::

    {"resourceLogs": [{"resource": {"attributes": [
        {"key": "k8s.namespace.name", "value": {"stringValue": "llm"}}, ...]},
      "scopeLogs": [{"scope": {}, "logRecords": [
        {"timeUnixNano": "1741943017123456789",
         "body": {"stringValue": "torch.OutOfMemoryError: CUDA out of memory. ..."},
         "attributes": [{"key": "log.iostream", "value": {"stringValue": "stderr"}}]}]}]}]}

A container line (the filelog receiver's ``container`` operator) has a string body and its
identity in the resource's attributes or its own (the record's win): ``k8s.namespace.name``,
``k8s.pod.name``, ``k8s.container.name``, ``k8s.node.name``, the owner from the k8sattributes
processor (``k8s.replicaset.name``, ``k8s.statefulset.name``, ``k8s.daemonset.name``,
``k8s.job.name``) and the pod's labels
under ``k8s.pod.labels.<label>``. A Kubernetes object (the k8sobjects receiver: the object
itself, or a watch event ``{"type", "object"}``) is a map body, returned as a plain object.
Times: ``timeUnixNano``, else ``observedTimeUnixNano`` (a decimal string or a number).
Sources: https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding ; in
https://github.com/open-telemetry/opentelemetry-proto : opentelemetry/proto/logs/v1/logs.proto ;
in https://github.com/open-telemetry/opentelemetry-collector-contrib :
pkg/stanza/docs/operators/container.md, processor/k8sattributesprocessor/README.md,
receiver/k8sobjectsreceiver/README.md
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from detector.errors import ParseError
from detector.events.model import LogLine

LABEL_PREFIX = "k8s.pod.labels."
# k8sattributes' owner attributes, in the order a pod's controller is named by
_OWNERS = (
    ("k8s.replicaset.name", "ReplicaSet"),
    ("k8s.statefulset.name", "StatefulSet"),
    ("k8s.daemonset.name", "DaemonSet"),
    ("k8s.job.name", "Job"),
)
_MAX_DEPTH = 32  # nested AnyValues deeper than this are not a Kubernetes object


def is_otlp_logs(obj: dict[str, Any]) -> bool:
    """Return whether a decoded JSON object is an OTLP/JSON logs request."""
    return isinstance(obj.get("resourceLogs"), list)


def otlp_log_records(
    obj: dict[str, Any], default_time: float | None = None
) -> Iterator[LogLine | dict[str, Any]]:
    """Yield each log record of an OTLP/JSON logs request: a LogLine for a string body, the
    object for a map body (a Kubernetes object or watch event).

    Raises ``ParseError("missing_field")`` for a string body without a time (and no
    ``default_time``), ``"bad_timestamp"`` for a time that is not a number, ``"unknown_format"``
    for a malformed request (a resource or record that is not an object).
    Format: https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding
    """
    for resource_logs in obj["resourceLogs"]:
        if not isinstance(resource_logs, dict):
            raise ParseError("unknown_format", "OTLP resourceLogs item is not an object")
        resource = _attributes(_object(resource_logs.get("resource")).get("attributes"))
        for scope_logs in resource_logs.get("scopeLogs") or ():
            for record in _object(scope_logs).get("logRecords") or ():
                record = _object(record)
                body = any_value(record.get("body"))
                if isinstance(body, dict):
                    yield body
                elif isinstance(body, str):
                    attrs = resource | _attributes(record.get("attributes"))
                    yield _line(attrs, body, _time(record, default_time))


def any_value(value: Any, depth: int = 0) -> Any:
    """Return the Python value of an OTLP ``AnyValue`` (None for an empty or unknown one).

    Raises ``ParseError("unknown_format")`` for values nested past ``_MAX_DEPTH``.
    """
    if not isinstance(value, dict) or depth > _MAX_DEPTH:
        if depth > _MAX_DEPTH:
            raise ParseError("unknown_format", "OTLP value nested too deep")
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "kvlistValue" in value:
        pairs = _object(value["kvlistValue"]).get("values") or ()
        return {
            p["key"]: any_value(p.get("value"), depth + 1)
            for p in pairs
            if isinstance(p, dict) and isinstance(p.get("key"), str)
        }
    if "arrayValue" in value:
        items = _object(value["arrayValue"]).get("values") or ()
        return [any_value(v, depth + 1) for v in items]
    if "intValue" in value:  # an int64: a decimal string in the JSON mapping
        raw = value["intValue"]
        return int(raw) if isinstance(raw, int | str) and str(raw).lstrip("-").isdigit() else None
    for key in ("boolValue", "doubleValue"):
        if key in value:
            return value[key]
    return None


def _line(attrs: dict[str, Any], body: str, time: float) -> LogLine:
    """Return a container line; ``attrs``: the resource's attributes, then the record's."""
    labels = {
        k[len(LABEL_PREFIX) :]: v
        for k, v in attrs.items()
        if k.startswith(LABEL_PREFIX) and isinstance(v, str)
    }
    owner = next(((kind, attrs[k]) for k, kind in _OWNERS if _text(attrs.get(k))), None)
    return LogLine(
        time=time,
        text=body.removesuffix("\n"),
        namespace=_text(attrs.get("k8s.namespace.name")),
        pod=_text(attrs.get("k8s.pod.name")),
        container=_text(attrs.get("k8s.container.name")),
        node=_text(attrs.get("k8s.node.name")),
        cluster=_text(attrs.get("k8s.cluster.name")),
        labels=labels,
        owner=owner,
        stream=_text(attrs.get("log.iostream")),
    )


def _attributes(items: Any) -> dict[str, Any]:
    """Return an OTLP attribute list (``[{"key", "value"}]``) as a dict."""
    if not isinstance(items, list):
        return {}
    return {
        a["key"]: any_value(a.get("value"))
        for a in items
        if isinstance(a, dict) and isinstance(a.get("key"), str)
    }


def _time(record: dict[str, Any], default_time: float | None) -> float:
    for key in ("timeUnixNano", "observedTimeUnixNano"):
        nanos = _int(record.get(key)) if record.get(key) is not None else 0
        if nanos:
            return nanos / 1e9
    if default_time is None:
        raise ParseError("missing_field", "timeUnixNano")
    return default_time


def _int(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ParseError("bad_timestamp", f"not an integer: {str(raw)[:40]!r}")
    try:
        return int(raw)
    except ValueError:
        raise ParseError("bad_timestamp", f"not an integer: {str(raw)[:40]!r}") from None


def _object(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ParseError("unknown_format", "OTLP item is not an object")
    return value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
