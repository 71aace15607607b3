"""Request sizes at the gateway: what healthy traffic looks like and what each victim held.

The evidence for telling a poison request class from load (``detector.runbooks.mechanism``):
the access lines' ``request_bytes`` (ingress-nginx ``$request_length``: request line, headers
and body, so it grows with the prompt). Two bounded records per workload:

- ``ok``: (time, bytes) of the requests answered 2xx/3xx in the last ``BASELINE_S``, at most
  ``MAX_OK`` of them; frozen, as the incident's baseline, when its first victim dies;
- per victim, the sizes of the requests its upstream failed (5xx from the pod, or the pod's
  connection refused) from ``BEFORE_DEATH_S`` before its GPU OOM to ``AFTER_DEATH_S`` after:
  the requests it held when it died (a dying engine answers every request in flight 500 and
  a cut connection 502), matched on the victim's pod IP when it is known, else on the time
  alone (to the latest death it can belong to). A stream cut after its 200 is logged 200 and
  is not among them; a request nginx retried on another pod is no failure. A dying engine
  answers all it holds at once (within milliseconds), but the gateway logs them one by one,
  between other pods' lines: a victim's requests are all in (settled) once the gateway logged
  a line ``SETTLE_S`` after the death. A plan may act on them before (a retried request is a
  second away); a verdict on a step waits for them.

Pure and bounded: per access line one deque append; per failed line a scan of the open
incident's victims (a few).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from detector.events.model import Signal

BASELINE_S = 120.0
MAX_OK = 4096
BEFORE_DEATH_S = 1.0
AFTER_DEATH_S = 1.0
SETTLE_S = 0.25  # a death's requests are all in once the gateway's lines pass it by this
MAX_AT_DEATH = 512  # sizes kept per victim


@dataclass(frozen=True, slots=True)
class RequestEvidence:
    """The request sizes an incident knows (bytes).

    ``baseline``: the sizes of the requests served in the ``BASELINE_S`` before the first
    victim died, ascending; ``at_deaths``: per victim in order of death, (pod, GPU OOM time,
    the sizes of the requests its upstream failed at its death, descending, whether all of
    them are in: settled).
    """

    baseline: tuple[int, ...] = ()
    at_deaths: tuple[tuple[str, float, tuple[int, ...], bool], ...] = ()


@dataclass(slots=True)
class Death:
    """One victim's death and the requests it held (sizes in bytes, the largest's line)."""

    pod: str
    at: float
    addr: str | None  # the pod's IP when known
    sizes: list[int] = field(default_factory=list)
    largest: Signal | None = None
    settled: bool = False


@dataclass(slots=True)
class RequestSizes:
    """One workload's request sizes (module docstring)."""

    ok: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=MAX_OK))
    baseline: tuple[int, ...] | None = None  # frozen at the first death of an incident
    deaths: list[Death] = field(default_factory=list)

    def served(self, t: float, size: int) -> None:
        """Record a request answered 2xx/3xx at ``t`` of ``size`` bytes."""
        self.ok.append((t, size))

    def died(self, pod: str, t: float, addr: str | None) -> None:
        """Record a victim's GPU OOM at ``t`` (its IP ``addr`` when known); the first one of an
        incident freezes the baseline."""
        if any(d.pod == pod for d in self.deaths):
            return
        if self.baseline is None:
            self.baseline = tuple(sorted(s for at, s in self.ok if t - BASELINE_S <= at <= t))
        self.deaths.append(Death(pod, t, addr))

    def failed(self, sig: Signal, size: int, host: str | None) -> Death | None:
        """Record a request whose upstream failed (``sig``: its line; ``host``: the upstream's
        IP) for the latest death it can belong to. Returns that death when this request is the
        largest it held so far (evidence worth attaching), else None."""
        t = sig.time
        for death in reversed(self.deaths):
            if not death.at - BEFORE_DEATH_S <= t <= death.at + AFTER_DEATH_S:
                continue
            if death.addr is not None and host is not None and host != death.addr:
                continue
            largest = not death.sizes or size > max(death.sizes)
            if len(death.sizes) < MAX_AT_DEATH:
                death.sizes.append(size)
                death.largest = sig if largest else death.largest
            return death if largest else None
        return None

    def settle(self, t: float) -> None:
        """Mark the deaths whose requests are all in now that the gateway logged a line at
        ``t`` that is none of them, ``SETTLE_S`` after the death (module docstring)."""
        for death in self.deaths:
            if death.settled or t < death.at:
                continue
            if t > death.at + SETTLE_S:
                death.settled = True

    def reset(self) -> None:
        """Forget the incident's baseline and deaths (it ended)."""
        self.baseline, self.deaths = None, []

    def evidence(self) -> RequestEvidence:
        """Return what the incident knows so far."""
        return RequestEvidence(
            baseline=self.baseline or (),
            at_deaths=tuple(
                (d.pod, d.at, tuple(sorted(d.sizes, reverse=True)), d.settled) for d in self.deaths
            ),
        )
