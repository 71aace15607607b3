"""Tell which of the four input streams a record belongs to, from the signals it gave.

The detector reads four streams (``kafka.topics``, in this order): container logs, Kubernetes
events and pod status, load-balancer access logs, GPU and engine metrics. ``detector produce``
uses this to put a recorded file on its topic; the format is the one ``detect.parse_record``
recognized, never the file name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from enum import IntEnum

from detector.events.model import Signal, SignalKind


class Stream(IntEnum):
    """An input stream; its value is its position in ``kafka.topics``."""

    LOGS = 0
    EVENTS = 1
    LB = 2
    METRICS = 3


_EVENT_KINDS = frozenset(
    (SignalKind.CRASH_LOOP, SignalKind.POD_READY, SignalKind.HOST_OOM, SignalKind.POD_ADDRESS)
)


def stream_of(signal: Signal) -> Stream:
    """Return the stream a signal's record came from.

    A metric sample (``attrs["metric"]``: DCGM, engine ``/metrics``, nvidia-smi, load-balancer
    counters) is METRICS; a proxy's access or error line, which names its upstream (or a
    serving pod's sidecar proxy), LB; a pod's state (events, pod objects, EndpointSlices)
    EVENTS; anything else, a web server's own access lines included, a container's log line.
    """
    attrs = signal.attrs
    if "metric" in attrs:
        return Stream.METRICS
    if signal.kind is SignalKind.LB_RESPONSE and (
        attrs.get("upstream") or attrs.get("upstream_addr") or attrs.get("sidecar")
    ):
        return Stream.LB
    if signal.kind in _EVENT_KINDS:
        return Stream.EVENTS
    return Stream.LOGS


def file_stream(records: Iterable[list[Signal]]) -> Stream | None:
    """Return the stream most of a file's records belong to (by their first signal).

    ``records`` holds the signals of each record; records without one do not vote (a healthy
    log line says nothing). None when no record gave a signal. Ties go to the first stream in
    ``Stream`` order.
    """
    votes = Counter(stream_of(signals[0]) for signals in records if signals)
    if not votes:
        return None
    return max(sorted(votes), key=lambda stream: votes[stream])
