"""The pure view of one incident that planning and question answering read."""

from __future__ import annotations

from dataclasses import dataclass, field

from detector.correlate.forecast import NextVictim
from detector.correlate.requests import RequestEvidence
from detector.events.model import Signal


@dataclass(frozen=True, slots=True)
class IncidentContext:
    """What is known about one incident at a moment, in event time.

    ``victims`` are the pods that died of GPU OOM, in order of their first OOM.
    ``pods_seen`` are all pods of the workload that any signal named (healthy ones included).
    ``signals`` are the evidence signals attached to the incident, ordered by time, and
    include the engine_config / engine_pressure / gpu_memory signals of the workload's pods.
    ``next_victim`` is the latest next-victim forecast while the incident is suspected or
    cascading (:mod:`detector.correlate.forecast`: the pod, ``eta_s`` from ``fitted_at``);
    None when no survivor is at risk. ``requests``: the request sizes at the gateway before
    the first death and at each victim's (:mod:`detector.correlate.requests`).
    """

    key: str
    namespace: str
    workload: str
    workload_kind: str  # Deployment | StatefulSet | unknown
    stage: str  # suspected | cascading | contained | resolved
    opened_at: float  # Unix seconds
    cluster: str | None = None
    victims: tuple[str, ...] = ()
    pods_seen: tuple[str, ...] = ()
    signals: tuple[Signal, ...] = field(default_factory=tuple)
    next_victim: NextVictim | None = None
    requests: RequestEvidence = field(default_factory=RequestEvidence)
