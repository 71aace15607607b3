"""Fluent Bit records (Kafka output + kubernetes filter) -> LogLine.

Record shape (out_kafka, ``format json``): the container line in ``log`` (with its trailing
newline when the docker parser read it), the kubernetes filter's metadata under ``kubernetes``
(pod_name, namespace_name, container_name, host, labels, annotations, pod_id, docker_id), the
record time under ``timestamp_key`` (default ``@timestamp``) as a double or ISO-8601 string, and
the CRI parser's ``time``/``stream``/``_p``.

With the kubernetes filter's ``Merge_Log On`` a line that is a JSON object is merged into the
record: beside the record's own keys, or under ``Merge_Log_Key`` (e.g. ``log_processed``);
with ``Keep_Log Off`` the ``log`` string is removed once merged. Such a record is read as if
``log`` held the object (``merged_log``), so a JSON line reads the same with either setting.
Sources: https://docs.fluentbit.io/manual/pipeline/outputs/kafka ,
https://docs.fluentbit.io/manual/pipeline/filters/kubernetes (Merge_Log, Merge_Log_Key,
Keep_Log), https://github.com/fluent/fluent-bit/blob/master/plugins/filter_kubernetes/kubernetes.c
(``pack_map_content``: the record's keys, then the merged ones).
"""

from __future__ import annotations

import json
from typing import Any

from detector.errors import ParseError
from detector.events.model import LogLine
from detector.events.sources.timeparse import first_time, str_map

# @timestamp: out_kafka's timestamp_key; time: the CRI/docker parser; date: other outputs' key.
_TIME_KEYS = ("@timestamp", "time", "date", "timestamp")
# What Fluent Bit puts beside the line (outputs, the tail/CRI parsers, the kubernetes filter,
# a record_modifier's cluster): not part of a log that Merge_Log merged at the top level.
_SHIPPER_KEYS = frozenset(
    ("@timestamp", "time", "date", "stream", "_p", "logtag", "kubernetes", "cluster", "log")
)
MERGE_LOG_KEY = "log_processed"  # the Merge_Log_Key of Fluent Bit's docs
KEEP_LOG_HINT = (
    "the kubernetes filter's Merge_Log On with Keep_Log Off removes the log line once merged: "
    "set Keep_Log On, or keep the line under log or message"
)
"""How a record that lost its line is fixed at the shipper (the dead letter's detail)."""
_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":"))


def parse_fluentbit_record(record: dict[str, Any], *, default_time: float | None = None) -> LogLine:
    """Turn one decoded Fluent Bit record into a LogLine.

    The line is ``log`` (or ``message`` when a modify filter renamed it), without its trailing
    newline; a JSON line that Merge_Log merged into the record (``merged_log``) is that object
    as compact JSON. Time: ``@timestamp``, ``time``, ``date`` or ``timestamp``, else
    ``default_time``. Raises ``ParseError("missing_field")`` without a line (its detail names
    the Fluent Bit setting to change) or a time, ``"bad_timestamp"`` for an unparseable time.
    Format: https://docs.fluentbit.io/manual/pipeline/outputs/kafka
    """
    text = record.get("log")
    if type(text) is not str:
        text = _line_of(record, text)
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    return fluentbit_line(record, text, default_time=default_time)


def fluentbit_line(record: dict[str, Any], text: str, *, default_time: float | None) -> LogLine:
    """Return ``text`` as a LogLine with the record's time and identity (``kubernetes``).

    Raises like ``parse_fluentbit_record`` for the time.
    """
    time = first_time(record, _TIME_KEYS, default_time)
    stream = record.get("stream")
    if not (isinstance(stream, str) and stream):  # str_or_none, inline: this runs per record
        stream = None
    k8s = record.get("kubernetes")
    if not isinstance(k8s, dict):
        return LogLine(time, text, stream=stream)
    namespace, pod = k8s.get("namespace_name"), k8s.get("pod_name")
    container, node = k8s.get("container_name"), k8s.get("host")
    cluster = record.get("cluster")
    return LogLine(  # time, text, namespace, pod, container, node, cluster, labels, owner, stream
        time,
        text,
        namespace if isinstance(namespace, str) and namespace else None,
        pod if isinstance(pod, str) and pod else None,
        container if isinstance(container, str) and container else None,
        node if isinstance(node, str) and node else None,
        cluster if isinstance(cluster, str) and cluster else None,
        str_map(k8s.get("labels")),
        None,
        stream,
    )


def merged_log(record: dict[str, Any]) -> dict[str, Any] | None:
    """Return the JSON object Merge_Log put into a record instead of its ``log`` string.

    ``log`` itself when it is an object (None for any other ``log``); with ``Merge_Log_Key``
    the object under that key (the record's only key beside the shipper's, or
    ``log_processed``); merged at the top level, the record's keys other than the shipper's
    (``_SHIPPER_KEYS``). None when the record holds no merged object (a ``log`` string, a
    ``message`` renamed from it, nothing).
    """
    log = record.get("log")
    if log is not None:  # a line kept (Keep_Log On), or an object a parser put there
        return log if type(log) is dict else None
    merged = {key: value for key, value in record.items() if key not in _SHIPPER_KEYS}
    if len(merged) <= 1:
        value = next(iter(merged.values()), None)
        if type(value) is dict:
            return value  # Merge_Log_Key
        if not merged or "message" in merged:
            return None
    nested = merged.get(MERGE_LOG_KEY)
    return nested if type(nested) is dict else merged


def json_line(obj: dict[str, Any]) -> str:
    """Return a merged object as the compact JSON line it was logged as (key order kept).

    Raises ``ParseError("malformed_json")`` for an object nested too deep to write back.
    """
    try:
        return _ENCODER.encode(obj)
    except RecursionError:
        raise ParseError("malformed_json", "merged log nested too deep") from None


def _line_of(record: dict[str, Any], log: Any) -> str:
    """Return the line of a record without a ``log`` string: ``message`` (renamed from it),
    else the merged object as JSON. Raises ``ParseError("missing_field")`` naming the setting
    to change.
    """
    if log is None:
        message = record.get("message")
        if isinstance(message, str):
            return message
    merged = merged_log(record)
    if merged is not None:
        return json_line(merged)
    if log is not None:
        raise ParseError("missing_field", f"log (a string), not a {type(log).__name__}")
    if isinstance(record.get("kubernetes"), dict):
        raise ParseError("missing_field", f"log (a string): {KEEP_LOG_HINT}")
    raise ParseError("missing_field", "log (a string)")
