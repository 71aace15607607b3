"""Kubernetes Events (core/v1 and events.k8s.io/v1, as exporters ship them) -> Signal.

Shapes read: the core/v1 Event (``reason``, ``message``, ``involvedObject``, ``count``,
``firstTimestamp`` / ``lastTimestamp`` / ``eventTime``, ``series``), kubernetes-event-exporter's
version of it (``clusterName``, ``involvedObject`` enriched with labels and ownerReferences),
and events.k8s.io/v1 (``regarding``, ``note``, ``series.count`` / ``deprecatedCount``,
``eventTime`` / ``series.lastObservedTime`` / ``deprecatedLastTimestamp``,
``reportingController`` / ``reportingInstance``, ``deprecatedSource``). Envelopes (OpenShift
eventrouter ``event``, OpenTelemetry stanza ``body``, watch ``object``) are unwrapped by
``detector.events.detect``; Fluent Bit's ``kubernetes_events`` input sends the Event itself
plus a ``date``.

- BackOff "Back-off restarting failed container ..." (and the FailedSync "CrashLoopBackOff"
  wording of Kubernetes <= 1.7) -> CRASH_LOOP, attrs reason, count;
- a message saying OOMKilled, and node events OOMKilling / SystemOOM -> HOST_OOM, attrs reason;
- every other event parses to no signal.

Sources: https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/ ,
https://github.com/resmoio/kubernetes-event-exporter .
"""

from __future__ import annotations

import re
from typing import Any

from detector.errors import ParseError
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.k8s_pod import owner_from_refs
from detector.events.sources.timeparse import parse_time, str_map, str_or_none

_HOST_OOM_REASONS = frozenset({"OOMKilling", "SystemOOM"})
_FIELD_PATH = re.compile(r"spec\.(?:initContainers|containers|ephemeralContainers)\{([^}]+)\}")
_CONTAINER_IN_MESSAGE = re.compile(r"restarting failed container[= ]([a-z0-9][-a-z0-9.]*)")


def signals_from_event(
    event: dict[str, Any], source: SourcePos, *, default_time: float | None = None
) -> list[Signal]:
    """Return the signal one Kubernetes Event carries (at most one).

    Time: lastTimestamp (events.k8s.io/v1: deprecatedLastTimestamp), series.lastObservedTime,
    eventTime, firstTimestamp (deprecatedFirstTimestamp), then metadata.creationTimestamp, then
    ``default_time``. Raises ``ParseError("missing_field")``
    for a signalling event without any time, ``"bad_timestamp"`` for an unparseable one.
    Format: https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/
    """
    reason = event.get("reason")
    message = event.get("message")
    if message is None:
        message = event.get("note")
    if not isinstance(reason, str):
        reason = ""
    if not isinstance(message, str):
        message = ""
    kind = _classify(reason, message)
    if kind is None:
        return []
    obj = _involved(event)
    attrs: dict[str, Any] = {"reason": reason or "OOMKilled"}
    if kind is SignalKind.CRASH_LOOP:
        attrs["count"] = _count(event)
    return [
        Signal(
            kind=kind,
            time=_event_time(event, default_time),
            source=source,
            namespace=_namespace(event, obj),
            pod=str_or_none(obj.get("name")) if obj.get("kind") == "Pod" else None,
            container=_container(obj, message),
            node=_node(event, obj),
            cluster=str_or_none(event.get("clusterName")),
            labels=str_map(obj.get("labels")),
            owner=owner_from_refs(obj.get("ownerReferences")),
            attrs=attrs,
            text=message[:2048],
        )
    ]


def _involved(event: dict[str, Any]) -> dict[str, Any]:
    """The object the event is about: ``involvedObject`` (core/v1) or ``regarding``."""
    for key in ("involvedObject", "regarding"):
        obj = event.get(key)
        if isinstance(obj, dict):
            return obj
    return {}


def _classify(reason: str, message: str) -> SignalKind | None:
    if "OOMKilled" in message or reason in _HOST_OOM_REASONS:
        return SignalKind.HOST_OOM
    if reason == "BackOff" and "restarting failed container" in message:
        return SignalKind.CRASH_LOOP
    if reason == "FailedSync" and "CrashLoopBackOff" in message:
        return SignalKind.CRASH_LOOP
    return None


def _event_time(event: dict[str, Any], default_time: float | None) -> float:
    series, meta = event.get("series"), event.get("metadata")
    candidates = (
        event.get("lastTimestamp"),
        event.get("deprecatedLastTimestamp"),
        series.get("lastObservedTime") if isinstance(series, dict) else None,
        event.get("eventTime"),
        event.get("firstTimestamp"),
        event.get("deprecatedFirstTimestamp"),
        meta.get("creationTimestamp") if isinstance(meta, dict) else None,
    )
    for value in candidates:
        if value is not None:
            return parse_time(value)
    if default_time is None:
        raise ParseError("missing_field", "event has no timestamp")
    return default_time


def _count(event: dict[str, Any]) -> int:
    series = event.get("series")
    for value in (
        event.get("count"),
        series.get("count") if isinstance(series, dict) else None,
        event.get("deprecatedCount"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 1


def _container(obj: dict[str, Any], message: str) -> str | None:
    path = obj.get("fieldPath")
    if isinstance(path, str):
        m = _FIELD_PATH.search(path)
        if m:
            return m.group(1)
    m = _CONTAINER_IN_MESSAGE.search(message)
    return m.group(1) if m else None


def _node(event: dict[str, Any], obj: dict[str, Any]) -> str | None:
    if obj.get("kind") == "Node":
        return str_or_none(obj.get("name"))
    src = event.get("source")
    if not isinstance(src, dict):
        src = event.get("deprecatedSource")  # events.k8s.io/v1
    host = src.get("host") if isinstance(src, dict) else None
    reporter = event.get("reportingComponent") or event.get("reportingController")
    if host is None and reporter == "kubelet":
        host = event.get("reportingInstance")
    return str_or_none(host)


def _namespace(event: dict[str, Any], obj: dict[str, Any]) -> str | None:
    """The involved object's namespace; the event's own only for namespaced objects."""
    namespace = str_or_none(obj.get("namespace"))
    if namespace is not None or obj.get("kind") in (None, "Node"):
        return namespace  # node events live in "default", which says nothing
    meta = event.get("metadata")
    return str_or_none(meta.get("namespace")) if isinstance(meta, dict) else None
