"""Name the format a record was read as, from its outer shape and the signals it gave.

``detect.parse_record`` recognizes a record's format from its content and returns only its
signals; ``detector explain`` also shows the format. This names it without parsing the record
again: the first character and, for a JSON object, its top-level keys, tested in the order
``detect`` tests them (its module docstring lists the formats and their sources), and for
text the kind of signal it gave. Pure.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from detector.errors import ParseError
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources import vector_metric
from detector.events.sources.cri import parse_cri_line
from detector.events.sources.dcgm import signals_from_exposition_line
from detector.events.sources.kubectl_text import is_kubectl_text
from detector.events.sources.nvidia_smi import signals_from_csv_line
from detector.events.sources.nvidia_smi_table import is_nvidia_smi_table
from detector.events.sources.raw_text import split_kubectl_prefix

UNREADABLE: Final = "unreadable"  # not UTF-8, too large, or malformed JSON
UNKNOWN: Final = "unknown"  # a valid record of no format the detector reads
PLAIN_TEXT: Final = "plain text (a pod's own log, --pod)"
JSON_LINE: Final = "JSON line"  # a load-balancer's JSON access line or an application's JSON log
_HEAD_CHARS = 4096
_BLOCKING = ("too_large", "not_utf8", "malformed_json")
_decode = msgspec.json.Decoder().decode


def record_format(raw: bytes, signals: list[Signal], error: ParseError | None = None) -> str:
    """Return the name of the format ``raw`` was read as.

    ``signals`` are what ``parse_record`` gave and ``error`` what it raised; a record it
    rejected before reading any format (too large, not UTF-8, malformed JSON) is
    ``UNREADABLE``, one of no known format ``UNKNOWN``.
    """
    if error is not None and error.reason in _BLOCKING:
        return UNREADABLE
    text = raw[:_HEAD_CHARS].decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    first = text[:1]
    if "\n" in text.rstrip() and first not in "{[":
        return _document(text)
    if first == "{":
        return _with_inner(_json_object(raw, signals), signals)
    if first == "[":
        if split_kubectl_prefix(text) is not None:
            return "kubectl logs --prefix"
        return "JSON list" if _is_json(raw) else _text_line(text, signals, error)
    return _text_line(text, signals, error)


_SHIPPERS = ("Fluent Bit", "Docker json-file", "Vector kubernetes_logs")


def _with_inner(name: str, signals: list[Signal]) -> str:
    """Add what a log shipper's record carried when it was a proxy's access line."""
    if name.startswith(_SHIPPERS) and any(s.kind is SignalKind.LB_RESPONSE for s in signals):
        return f"{name}: access log line"
    return name


def _document(head: str) -> str:
    if is_nvidia_smi_table(head):
        return "nvidia-smi table"
    if is_kubectl_text(head):
        return "kubectl describe/get output"
    return UNKNOWN


def _text_line(text: str, signals: list[Signal], error: ParseError | None) -> str:
    """Name a text line: CRI, access log, nvidia-smi CSV, Prometheus exposition, plain text."""
    if text[:1].isdigit() and parse_cri_line(text, "") is not None:
        return "CRI log line"
    if text[:1] == "#":
        return "Prometheus exposition"  # a # HELP / # TYPE line
    for sig in signals:
        metric = sig.attrs.get("metric")
        if metric == "nvidia_smi":
            return "nvidia-smi CSV"
        if metric is not None:
            return "Prometheus exposition"
        if sig.kind is SignalKind.LB_RESPONSE:
            return "access log line"
    if error is not None:
        return UNKNOWN
    if not signals:
        return _said_nothing(text)
    return PLAIN_TEXT


def _said_nothing(text: str) -> str:
    """Name a text line that gave no signal as ``detect._from_text`` tells it: an nvidia-smi
    CSV header, a Prometheus sample of a metric the detector does not use, else plain text."""
    where = SourcePos("", 0)
    try:
        if "," in text and "{" not in text and signals_from_csv_line(text, where) is not None:
            return "nvidia-smi CSV"
        signals_from_exposition_line(text, where)
    except ParseError:
        return PLAIN_TEXT
    return "Prometheus exposition"


def _is_json(raw: bytes) -> bool:
    try:
        _decode(raw)
    except msgspec.MsgspecError:
        return False
    return True


def _json_object(raw: bytes, signals: list[Signal]) -> str:
    lb = any(s.kind is SignalKind.LB_RESPONSE for s in signals)
    try:
        obj = _decode(raw)
    except msgspec.MsgspecError:  # ingress-nginx JSON with a $variable unquoted, read by field
        return f"{JSON_LINE}: load-balancer" if lb else UNREADABLE
    if not isinstance(obj, dict):
        return UNKNOWN
    name = json_format(obj)
    if name == JSON_LINE:
        return f"{name}: load-balancer" if lb else f"{name}: application"
    return name


def json_format(obj: dict[str, Any]) -> str:
    """Name a JSON object's format by its keys, in the order ``detect._from_object`` tests."""
    k8s = obj.get("kubernetes")
    if "log" in obj:
        return "Fluent Bit" if isinstance(k8s, dict) else "Docker json-file"
    if isinstance(k8s, dict) and "namespace_name" in k8s:
        return "Fluent Bit (log renamed or merged)"
    if "message" in obj and (isinstance(k8s, dict) or obj.get("source_type") == "kubernetes_logs"):
        return "Vector kubernetes_logs"
    if ("labels" in obj and "value" in obj) or ("__name__" in obj and "__value__" in obj):
        return "prometheus-kafka-adapter"
    if vector_metric.is_vector_metric(obj):
        return "Vector metric"
    if "involvedObject" in obj or "regarding" in obj:
        return "Kubernetes Event"
    kind = obj.get("kind")
    if kind == "Pod" or (kind is None and {"status", "spec", "metadata"} <= obj.keys()):
        return "Kubernetes Pod"
    if isinstance(kind, str) and kind in ("Event", "EndpointSlice"):
        return f"Kubernetes {kind}"
    if isinstance(kind, str) and kind.endswith("List"):
        return f"Kubernetes {kind}"
    if isinstance(obj.get("resourceLogs"), list):  # the Collector's otlp_json logs request
        return "OTLP JSON logs"
    for key, name in (("event", "eventrouter"), ("body", "OpenTelemetry"), ("object", "watch")):
        if isinstance(obj.get(key), dict):
            return f"{name} envelope"
    return JSON_LINE
