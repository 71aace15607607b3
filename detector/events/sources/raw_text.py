"""Plain-text container logs whose identity comes from outside the record -> LogLine.

A file of plain log lines (``kubectl logs``, ``docker logs``, a pasted vLLM log) names no pod,
so the caller gives the identity (``LogIdentity``, e.g. from the command line). The time is the
line's own leading timestamp when it has one:

- ISO-8601 / RFC 3339, also in brackets or with a comma before the milliseconds:
  ``2024-03-14T09:00:01.123Z`` (TGI, ``kubectl logs --timestamps``),
  ``2024-03-14 09:00:01,123`` (Python logging), ``[2025-01-06 02:58:11 TP0]`` (SGLang);
- vLLM's ``INFO 03-14 09:00:01`` (month-day, no year), also after a process prefix such as
  ``(EngineCore pid=112) ``; https://github.com/vllm-project/vllm/blob/main/vllm/logger.py
- klog / glog ``I0314 09:00:01.123456`` (no year);
  https://github.com/kubernetes/klog/blob/main/klog.go (header format)
- SGLang's ``[09:00:01 TP0]`` (time of day only).

A year or date the line lacks is completed from ``default_time`` (the stream's latest dated
record, else the file's time): the year (day) that puts the line nearest it, never after
``not_after`` (the file's modification time or the wall clock; ``default_time`` when not
given), see ``timeparse.complete_month_day``.
``kubectl logs --prefix`` lines (``[pod/<pod>/<container>] ...``, older ``[<pod> <container>]``)
name their pod and container; ``split_kubectl_prefix`` takes that prefix off.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from detector.errors import ParseError
from detector.events.model import LogLine
from detector.events.sources.timeparse import (
    complete_month_day,
    complete_time_of_day,
    first_time,
    parse_iso8601,
)

_PROCESS = re.compile(r"\([A-Za-z_][\w .,=:-]{0,80}\) ")  # "(EngineCore pid=112) "
_ISO = re.compile(
    r"\[?(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d(?::?\d\d)?)?"
    r"(?=[\s\]]|$)"
)
_VLLM = re.compile(
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?=[\s\]]|$)"
)
_KLOG = re.compile(r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?=\s|$)")
_CLOCK = re.compile(r"\[(\d\d):(\d\d):(\d\d)(?=[ \]])")
_KUBECTL_PREFIX = re.compile(
    r"\[(?:pod/([a-z0-9][-a-z0-9.]{0,252})/([a-z0-9][-a-z0-9]{0,62})"
    r"|([a-z0-9][-a-z0-9.]{0,252}) ([a-z0-9][-a-z0-9]{0,62}))\] "
)
_MAX_DEFAULT = 253402300799.0  # 9999-12-31T23:59:59Z
_MESSAGE_KEYS = ("message", "msg", "log")
_TIME_KEYS = ("timestamp", "time", "@timestamp", "ts")
_DATED_KEYS = ("@timestamp", "time", "date", "timestamp", "ts")
_DATED_HEAD_BYTES = 160


@dataclass(frozen=True, slots=True)
class LogIdentity:
    """The identity given to plain-text log lines that name no pod themselves.

    The correlator needs ``namespace`` and ``pod``; lines without them are parsed but ignored.
    ``workload`` names the owning controller as ``"<name>"`` (a Deployment) or
    ``"<Kind>/<name>"`` (``"StatefulSet/vllm"``), as Vector writes ``pod_owner``.
    """

    namespace: str | None
    pod: str | None
    container: str | None = None
    workload: str | None = None
    cluster: str | None = None

    @property
    def owner(self) -> tuple[str, str] | None:
        """Return ``workload`` as an ownerReference (kind, name); None when not given."""
        if not self.workload:
            return None
        kind, sep, name = self.workload.partition("/")
        return (kind, name) if sep and kind and name else ("Deployment", self.workload)


def parse_raw_line(
    text: str,
    identity: LogIdentity,
    *,
    default_time: float | None,
    not_after: float | None = None,
) -> LogLine:
    """Return a plain log line as a LogLine of ``identity``, timed by its leading timestamp.

    Time: see ``leading_time``. Raises ``ParseError("missing_timestamp")`` when the line has no
    timestamp (or one without a year or date) and there is no ``default_time``, and
    ``"bad_timestamp"`` for a leading timestamp that is not a real time. Formats: the module
    docstring; e.g. https://github.com/vllm-project/vllm/blob/main/vllm/logger.py
    """
    return _line(text, leading_time(text, default_time, not_after), identity)


def parse_json_app_line(
    record: dict[str, Any], text: str, identity: LogIdentity, *, default_time: float | None
) -> LogLine:
    """Return an application's own JSON log line (no shipper envelope) as a LogLine.

    The text is its ``message`` / ``msg`` string when it has one (TGI's JSON logs, Python and
    Go structured loggers), else the whole line; the time is its ``timestamp`` / ``time`` /
    ``@timestamp`` / ``ts`` field, else ``default_time``. Raises like ``parse_raw_line``.
    Format: https://github.com/huggingface/text-generation-inference/issues/3317 (TGI JSON)
    """
    message = next((record[k] for k in _MESSAGE_KEYS if isinstance(record.get(k), str)), text)
    try:
        time = first_time(record, _TIME_KEYS, default_time)
    except ParseError as exc:
        if exc.reason != "missing_field":
            raise
        raise ParseError("missing_timestamp", "JSON log line without a time") from None
    return _line(message, time, identity)


def leading_time(text: str, default_time: float | None, not_after: float | None = None) -> float:
    """Return the Unix time of the timestamp ``text`` starts with, else ``default_time``.

    A stamp without a year or date is completed near ``default_time`` and never after
    ``not_after`` (default: ``default_time``) plus ``timeparse.ZONE_SLACK_S``.

    Raises ``ParseError("missing_timestamp")`` / ``("bad_timestamp")`` as ``parse_raw_line``.
    Formats: the module docstring; https://www.rfc-editor.org/rfc/rfc3339 ,
    https://github.com/kubernetes/klog/blob/main/klog.go
    """
    head = text[:160]
    if head[:1] == "(":
        process = _PROCESS.match(head)
        if process is not None:
            head = head[process.end() :]
    first = head[:1]
    if first.isdigit() or first == "[":
        if m := _ISO.match(head):
            stamp = f"{m[1]}T{m[2]}.{m[3] or '0'}{m[4] or ''}"
            return parse_iso8601(stamp)
        if m := _CLOCK.match(head):
            return _time_of_day(int(m[1]), int(m[2]), int(m[3]), default_time, not_after)
    elif first.isupper() and (m := _KLOG.match(head) or _VLLM.match(head)):
        return _month_day_time(m, default_time, not_after)
    if default_time is None:
        raise ParseError("missing_timestamp", "plain line without a timestamp or default time")
    return default_time


def dated_time(raw: bytes) -> float | None:
    """Return the time of a record that carries a full date, else None; never raises.

    A shipper's envelope (a JSON object with a ``@timestamp`` / ``time`` / ``date`` /
    ``timestamp`` / ``ts`` field: Fluent Bit, Vector, Docker json-file) or a line that starts
    with an ISO-8601 time (CRI, ``kubectl logs --timestamps``). Gives a stream the year of its
    year-less lines when its dated records carry no signal.
    Formats: https://docs.fluentbit.io/manual/pipeline/outputs/standard-output ,
    https://www.rfc-editor.org/rfc/rfc3339
    """
    text = raw[:_DATED_HEAD_BYTES].decode("utf-8", "replace").lstrip()
    try:
        if text[:1] == "{":
            record = json.loads(raw)
            if not isinstance(record, dict):
                return None
            return first_time(record, _DATED_KEYS, None)
        if (text[:1].isdigit() or text[:1] == "[") and (m := _ISO.match(text)):
            return parse_iso8601(f"{m[1]}T{m[2]}.{m[3] or '0'}{m[4] or ''}")
    except (ParseError, ValueError, RecursionError):
        return None
    return None


def split_kubectl_prefix(text: str) -> tuple[str, str, str] | None:
    """Split a ``kubectl logs --prefix`` line into (pod, container, rest); None without prefix.

    Formats: ``[pod/<pod>/<container>] `` (kubectl >= 1.19) and ``[<pod> <container>] ``.
    Source: https://kubernetes.io/docs/reference/kubectl/generated/kubectl_logs/
    """
    m = _KUBECTL_PREFIX.match(text)
    if m is None:
        return None
    pod, container = (m[1], m[2]) if m[1] else (m[3], m[4])
    return pod, container, text[m.end() :]


def _line(text: str, time: float, identity: LogIdentity) -> LogLine:
    return LogLine(
        time=time,
        text=text,
        namespace=identity.namespace,
        pod=identity.pod,
        container=identity.container,
        cluster=identity.cluster,
        owner=identity.owner,
    )


def _month_day_time(m: re.Match[str], default_time: float | None, not_after: float | None) -> float:
    """Time of a year-less ``MM-DD hh:mm:ss[.frac]`` stamp: see ``complete_month_day``."""
    near = _reference(default_time, "year")
    month, day, hour, minute, second = (int(m[i]) for i in range(1, 6))
    fraction = float(f"0.{m[6]}") if m[6] else 0.0
    bound = near if not_after is None else not_after
    return complete_month_day(
        (month, day, hour, minute, second, fraction), near=near, not_after=bound
    )


def _time_of_day(
    hour: int, minute: int, second: int, default_time: float | None, not_after: float | None
) -> float:
    """Time of a date-less ``hh:mm:ss`` stamp: see ``complete_time_of_day``."""
    near = _reference(default_time, "date")
    if hour > 23 or minute > 59 or second > 60:
        raise ParseError("bad_timestamp", f"not a time of day: {hour}:{minute}:{second}")
    bound = near if not_after is None else not_after
    return complete_time_of_day(hour * 3600 + minute * 60 + second, near=near, not_after=bound)


def _reference(default_time: float | None, lacking: str) -> float:
    """Return ``default_time``, checked; raise when there is none to complete a stamp."""
    if default_time is None:
        raise ParseError("missing_timestamp", f"timestamp without a {lacking} and no default time")
    if not 0.0 <= default_time <= _MAX_DEFAULT:
        raise ParseError("bad_timestamp", f"default time out of range: {default_time}")
    return default_time
