"""Per-workload time series in fixed event-time buckets, for charts and the postmortem (pure).

The correlator feeds every attributed load-balancer response and pressure reading to one
``SeriesBook``; an incident's series is read back as ``SeriesPoint``s (``points``). A response
is an access line (or a counter's increase): an nginx error-log line about the same request is
not counted again (nginx writes an access line for every request, the failed ones included:
http://nginx.org/en/docs/http/ngx_http_log_module.html ; and an upstream tried before another
that answered logs an error for a response that did not fail). The series:

- ``requests``, ``errors_5xx`` (HTTP 500-599 the load balancer answered), ``shed_429``
  (``SHED_STATUSES``: 429 and 413, the gateway's own refusals): responses per bucket, label
  ``""`` (the workload);
- ``pressure``: per pod (label), the highest used/total ratio in the bucket, detail ``KV cache``
  or ``GPU memory`` (a pod with KV-cache readings is charted by them alone: for engines that
  pre-reserve VRAM it is the measure; ``pressure_since`` gives both, for the forecast);
  ``ceiling``: the ceiling that reading was judged against, same label and detail.

Every value of a bucket only grows (a count, a maximum), so a writer may upsert a bucket's
latest value with ``max`` and a re-read of part of a bucket never lowers it. Each change
stamps its bucket with the book's ``version``: ``points(since=v)`` returns only the buckets
changed after ``v``, so a writer sends only what changed since its last write.

Memory: buckets older than a horizon the caller passes (``drop_before``) go; the correlator
keeps the window and its open incidents' spans (workloads x window, like its other state).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, Generic, NamedTuple, TypeVar

SERIES_BUCKET_S: Final = 5.0  # seconds of event time per bucket
REQUESTS: Final = "requests"
ERRORS_5XX: Final = "errors_5xx"
SHED_429: Final = "shed_429"
# refused by the gateway itself: its rate limit (429) and its admission rule (413); the
# series keeps its name from when 429 was the only one
SHED_STATUSES: Final = frozenset({413, 429})
PRESSURE: Final = "pressure"
CEILING: Final = "ceiling"
KV_CACHE: Final = "KV cache"
GPU_MEMORY: Final = "GPU memory"

K = TypeVar("K", bound=Hashable)  # what names a workload (the correlator: ``WorkloadRef``)


class SeriesPoint(NamedTuple):
    """One value of one series: ``time`` is the bucket's start (Unix seconds)."""

    time: float
    metric: str  # requests | errors_5xx | shed_429 | pressure | ceiling
    label: str  # "" for the workload's load-balancer series; the pod for pressure, ceiling
    value: float  # responses in the bucket; or a used/total ratio (0..1, may exceed 1)
    detail: str = ""  # pressure, ceiling: "KV cache" | "GPU memory"


class WorkloadSeries:
    """The buckets of one workload: responses by bucket index, pressure by (index, pod,
    measure)."""

    __slots__ = ("kv_pods", "lb", "pressure")

    def __init__(self) -> None:
        # bucket index -> [requests, errors_5xx, shed_429, version of the last change]
        self.lb: dict[int, list[int]] = {}
        # (bucket index, pod, detail) -> (ratio, ceiling, version of the last change)
        self.pressure: dict[tuple[int, str, str], tuple[float, float, int]] = {}
        self.kv_pods: set[str] = set()  # pods with a KV-cache reading: charted by it alone

    def __len__(self) -> int:
        return len(self.lb) + len(self.pressure)


class SeriesBook(Generic[K]):
    """The series of every workload the correlator sees, keyed by workload (pure)."""

    def __init__(self, bucket_s: float = SERIES_BUCKET_S) -> None:
        self.bucket_s = bucket_s
        self.workloads: dict[K, WorkloadSeries] = {}
        self.version = 0  # grows by one per change; ``points(since=...)`` compares with it
        self._last: tuple[K, WorkloadSeries] | None = None  # the latest workload: no hashing

    def _series(self, workload: K) -> WorkloadSeries:
        """Return ``workload``'s buckets, created when new."""
        last = self._last
        if last is not None and last[0] is workload:
            return last[1]
        ws = self.workloads.get(workload)
        if ws is None:
            ws = self.workloads[workload] = WorkloadSeries()
        self._last = (workload, ws)
        return ws

    def add_responses(self, workload: K, time: float, status: int, count: int) -> None:
        """Count ``count`` responses with HTTP ``status`` at event ``time`` (Unix seconds)."""
        ws = self._series(workload)
        index = int(time // self.bucket_s)
        bucket = ws.lb.get(index)
        if bucket is None:
            bucket = ws.lb[index] = [0, 0, 0, 0]
        bucket[0] += count
        if 500 <= status <= 599:
            bucket[1] += count
        elif status in SHED_STATUSES:
            bucket[2] += count
        self.version += 1
        bucket[3] = self.version

    def add_pressure(
        self, workload: K, time: float, pod: str, detail: str, ratio: float, ceiling: float
    ) -> None:
        """Keep the highest used/total ``ratio`` of ``pod`` and ``detail`` (``KV_CACHE`` or
        ``GPU_MEMORY``) in its bucket, with its ``ceiling``."""
        ws = self._series(workload)
        if detail == KV_CACHE:
            ws.kv_pods.add(pod)
        key = (int(time // self.bucket_s), pod, detail)
        old = ws.pressure.get(key)
        if old is not None and ratio <= old[0]:
            return
        self.version += 1
        ws.pressure[key] = (ratio, ceiling, self.version)

    def drop_before(self, workload: K, time: float) -> None:
        """Drop ``workload``'s buckets that end at or before ``time`` (and it, when empty)."""
        ws = self.workloads.get(workload)
        if ws is None:
            return
        first = int(time // self.bucket_s)
        for index in [i for i in ws.lb if i < first]:
            del ws.lb[index]
        for key in [k for k in ws.pressure if k[0] < first]:
            del ws.pressure[key]
        ws.kv_pods = {pod for _, pod, detail in ws.pressure if detail == KV_CACHE}
        if not len(ws):
            self.forget(workload)

    def forget(self, workload: K) -> None:
        """Drop every bucket of ``workload``."""
        self.workloads.pop(workload, None)
        self._last = None

    def pressure_since(
        self, workload: K, start: float
    ) -> list[tuple[float, str, float, float, str]]:
        """Return (bucket start, pod, ratio, ceiling, detail) of ``workload``'s pressure buckets
        from the one holding ``start`` on, every measure, unordered."""
        ws = self.workloads.get(workload)
        if ws is None:
            return []
        first, bucket_s = int(start // self.bucket_s), self.bucket_s
        return [
            (index * bucket_s, pod, ratio, ceiling, detail)
            for (index, pod, detail), (ratio, ceiling, _) in ws.pressure.items()
            if index >= first
        ]

    def points(
        self, workload: K, start: float, end: float | None = None, since: int = 0
    ) -> list[SeriesPoint]:
        """Return the points of the buckets from the one holding ``start`` to the one holding
        ``end`` (None: the latest), changed after version ``since``; ordered by metric, label,
        time."""
        ws = self.workloads.get(workload)
        if ws is None:
            return []
        bucket_s = self.bucket_s
        first = int(start // bucket_s)
        last = int(end // bucket_s) if end is not None else None
        out: list[SeriesPoint] = []
        for index, (requests, errors, shed, version) in ws.lb.items():
            if version > since and index >= first and (last is None or index <= last):
                t = index * bucket_s
                out.append(SeriesPoint(t, REQUESTS, "", float(requests)))
                out.append(SeriesPoint(t, ERRORS_5XX, "", float(errors)))
                out.append(SeriesPoint(t, SHED_429, "", float(shed)))
        kv = ws.kv_pods
        for (index, pod, detail), (ratio, ceiling, version) in ws.pressure.items():
            if detail == GPU_MEMORY and pod in kv:
                continue  # the pod's KV cache is its chart (the forecast reads both)
            if version > since and index >= first and (last is None or index <= last):
                t = index * bucket_s
                out.append(SeriesPoint(t, PRESSURE, pod, ratio, detail))
                out.append(SeriesPoint(t, CEILING, pod, ceiling, detail))
        out.sort(key=lambda p: (p.metric, p.label, p.time))
        return out
