"""Vector ``kubernetes_logs`` events (JSON codec) -> LogLine.

Event shape: ``message`` (the line), ``timestamp``, ``stream``, ``file``, ``source_type``
("kubernetes_logs") and ``kubernetes`` {pod_name, pod_namespace, container_name, pod_node_name,
pod_labels, pod_owner ("ReplicaSet/name"), pod_uid ...}. Events of 2020 builds lack
container_name and pod_node_name; the container is then read from the ``file`` path
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log``.
Source: https://vector.dev/docs/reference/configuration/sources/kubernetes_logs/
"""

from __future__ import annotations

import json
from typing import Any

from detector.errors import ParseError
from detector.events.model import LogLine
from detector.events.sources.cri import NO_IDENTITY, identity_from_log_path
from detector.events.sources.timeparse import first_time, str_map, str_or_none

_TIME_KEYS = ("timestamp", "@timestamp", "time")
_FLAT_PREFIX = "kubernetes."


def parse_vector_event(event: dict[str, Any], *, default_time: float | None = None) -> LogLine:
    """Turn one decoded Vector ``kubernetes_logs`` event into a LogLine.

    ``message`` may be a string or, after a ``parse_json`` remap, an object (re-serialized as
    compact JSON). Metadata is read from the nested ``kubernetes`` object or from flattened
    ``kubernetes.*`` keys. Raises ``ParseError("missing_field")`` without a message or time.
    Format: https://vector.dev/docs/reference/configuration/sources/kubernetes_logs/
    """
    message = event.get("message")
    if isinstance(message, str):
        text = message[:-1] if message.endswith("\n") else message
    elif isinstance(message, dict | list):
        text = json.dumps(message, separators=(",", ":"))
    else:
        raise ParseError("missing_field", "message (a string)")
    time = first_time(event, _TIME_KEYS, default_time)
    k8s = event.get("kubernetes")
    if not isinstance(k8s, dict):
        k8s = {k[len(_FLAT_PREFIX) :]: v for k, v in event.items() if k.startswith(_FLAT_PREFIX)}
    namespace = str_or_none(k8s.get("pod_namespace"))
    pod = str_or_none(k8s.get("pod_name"))
    container = str_or_none(k8s.get("container_name"))
    if container is None or pod is None or namespace is None:
        path = event.get("file")
        from_path = identity_from_log_path(path) if isinstance(path, str) else NO_IDENTITY
        namespace = namespace or from_path[0]
        pod = pod or from_path[1]
        container = container or from_path[2]
    return LogLine(
        time=time,
        text=text,
        namespace=namespace,
        pod=pod,
        container=container,
        node=str_or_none(k8s.get("pod_node_name")),
        cluster=str_or_none(event.get("cluster")),
        labels=str_map(k8s.get("pod_labels")),
        owner=_owner(k8s.get("pod_owner")),
        stream=str_or_none(event.get("stream")),
    )


def _owner(value: Any) -> tuple[str, str] | None:
    """Split Vector's ``pod_owner`` ("ReplicaSet/vllm-7d9f") into (kind, name)."""
    if not isinstance(value, str):
        return None
    kind, sep, name = value.partition("/")
    return (kind, name) if sep and kind and name else None
