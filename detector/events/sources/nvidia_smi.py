"""``nvidia-smi --query-gpu=... --format=csv`` output lines -> GPU_MEMORY.

The documented query for this detector and its output (``,noheader`` drops the header line,
``,nounits`` drops the " MiB" from values)::

    nvidia-smi --query-gpu=timestamp,index,uuid,memory.used,memory.total --format=csv -l 5
    timestamp, index, uuid, memory.used [MiB], memory.total [MiB]
    2024/05/01 10:00:00.123, 0, GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e, 79000 MiB, 81920 MiB

Each line is a record of its own, so the columns are told from the values, not from the header
(which parses to no signal): the ``YYYY/MM/DD hh:mm:ss.mmm`` field is the time (nvidia-smi
prints the host's local time; read as UTC, as container hosts run), a ``GPU-``/``MIG-`` field
the device UUID, the integer just before it (or first on the line, or after the time) the
index, and the memory values: two of them are memory.used and memory.total in either order
(the smaller is used); three with the largest first are NVIDIA's documented ``memory.total,
memory.free, memory.used``. With ``nounits`` the memory values are the integers after the UUID
(or after the index). Any other number of memory values cannot be read without the header and
is rejected. The node is a leading host-name field, when the collecting script prepends
``$(hostname)``. nvidia-smi names no pod: the correlator keys GPU memory by UUID (or node and
index), and ignores it unless something attributes the GPU. ``detector gpu-sample --namespace NS
--pod POD`` (run beside the one pod that owns the GPU) appends ``namespace=NS, pod=POD`` fields
to every line, which name its pod; nvidia-smi itself never prints a ``key=value`` field, and
each line stays a record of its own (a Kafka message, a file line) that needs no header. Without
them, the caller's ``namespace``/``pod`` (``detector replay --namespace NS --pod POD``) apply.
Source: https://docs.nvidia.com/deploy/nvidia-smi/index.html ,
https://enterprise-support.nvidia.com/s/article/Useful-nvidia-smi-Queries-2
"""

from __future__ import annotations

import re
from calendar import timegm
from datetime import datetime
from enum import Enum
from typing import Any

from detector.errors import ParseError
from detector.events.model import MAX_TEXT_CHARS, Signal, SignalKind, SourcePos

_MIB = 1024 * 1024
_MAX_FIELDS = 64
_STAMP = re.compile(r"(\d{4})/(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]{8,80}")
_MIB_VALUE = re.compile(r"(\d{1,9}) MiB")
_INT = re.compile(r"\d{1,9}")
_NOT_AVAILABLE = re.compile(r"\[[A-Za-z][A-Za-z /]{0,60}\]")  # [N/A], [Not Supported] ...
_HEADER_FIELD = re.compile(r"([a-z][a-z0-9_.]{0,60})(?: \[[^\]]{1,12}\])?")
_HOST = re.compile(r"(?=[a-z0-9.-]*[a-z])[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL = re.compile(r"(namespace|pod)=([a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?)")
_HEADER_NAMES = ("memory.", "index", "uuid", "timestamp", "gpu_uuid", "gpu_bus_id", "pci.bus_id")


class _Field(Enum):
    STAMP = "stamp"
    UUID = "uuid"
    MIB = "mib"
    INT = "int"
    NOT_AVAILABLE = "n/a"
    HOST = "host"
    OTHER = "other"


def signals_from_csv_line(
    line: str,
    source: SourcePos,
    *,
    default_time: float | None = None,
    namespace: str | None = None,
    pod: str | None = None,
) -> list[Signal] | None:
    """Parse one nvidia-smi CSV line; None when it is not one, ``[]`` for a header.

    The signal's pod is the line's trailing ``namespace=NS, pod=POD`` fields (``detector
    gpu-sample --namespace --pod``), else ``namespace`` and ``pod`` (both, or neither applies).

    GPU_MEMORY attrs: used_bytes, total_bytes, free_bytes (when queried), gpu (the index, a
    string, or None), uuid (or None), metric ("nvidia_smi"). Time: the line's timestamp field,
    else ``default_time``; raises ``ParseError("missing_timestamp")`` with neither,
    ``"bad_timestamp"`` for an impossible date, ``"unknown_format"`` when the memory columns
    cannot be told apart without the header. Rows whose memory reads ``[N/A]`` give ``[]``.
    Format: https://docs.nvidia.com/deploy/nvidia-smi/index.html
    """
    if "," not in line or line.count(",") >= _MAX_FIELDS:
        return None
    fields = [field.strip() for field in line.split(",")]
    if len(fields) < 2 or len(fields) > _MAX_FIELDS:
        return None
    if _is_header(fields):
        return []
    labels = _trailing_labels(fields)
    if "namespace" in labels and "pod" in labels:
        namespace, pod = labels["namespace"], labels["pod"]
    elif labels or namespace is None or pod is None:
        namespace = pod = None  # half a pod names none
    kinds = [_kind(field, i) for i, field in enumerate(fields)]
    if not _is_data_row(kinds):
        return None
    values, index = _memory_columns(fields, kinds)
    if not values:
        return []  # memory not queried, or [N/A]: absence, not zero
    memory = _memory_attrs(values)
    if memory is None:
        raise ParseError(
            "unknown_format",
            f"nvidia-smi CSV with {len(values)} memory values: query memory.used,memory.total",
        )
    memory["gpu"] = index
    memory["uuid"] = fields[kinds.index(_Field.UUID)] if _Field.UUID in kinds else None
    memory["metric"] = "nvidia_smi"
    return [
        Signal(
            kind=SignalKind.GPU_MEMORY,
            time=_time(fields, kinds, default_time),
            source=source,
            namespace=namespace,
            pod=pod,
            node=fields[0] if kinds[0] is _Field.HOST else None,
            attrs=memory,
            text=line[:MAX_TEXT_CHARS],
        )
    ]


def _trailing_labels(fields: list[str]) -> dict[str, str]:
    """Take the trailing ``namespace=``/``pod=`` fields off ``fields``; return them by name."""
    labels: dict[str, str] = {}
    while len(fields) > 1:
        m = _LABEL.fullmatch(fields[-1])
        if m is None or m.group(1) in labels:
            break
        labels[m.group(1)] = m.group(2)
        fields.pop()
    return labels


def _is_header(fields: list[str]) -> bool:
    """Tell the header line ("index, memory.used [MiB], ...") by its query field names."""
    known = False
    for field in fields:
        m = _HEADER_FIELD.fullmatch(field)
        if m is None:
            return False
        known = known or m.group(1).startswith(_HEADER_NAMES)
    return known


def _kind(field: str, position: int) -> _Field:
    if _MIB_VALUE.fullmatch(field):
        return _Field.MIB
    if _INT.fullmatch(field):
        return _Field.INT
    if _UUID.fullmatch(field):
        return _Field.UUID
    if _STAMP.fullmatch(field):
        return _Field.STAMP
    if _NOT_AVAILABLE.fullmatch(field):
        return _Field.NOT_AVAILABLE
    if position == 0 and _HOST.fullmatch(field):
        return _Field.HOST
    return _Field.OTHER


def _is_data_row(kinds: list[_Field]) -> bool:
    """A row of nvidia-smi values: a MiB value, a GPU UUID or an nvidia-smi timestamp in it,
    or nothing but ``[N/A]`` placeholders.
    """
    if _Field.MIB in kinds or _Field.UUID in kinds or _Field.STAMP in kinds:
        return True
    return all(kind is _Field.NOT_AVAILABLE for kind in kinds)


def _memory_columns(fields: list[str], kinds: list[_Field]) -> tuple[list[int], str | None]:
    """Return the memory values (MiB, in column order) and the GPU index of a data row."""
    uuid_at = kinds.index(_Field.UUID) if _Field.UUID in kinds else -1
    lead = 1 if kinds[0] in (_Field.STAMP, _Field.HOST) else 0
    index_at = uuid_at - 1 if uuid_at > 0 else lead
    if index_at >= len(kinds) or kinds[index_at] is not _Field.INT:
        index_at = -1
    if _Field.MIB in kinds:
        values = [int(fields[i][:-4]) for i, kind in enumerate(kinds) if kind is _Field.MIB]
        return values, fields[index_at] if index_at >= 0 else None
    # nounits: the integers after the UUID, or after the index
    start = uuid_at + 1 if uuid_at >= 0 else max(index_at + 1, lead)
    if uuid_at < 0 and index_at >= 0 and sum(k is _Field.INT for k in kinds[lead:]) == 2:
        start, index_at = lead, -1  # "time, used, total": no index column
    values = [int(fields[i]) for i in range(start, len(kinds)) if kinds[i] is _Field.INT]
    return values, fields[index_at] if index_at >= 0 else None


def _memory_attrs(values: list[int]) -> dict[str, Any] | None:
    """Map memory values to attrs; None when their meaning cannot be told apart."""
    if len(values) == 2:
        used, total = min(values), max(values)
        return {"used_bytes": used * _MIB, "total_bytes": total * _MIB} if total else None
    if len(values) == 3 and values[0] == max(values) and values[1] + values[2] <= values[0]:
        total, free, used = values
        return {"used_bytes": used * _MIB, "free_bytes": free * _MIB, "total_bytes": total * _MIB}
    return None


def _time(fields: list[str], kinds: list[_Field], default_time: float | None) -> float:
    """Return the row's own timestamp (UTC), else ``default_time``."""
    if _Field.STAMP in kinds:
        m = _STAMP.fullmatch(fields[kinds.index(_Field.STAMP)])
        assert m is not None
        year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
        try:
            datetime(year, month, day, hour, minute, second)
        except ValueError:
            raise ParseError("bad_timestamp", f"not a date: {m.group(0)!r}") from None
        fraction = float(f"0.{m.group(7)}") if m.group(7) else 0.0
        return timegm((year, month, day, hour, minute, second, 0, 0, 0)) + fraction
    if default_time is None:
        raise ParseError("missing_timestamp", "nvidia-smi row without timestamp or default time")
    return default_time
