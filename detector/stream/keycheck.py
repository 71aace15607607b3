"""Tell when a topic's record keys do not name the workload the detector reads from them.

Every shipper must key a record by ``namespace/workload`` (``detector produce`` does; the
configurations in ``deploy/shipping/`` do), so that a workload's records reach the same
partition number of every topic and one consumer of the group holds its whole state. A key
that names another workload, or something else (kubernetes-event-exporter's Kafka sink keys
by the Event's uid), splits a workload between processes once there is more than one.

The check is sampled to stay off the record path (it costs a method call and a look-up per
signal; the loop decides inline, with no call, which records to check): a keyed record with
signals is checked when its offset is a multiple of ``SAMPLE_EVERY`` (64), and every one of a
topic until one of its records named a workload (``KeyCheck.checked``). So the counter
``detector_key_mismatch_total{topic}`` counts sampled mismatches, not all of them. The first
mismatch of each topic is logged with the key and the workload, once (both escaped: they
come from input).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from detector.correlate.identity import WorkloadRef
from detector.textsafe import printable

log = logging.getLogger(__name__)

SAMPLE_EVERY = 64
"""A keyed record with signals is checked when ``offset & SAMPLE_MASK == 0``."""
SAMPLE_MASK = SAMPLE_EVERY - 1


def workload_key(ref: WorkloadRef) -> bytes:
    """Return the record key that ``ref``'s records must carry: ``namespace/name`` in UTF-8."""
    return f"{ref.namespace}/{ref.name}".encode()


class KeyCheck:
    """Compare sampled record keys with the workloads their signals resolve to."""

    def __init__(self) -> None:
        self.checked: set[str] = set()  # topics with a record whose key was compared
        self._warned: set[str] = set()  # topics whose first mismatch was logged

    def check(self, topic: str, key: bytes, refs: Iterable[WorkloadRef | None]) -> bool:
        """Compare ``key`` with the workloads of a record's signals (``refs``, None: named none).

        Return True when the record names a workload and ``key`` is none of them (a mismatch);
        False when it matches one or names none. Logs the first mismatch of ``topic``.
        """
        names = [r for r in refs if r is not None]
        if not names:
            return False
        self.checked.add(topic)
        if key in [workload_key(r) for r in names]:
            return False
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning(
                "record key does not name its workload topic=%s key=%s workload=%s: key every "
                "record by namespace/workload so a workload's records share a partition "
                "number on every topic (deploy/shipping/README.md)",
                topic,
                printable(key[:80].decode("utf-8", "replace"), one_line=True),
                printable(names[0].label, one_line=True),
            )
        return True
