"""Fluent Bit records (Kafka output + kubernetes filter) -> LogLine.

Record shape (out_kafka, ``format json``): the container line in ``log`` (with its trailing
newline when the docker parser read it), the kubernetes filter's metadata under ``kubernetes``
(pod_name, namespace_name, container_name, host, labels, annotations, pod_id, docker_id), the
record time under ``timestamp_key`` (default ``@timestamp``) as a double or ISO-8601 string, and
the CRI parser's ``time``/``stream``/``_p``.
Sources: https://docs.fluentbit.io/manual/pipeline/outputs/kafka ,
https://docs.fluentbit.io/manual/pipeline/filters/kubernetes .
"""

from __future__ import annotations

from typing import Any

from detector.errors import ParseError
from detector.events.model import LogLine
from detector.events.sources.timeparse import first_time, str_map

# @timestamp: out_kafka's timestamp_key; time: the CRI/docker parser; date: other outputs' key.
_TIME_KEYS = ("@timestamp", "time", "date", "timestamp")


def parse_fluentbit_record(record: dict[str, Any], *, default_time: float | None = None) -> LogLine:
    """Turn one decoded Fluent Bit record into a LogLine.

    The line is ``log`` (or ``message`` when a modify filter renamed it), without its trailing
    newline. Time: ``@timestamp``, ``time``, ``date`` or ``timestamp``, else ``default_time``.
    Raises ``ParseError("missing_field")`` without a line or a time, ``"bad_timestamp"`` for an
    unparseable time. Format: https://docs.fluentbit.io/manual/pipeline/outputs/kafka
    """
    text = record.get("log")
    if text is None:
        text = record.get("message")
    if not isinstance(text, str):
        raise ParseError("missing_field", "log (a string)")
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
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
