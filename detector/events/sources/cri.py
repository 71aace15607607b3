"""CRI container log lines (containerd, CRI-O) and kubelet log paths -> LogLine.

Line format, as the kubelet reads it (``pkg/kubelet/kuberuntime/logs/logs.go``)::

    2024-05-01T10:00:00.123456789Z stderr F torch.OutOfMemoryError: CUDA out of memory.

``<RFC 3339 nano time, any offset> <stdout|stderr> <tag> <message>``; the tag is ``F`` (full
line) or ``P`` (partial: the runtime split a line longer than 16 KiB), possibly followed by
``:``-separated tags; lines written before the tag existed (2017) have no tag. The message is not
quoted or escaped.

Partial lines: the parser is per record, so a ``P`` fragment stays a line of its own and is
not joined with the ``F`` line that ends it. A GPU OOM message is far shorter than 16 KiB and
its head (the part the classifier reads) lands in the first fragment, so joining would add
state to the parser for no signal.

Identity: a CRI file carries the pod only in its path, which ``SourcePos.origin`` holds:
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log`` (rotated: ``<n>.log.<date>``) or
the kubelet's symlink ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``.
Sources:
https://github.com/kubernetes/design-proposals-archive/blob/main/node/kubelet-cri-logging.md ,
https://github.com/kubernetes/kubernetes/blob/master/pkg/kubelet/kuberuntime/logs/logs.go .
"""

from __future__ import annotations

import re
from functools import lru_cache

from detector.events.model import LogLine
from detector.events.sources.timeparse import parse_iso8601

PathIdentity = tuple[str | None, str | None, str | None]  # (namespace, pod, container)
NO_IDENTITY: PathIdentity = (None, None, None)

# time, stream, optional tag (P/F plus ":"-separated extra tags), optional message.
_CRI_LINE = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr)"
    r"(?: ([PF])(?::[^ ]*)?(?= |$))?(?: (.*))?",
    re.DOTALL,
)
# /var/log/containers/<pod>_<namespace>_<container>-<64 hex container id>.log
_CONTAINERS_NAME = re.compile(r"([^_/]+)_([^_/]+)_([^_/]+)-[0-9a-f]{64}\.log")
_MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
_POD_LOG_NAME = re.compile(r"\d+\.log(?:\.[^/]*)?")


def parse_cri_line(text: str, origin: str) -> LogLine | None:
    """Parse one CRI log line into a LogLine; None when ``text`` is not a CRI line.

    Identity (namespace, pod, container) comes from the kubelet log path in ``origin``
    (see ``identity_from_log_path``); without one the line has no identity and the correlator
    ignores it. Raises ``ParseError("bad_timestamp")`` for a well-formed line whose time is
    not a real date. Format: https://github.com/kubernetes/kubernetes/blob/master/pkg/kubelet/kuberuntime/logs/logs.go
    """
    m = _CRI_LINE.fullmatch(text)
    if m is None:
        return None
    message = m.group(4) or ""
    if message.endswith("\r"):
        message = message[:-1]
    namespace, pod, container = identity_from_log_path(origin)
    return LogLine(
        time=parse_iso8601(m.group(1)),
        text=message,
        namespace=namespace,
        pod=pod,
        container=container,
        stream=m.group(2),
    )


def identity_from_log_path(path: str) -> PathIdentity:
    """Return (namespace, pod, container) named by a kubelet log path; Nones if none.

    ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log`` or the symlink
    ``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log``; only the last
    path components count, so a copied tree keeps its identity. Pod and namespace names cannot
    contain ``_`` (DNS-1123), which makes the split unambiguous.
    Source: https://github.com/kubernetes/kubernetes/blob/master/pkg/kubelet/kuberuntime/helpers.go
    """
    if len(path) > _MAX_PATH_CHARS:  # not a path; and keeps the cache small
        return NO_IDENTITY
    return _identity_from_path(path)


@lru_cache(maxsize=1024)  # one entry per file: every line of a file has the same origin
def _identity_from_path(path: str) -> PathIdentity:
    if "\\" in path:
        path = path.replace("\\", "/")
    parts = path.rsplit("/", 3)
    name = parts[-1]
    m = _CONTAINERS_NAME.fullmatch(name)
    if m is not None:
        return m.group(2), m.group(1), m.group(3)
    if len(parts) < 3 or not _POD_LOG_NAME.fullmatch(name):
        return NO_IDENTITY
    pod_dir, container = parts[-3].split("_"), parts[-2] or None
    if len(pod_dir) != 3:
        return NO_IDENTITY
    return pod_dir[0] or None, pod_dir[1] or None, container
