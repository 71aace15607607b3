"""Docker json-file log lines, and log records that carry no Kubernetes metadata -> LogLine.

Docker's json-file driver writes one object per line::

    {"log":"torch.OutOfMemoryError: CUDA out of memory.\\n","stream":"stderr",
     "time":"2024-05-01T10:00:00.123456789Z"}

optionally with ``attrs`` (the ``--log-opt labels/env/tag`` values). The line holds no pod: under
Kubernetes (dockershim) the identity is in the file's path, the kubelet's symlink
``/var/log/containers/<pod>_<namespace>_<container>-<id>.log`` or
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log``, which ``SourcePos.origin`` holds.
A Fluent Bit ``tail`` record without the kubernetes filter has the same shape (plus
``@timestamp``) and may name its file under ``Path_Key`` (``file`` / ``path``).
Sources: https://docs.docker.com/engine/logging/drivers/json-file/ ,
https://docs.fluentbit.io/manual/pipeline/inputs/tail .
"""

from __future__ import annotations

from typing import Any

from detector.events.model import LogLine
from detector.events.sources.cri import NO_IDENTITY, PathIdentity, identity_from_log_path
from detector.events.sources.fluentbit import parse_fluentbit_record
from detector.events.sources.timeparse import str_or_none

_PATH_KEYS = ("file", "path", "filepath", "log_file")  # Fluent Bit Path_Key, Vector "file"
# Docker labels the kubelet set on dockershim containers, shipped by --log-opt labels=...
_POD_LABEL, _NAMESPACE_LABEL = "io.kubernetes.pod.name", "io.kubernetes.pod.namespace"
_CONTAINER_LABEL = "io.kubernetes.container.name"


def parse_docker_record(
    record: dict[str, Any], origin: str, *, default_time: float | None = None
) -> LogLine:
    """Turn one decoded json-file line (or a Fluent Bit record without metadata) into a LogLine.

    Text, time and stream are read as ``parse_fluentbit_record`` reads them (``log`` without its
    trailing newline; ``time``, ``@timestamp`` ...). Identity, first found: the
    ``io.kubernetes.*`` labels in ``attrs``, a kubelet log path in the record (``file``,
    ``path``), the kubelet log path in ``origin``; else none (the correlator ignores the line).
    Raises ``ParseError("missing_field")`` / ``("bad_timestamp")`` like the Fluent Bit parser.
    Format: https://docs.docker.com/engine/logging/drivers/json-file/
    """
    line = parse_fluentbit_record(record, default_time=default_time)
    namespace, pod, container = _record_identity(record, origin)
    if pod is None:
        return line
    return LogLine(
        time=line.time,
        text=line.text,
        namespace=namespace,
        pod=pod,
        container=container,
        stream=line.stream,
    )


def _record_identity(record: dict[str, Any], origin: str) -> PathIdentity:
    """Return (namespace, pod, container) of a metadata-less record, from labels or paths."""
    attrs = record.get("attrs")
    if isinstance(attrs, dict) and _POD_LABEL in attrs:
        pod = str_or_none(attrs.get(_POD_LABEL))
        if pod is not None:
            namespace = str_or_none(attrs.get(_NAMESPACE_LABEL))
            return namespace, pod, str_or_none(attrs.get(_CONTAINER_LABEL))
    for key in _PATH_KEYS:
        path = record.get(key)
        if isinstance(path, str) and path:
            found = identity_from_log_path(path)
            if found[1] is not None:
                return found
    return identity_from_log_path(origin) if origin else NO_IDENTITY
