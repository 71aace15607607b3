"""Recognize a record's format from its content and turn it into Signals.

JSON objects are told apart by their keys after one ``json.loads``: Fluent Bit (``log`` +
``kubernetes``; without ``log``, its line renamed to ``message`` or merged into the record by
the kubernetes filter's Merge_Log), Docker json-file and other metadata-less ``log`` records,
Vector (``message`` + ``kubernetes``), bare load-balancer JSON lines (GCP, Envoy, ingress-nginx
JSON ``log-format-upstream``), prometheus-kafka-adapter (``name``/``value``/``labels``),
Vector metric events (``name``/``kind`` + ``gauge``/``counter``..., or ``native_json``'s
``metric``), Kubernetes Events (``involvedObject`` / ``regarding``), Pods (``kind: Pod`` or
metadata/spec/status), lists (``kind: *List`` with ``items``, or a JSON array) and the
envelopes of event shippers (eventrouter ``event``, OpenTelemetry ``body``, watch ``object``),
and the OpenTelemetry Collector's ``otlp_json`` logs requests (``resourceLogs``).
Text lines are CRI log lines, bare ingress-nginx (and other load-balancer) access lines,
nvidia-smi CSV rows, Prometheus exposition lines, ``kubectl logs --prefix`` lines, and, when
the caller gives their identity, plain log lines. Multi-line text records (whole files from
the reader) may be a pasted ``kubectl describe pod`` / ``get pods`` / ``get pod -o yaml``
output or an ``nvidia-smi`` table. The file name never decides the format; CRI and Docker
files carry their pod only in their path, which ``SourcePos.origin`` holds.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgspec

from detector.errors import ParseError
from detector.events.container_log import signals_from_log_line
from detector.events.model import LogLine, Signal, SourcePos
from detector.events.sources import (
    ingress_nginx,
    ingress_nginx_json,
    lb_access,
    otlp_json,
    vector_metric,
)
from detector.events.sources.cri import parse_cri_line
from detector.events.sources.dcgm import signals_from_exposition_line
from detector.events.sources.docker_json import parse_docker_record
from detector.events.sources.endpointslice import signals_from_endpointslice
from detector.events.sources.fluentbit import (
    fluentbit_line,
    json_line,
    merged_log,
    parse_fluentbit_record,
)
from detector.events.sources.k8s_event import signals_from_event
from detector.events.sources.k8s_pod import signals_from_pod
from detector.events.sources.kubectl_text import is_kubectl_text, signals_from_kubectl_text
from detector.events.sources.nvidia_smi import signals_from_csv_line
from detector.events.sources.nvidia_smi_table import (
    is_nvidia_smi_table,
    signals_from_nvidia_smi_table,
)
from detector.events.sources.prom_kafka_adapter import signals_from_adapter_sample
from detector.events.sources.raw_text import (
    LogIdentity,
    parse_json_app_line,
    parse_raw_line,
    split_kubectl_prefix,
)
from detector.events.sources.vector import parse_vector_event

MAX_RECORD_BYTES = 1024 * 1024
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # a pretty-printed JSON document (kubectl get -o json)
_MAX_NESTING = 3  # List -> watch envelope -> object
_JSON_ARRAY_STARTS = frozenset(("", "{", "[", '"', "]", " ", "\t", "\n", "\r"))
# The scanner json.loads uses (its default JSONDecoder's; typeshed types the context
# argument as a scanner, while json passes the decoder itself) and JSON's whitespace.
_scan_json: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]
)
_JSON_SPACE = re.compile(r"[ \t\n\r]*")  # json.decoder.WHITESPACE

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_RECORD_BYTES",
    "LogIdentity",
    "parse_record",
    "signals_from_log",
]


def parse_record(
    raw: bytes | str,
    source: SourcePos,
    *,
    default_time: float | None = None,
    max_bytes: int = MAX_RECORD_BYTES,
    identity: LogIdentity | None = None,
    not_after: float | None = None,
) -> list[Signal]:
    """Parse one record (a Kafka message value or a file line) into its signals.

    ``default_time`` (Unix seconds; e.g. the Kafka record or scrape time) times records that
    carry no time of their own (and gives the year to year-less log timestamps, which are
    never put after ``not_after``: the file's modification time or the wall clock; by default
    ``default_time``; see ``timeparse.complete_month_day``).
    ``identity`` is the identity of plain-text lines in no known format (the workload given on
    the command line): they become container log lines of it, timed by their leading
    timestamp or ``default_time``; it is also the fallback identity of CRI and Docker lines
    whose path names no pod, and of JSON log lines of an unknown shape. Without it, plain text
    is ``unknown_format``.
    ``max_bytes`` bounds a one-line record; a pretty-printed JSON document (its first line a
    lone ``{`` or ``[``, which the file reader yields whole) may be up to ``MAX_DOCUMENT_BYTES``.
    A valid record that says nothing returns ``[]``. Raises ``ParseError`` and nothing else;
    reasons: too_large, not_utf8, invalid_unicode, malformed_json, unknown_format,
    missing_field, missing_timestamp, bad_timestamp, bad_value, malformed_metric.
    Formats: the module docstring, each with its source in ``detector.events.sources``.
    """
    if len(raw) > max_bytes and not _is_document(raw):
        raise ParseError("too_large", f"{len(raw)} bytes > {max_bytes}")
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError("not_utf8", f"invalid UTF-8 at byte {exc.start}") from None
    stripped = text.strip()
    if stripped[:1] == "{":  # most records: straight to the JSON path of _parse_text
        return _from_json_text(stripped, source, default_time, identity, not_after)
    return _parse_text(stripped, source, default_time, identity, not_after)


def _is_document(raw: bytes | str) -> bool:
    """Tell a pretty-printed JSON document within ``MAX_DOCUMENT_BYTES``: a lone ``{``/``[``
    on its first non-blank line (how ``kubectl get -o json`` and ``json.dumps(indent=...)``
    start).
    """
    if len(raw) > MAX_DOCUMENT_BYTES:
        return False
    head = raw[:4096]
    text = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
    text = text.lstrip(" \t\r\n\ufeff")
    return text[:1] in ("{", "[") and text[1:].lstrip(" \t\r")[:1] == "\n"


def _parse_text(
    stripped: str,
    source: SourcePos,
    default_time: float | None,
    identity: LogIdentity | None,
    not_after: float | None = None,
) -> list[Signal]:
    if not stripped:
        return []
    first = stripped[0]
    if first in "{[":
        return _from_json_text(stripped, source, default_time, identity, not_after)
    if first == "\ufeff":  # byte-order marks, however many: strip, never recurse per mark
        rest = stripped.lstrip("\ufeff \t\r\n")
        return _parse_text(rest, source, default_time, identity, not_after)
    if "\n" in stripped:  # a multi-line document the file reader yields whole
        head = stripped[:4096]
        if is_nvidia_smi_table(head):
            namespace, pod = _pod_of(identity)
            return signals_from_nvidia_smi_table(
                stripped, source, default_time=default_time, namespace=namespace, pod=pod
            )
        if is_kubectl_text(head):
            namespace = identity.namespace if identity is not None else None
            return signals_from_kubectl_text(
                stripped, source, default_time=default_time, namespace=namespace
            )
    return _from_text(stripped, source, default_time, identity, not_after)


def _from_json_text(
    stripped: str,
    source: SourcePos,
    default_time: float | None,
    identity: LogIdentity | None,
    not_after: float | None = None,
) -> list[Signal]:
    try:
        obj = _loads(stripped)
    except (ValueError, RecursionError) as exc:
        if stripped[0] == "[":
            signals = _bracketed_text(stripped, source, default_time, identity, not_after)
            if signals is not None:
                return signals
            if stripped[1:2] not in _JSON_ARRAY_STARTS:  # "[04:40:55 TP0] ...": text, not JSON
                raise ParseError("unknown_format", f"bracketed {PLAIN_TEXT_HINT}") from None
        # an ingress-nginx JSON access line with a $variable unquoted: read field by field
        obj = ingress_nginx_json.decode_line(stripped) if stripped[0] == "{" else None
        if obj is None:
            raise ParseError("malformed_json", str(exc)[:200]) from None
    try:
        if type(obj) is dict:  # what _from_json does first, without its call
            signals = _from_object(obj, source, default_time, identity, 0)
        else:
            signals = _from_json(obj, source, default_time, identity, 0)
    except ParseError as exc:
        if identity is None or exc.reason != "unknown_format" or not isinstance(obj, dict):
            raise
        line = parse_json_app_line(obj, stripped, identity, default_time=default_time)
        return signals_from_log(line, source)
    if "\\u" in stripped:  # only a \uXXXX escape can smuggle in a lone surrogate
        _check_unicode(signals)
    return signals


def _loads(text: str) -> Any:
    """Decode one JSON document exactly as ``json.loads(text)`` does, for a ``str``.

    msgspec's decoder first (about 3.5x faster than json's on an 860-byte Fluent Bit record);
    the documents it refuses go through json's C scanner, so the values accepted and the
    ``JSONDecodeError`` messages are json's: NaN and Infinity, numbers past a float, lone
    surrogates in ``\\u`` escapes and nesting past msgspec's limit are json's to judge. For
    standard JSON both give the same values (dicts in key order, the last of duplicate keys,
    arbitrary-size integers, correctly rounded floats).
    Source: https://jcristharif.com/msgspec/api.html#msgspec.json.Decoder
    """
    try:
        return _fast_loads(text)
    except msgspec.MsgspecError:
        return _json_loads(text)


_fast_loads = msgspec.json.Decoder().decode


def _json_loads(text: str) -> Any:
    """Decode as ``json.loads(text)`` does: the same C scanner, values and ``JSONDecodeError``
    messages, without its per-call type, BOM and keyword checks (``text`` here never starts
    with a BOM: it starts with ``{`` or ``[``).
    Source: ``json.decoder.JSONDecoder.decode`` and ``raw_decode``.
    """
    start = _skip_json_space(text, 0) if text[:1] in " \t\n\r" else 0
    try:
        obj, end = _scan_json(text, start)
    except StopIteration as err:
        raise json.JSONDecodeError("Expecting value", text, err.value) from None
    if end != len(text):
        end = _skip_json_space(text, end)
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    return obj


def _skip_json_space(text: str, pos: int) -> int:
    """Return the index after the JSON whitespace (space, tab, CR, LF) at ``pos``."""
    space = _JSON_SPACE.match(text, pos)
    return space.end() if space is not None else pos


def _bracketed_text(
    stripped: str,
    source: SourcePos,
    default_time: float | None,
    identity: LogIdentity | None,
    not_after: float | None = None,
) -> list[Signal] | None:
    """Parse a line that starts with ``[`` but is no JSON; None when it is nothing known."""
    prefixed = split_kubectl_prefix(stripped)
    if prefixed is not None:
        pod, container, rest = prefixed
        rest = rest.strip()
        if split_kubectl_prefix(rest) is not None:  # bounded: no recursion per prefix
            raise ParseError("unknown_format", "nested kubectl log prefixes")
        if rest[:1] not in ("{", "["):  # the pod's own line; JSON is a shipper's record
            base = identity or LogIdentity(namespace=None, pod=None)
            identity = replace(base, pod=pod, container=container)
        return _parse_text(rest, source, default_time, identity, not_after)
    if identity is not None:
        return _from_text(stripped, source, default_time, identity, not_after)
    return signals_from_csv_line(stripped, source, default_time=default_time)  # "[N/A], ..."


def _from_text(
    stripped: str,
    source: SourcePos,
    default_time: float | None,
    identity: LogIdentity | None,
    not_after: float | None = None,
) -> list[Signal]:
    """Parse a text line: CRI, access lines, nvidia-smi CSV, exposition, then plain text."""
    if stripped[:1].isdigit():
        line = parse_cri_line(stripped, source.origin)
        if line is not None:
            return signals_from_log(_fallback(line, identity), source)
    sig = ingress_nginx.signal_from_raw_access_line(stripped, source)
    if sig is None:
        sig = lb_access.signal_from_raw_lb_line(stripped, source, default_time)
    if sig is not None:
        return [sig]
    try:
        if "," in stripped and "{" not in stripped:
            namespace, pod = _pod_of(identity)
            table = signals_from_csv_line(
                stripped, source, default_time=default_time, namespace=namespace, pod=pod
            )
            if table is not None:
                return table
        return signals_from_exposition_line(stripped, source, default_time=default_time)
    except ParseError as exc:
        if identity is None and exc.reason == "unknown_format":
            raise ParseError("unknown_format", PLAIN_TEXT_HINT) from None
        if identity is None:
            raise
    line = parse_raw_line(stripped, identity, default_time=default_time, not_after=not_after)
    return signals_from_log(line, source)


PLAIN_TEXT_HINT = (
    "text in no known format that names no pod; a pod's own log (kubectl logs) is read with "
    "replay --namespace NS --pod POD"
)
"""The dead letter's detail of a text line that no format took and no identity was given for."""


def _pod_of(identity: LogIdentity | None) -> tuple[str | None, str | None]:
    """Return the caller's (namespace, pod) for records that name no pod (nvidia-smi)."""
    return (identity.namespace, identity.pod) if identity is not None else (None, None)


def _fallback(line: LogLine, identity: LogIdentity | None) -> LogLine:
    """Give a line whose envelope names no pod the caller's identity, if any."""
    if line.pod is not None or identity is None:
        return line
    return replace(
        line,
        namespace=identity.namespace,
        pod=identity.pod,
        container=identity.container,
        cluster=identity.cluster,
        owner=identity.owner,
    )


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

    An ingress-nginx access line (the text format, or a JSON ``log-format-upstream``) gives
    LB_RESPONSE; a Kubernetes Event printed by an event exporter's stdout sink gives its event
    signal; any other line goes to ``detector.events.container_log`` (GPU OOM, engine dead,
    engine config/pressure). Raises ``ParseError`` for an access line of a known format that
    cannot be read (``ingress_nginx_json``, ``lb_envoy``).
    """
    if line.text[:1] == "{":  # JSON: never the text format; cheap key tests before decoding
        sig = ingress_nginx_json.signal_from_access_line(line, source)
    else:
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


def _from_json(
    obj: Any,
    source: SourcePos,
    default_time: float | None,
    identity: LogIdentity | None,
    depth: int,
) -> list[Signal]:
    if isinstance(obj, dict):
        return _from_object(obj, source, default_time, identity, depth)
    if isinstance(obj, list) and depth == 0:
        return _from_items(obj, source, default_time, identity, depth)
    raise ParseError("unknown_format", f"JSON {type(obj).__name__} is not a record")


def _from_object(
    obj: dict[str, Any],
    source: SourcePos,
    default_time: float | None,
    identity: LogIdentity | None,
    depth: int,
) -> list[Signal]:
    if "log" in obj:
        if isinstance(obj.get("kubernetes"), dict):  # Fluent Bit with the kubernetes filter
            return signals_from_log(parse_fluentbit_record(obj, default_time=default_time), source)
        line = parse_docker_record(obj, source.origin, default_time=default_time)
        return signals_from_log(_fallback(line, identity), source)
    k8s = obj.get("kubernetes")
    if isinstance(k8s, dict) and "namespace_name" in k8s:  # Fluent Bit: log renamed or merged
        return _from_fluentbit(obj, source, default_time)
    if "message" in obj and (
        isinstance(k8s, dict) or obj.get("source_type") == "kubernetes_logs"
    ):  # Vector's kubernetes_logs
        return signals_from_log(parse_vector_event(obj, default_time=default_time), source)
    if ("labels" in obj and "value" in obj) or ("__name__" in obj and "__value__" in obj):
        return signals_from_adapter_sample(obj, source)
    if vector_metric.is_vector_metric(obj):
        return vector_metric.signals_from_vector_metric(obj, source, default_time=default_time)
    lb = lb_access.signals_from_lb_json(obj, source, default_time)
    if lb is not None:
        return lb
    if "involvedObject" in obj or "regarding" in obj:
        return signals_from_event(obj, source, default_time=default_time)
    kind = obj.get("kind")
    if kind == "Pod" or (kind is None and "status" in obj and "spec" in obj and "metadata" in obj):
        return signals_from_pod(obj, source)
    if kind == "Event":
        return signals_from_event(obj, source, default_time=default_time)
    if kind == "EndpointSlice":
        return signals_from_endpointslice(obj, source, default_time)
    items = obj.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        return _from_items(items, source, default_time, identity, depth)
    if otlp_json.is_otlp_logs(obj):
        return _from_otlp(obj, source, default_time, identity, depth)
    inner = _envelope(obj)
    if inner is not None and depth < _MAX_NESTING:
        return _from_object(inner, source, default_time, identity, depth + 1)
    keys = ", ".join(str(k)[:40] for k in list(obj)[:8])
    raise ParseError("unknown_format", f"JSON object with keys: {keys}{_shipper_hint(obj)}")


def _from_fluentbit(
    obj: dict[str, Any], source: SourcePos, default_time: float | None
) -> list[Signal]:
    """Read a Fluent Bit record without a ``log`` key: renamed to ``message``, or a JSON line
    merged into the record by Merge_Log (Keep_Log Off), read as if ``log`` held it.

    A merged access line is read from the object itself (no second decode). A top-level merge
    keeps the line's own ``message`` beside its other fields: the message is read first (an
    application's JSON log), then the whole object (an exported Event, a proxy's JSON line).
    Format: https://docs.fluentbit.io/manual/pipeline/filters/kubernetes
    """
    merged = merged_log(obj)
    if merged is None:  # the line renamed to message; without one, a dead letter saying why
        return signals_from_log(parse_fluentbit_record(obj, default_time=default_time), source)
    line = fluentbit_line(obj, json_line(merged), default_time=default_time)
    sig = ingress_nginx_json.signal_from_access_object(line, merged, source)
    if sig is not None:
        return [sig]
    if type(obj.get("message")) is str:
        signals = signals_from_log(parse_fluentbit_record(obj, default_time=default_time), source)
        if signals:
            return signals
    return signals_from_log(line, source)


def _from_otlp(
    obj: dict[str, Any],
    source: SourcePos,
    default_time: float | None,
    identity: LogIdentity | None,
    depth: int,
) -> list[Signal]:
    """Read an OpenTelemetry Collector logs request (``otlp_json``): each container line as a
    log line, each Kubernetes object (k8sobjects) as an object; an object that fails is
    skipped unless every one fails, as in a List."""
    out: list[Signal] = []
    objects: list[Any] = []
    for record in otlp_json.otlp_log_records(obj, default_time):
        if isinstance(record, LogLine):
            out.extend(signals_from_log(_fallback(record, identity), source))
        else:
            objects.append(record)
    if objects:
        out.extend(_from_items(objects, source, default_time, identity, depth))
    return out


def _shipper_hint(obj: dict[str, Any]) -> str:
    """Say how to keep the line of what looks like a shipper's record that lost it."""
    if "log" in obj or not ("stream" in obj or "_p" in obj or "@timestamp" in obj):
        return ""
    return (
        "; a Fluent Bit record whose log line was merged away? Keep it: Keep_Log On in the "
        "kubernetes filter, Preserve_Key On in a parser filter"
    )


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
    items: list[Any],
    source: SourcePos,
    default_time: float | None,
    identity: LogIdentity | None,
    depth: int,
) -> list[Signal]:
    """Parse the items of a List; skip items that fail unless every item fails."""
    out: list[Signal] = []
    first_error: ParseError | None = None
    parsed = 0
    for item in items:
        try:
            if not isinstance(item, dict) or depth >= _MAX_NESTING:
                raise ParseError("unknown_format", "list item is not an object")
            out.extend(_from_object(item, source, default_time, identity, depth + 1))
            parsed += 1
        except ParseError as exc:
            first_error = first_error or exc
    if parsed == 0 and first_error is not None:
        raise first_error
    return out
