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

A year or date the line lacks is taken from ``default_time`` (the nearest such time to it).
``kubectl logs --prefix`` lines (``[pod/<pod>/<container>] ...``, older ``[<pod> <container>]``)
name their pod and container; ``split_kubectl_prefix`` takes that prefix off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from detector.errors import ParseError
from detector.events.model import LogLine
from detector.events.sources.timeparse import first_time, parse_iso8601

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
_DAY_S = 86400.0
_MESSAGE_KEYS = ("message", "msg", "log")
_TIME_KEYS = ("timestamp", "time", "@timestamp", "ts")


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


def parse_raw_line(text: str, identity: LogIdentity, *, default_time: float | None) -> LogLine:
    """Return a plain log line as a LogLine of ``identity``, timed by its leading timestamp.

    Time: see ``leading_time``. Raises ``ParseError("missing_timestamp")`` when the line has no
    timestamp (or one without a year or date) and there is no ``default_time``, and
    ``"bad_timestamp"`` for a leading timestamp that is not a real time. Formats: the module
    docstring; e.g. https://github.com/vllm-project/vllm/blob/main/vllm/logger.py
    """
    return _line(text, leading_time(text, default_time), identity)


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


def leading_time(text: str, default_time: float | None) -> float:
    """Return the Unix time of the timestamp ``text`` starts with, else ``default_time``.

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
            return _time_of_day(int(m[1]), int(m[2]), int(m[3]), default_time)
    elif first.isupper() and (m := _KLOG.match(head) or _VLLM.match(head)):
        return _month_day_time(m, default_time)
    if default_time is None:
        raise ParseError("missing_timestamp", "plain line without a timestamp or default time")
    return default_time


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


def _month_day_time(m: re.Match[str], default_time: float | None) -> float:
    """Time of a year-less ``MM-DD hh:mm:ss[.frac]`` stamp: the year nearest ``default_time``."""
    ref = _reference(default_time, "year")
    month, day, hour, minute, second = (int(m[i]) for i in range(1, 6))
    fraction = float(f"0.{m[6]}") if m[6] else 0.0
    best: float | None = None
    for year in (ref.year - 1, ref.year, ref.year + 1):
        try:
            moment = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
        except ValueError:
            continue
        seconds = moment.timestamp() + fraction
        if best is None or abs(seconds - ref.timestamp()) < abs(best - ref.timestamp()):
            best = seconds
    if best is None or best < 0:
        raise ParseError("bad_timestamp", f"not a date: {m[0]!r}")
    return best


def _time_of_day(hour: int, minute: int, second: int, default_time: float | None) -> float:
    """Time of a date-less ``hh:mm:ss`` stamp: the day nearest ``default_time``."""
    ref = _reference(default_time, "date")
    if hour > 23 or minute > 59 or second > 60:
        raise ParseError("bad_timestamp", f"not a time of day: {hour}:{minute}:{second}")
    midnight = ref.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    offset = hour * 3600 + minute * 60 + second
    candidates = (midnight - _DAY_S + offset, midnight + offset, midnight + _DAY_S + offset)
    best = min(candidates, key=lambda t: abs(t - ref.timestamp()))
    return max(best, 0.0)


def _reference(default_time: float | None, lacking: str) -> datetime:
    """Return ``default_time`` as a UTC datetime; raise when there is none to complete a stamp."""
    if default_time is None:
        raise ParseError("missing_timestamp", f"timestamp without a {lacking} and no default time")
    try:
        return datetime.fromtimestamp(default_time, UTC)
    except (OverflowError, ValueError, OSError):
        raise ParseError("bad_timestamp", f"default time out of range: {default_time}") from None
