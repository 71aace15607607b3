"""Prometheus metrics of the live loop, in their own registry (nothing global at import).

Scraped from ``http://<host>:<kafka.metrics_port>/metrics`` while ``detector run`` runs.
The coverage gauges have one series per signal (4) for each workload the correlator holds,
at most ``COVERAGE_WORKLOADS_MAX`` workloads (those of open incidents first).
Format: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from detector.correlate.coverage import SignalCoverage
from detector.correlate.identity import WorkloadRef
from detector.stream.consumer import Partition
from detector.stream.health import StoreHealth

# workloads whose coverage is exported: the correlator's (each named by a signal, a named
# controller kept, a one-pod workload forgotten idle past the window), open incidents first
COVERAGE_WORKLOADS_MAX = 500


class LoopMetrics:
    """Records consumed and rejected, batch latency, consumer lag, offset resets, open
    incidents, and each workload's signal coverage (``set_coverage``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.consumed = Counter(
            "detector_records_consumed", "Records consumed", ["topic"], registry=self.registry
        )
        self.rejected = Counter(
            "detector_records_rejected",
            "Records rejected as dead letters",
            ["topic", "reason"],
            registry=self.registry,
        )
        self.batch_seconds = Histogram(
            "detector_batch_seconds",
            "Time to process and commit one batch, seconds",
            registry=self.registry,
        )
        self.lag = Gauge(
            "detector_consumer_lag",
            "Records behind the partition's high watermark",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.held = Gauge(
            "detector_reorder_held_records",
            "Records held back to align partitions in event time",
            registry=self.registry,
        )
        self.offset_resets = Counter(
            "detector_offset_resets",
            "Partitions whose offsets went back: the broker lost records or commits, or the "
            "topic was created again",
            ["topic"],
            registry=self.registry,
        )
        self.key_mismatch = Counter(
            "detector_key_mismatch",
            "Sampled records whose Kafka key is not the namespace/workload their signals name "
            "(a workload's records then miss its partition number on this topic)",
            ["topic"],
            registry=self.registry,
        )
        self.open_incidents = Gauge(
            "detector_open_incidents", "Incidents not yet resolved", registry=self.registry
        )
        self.signal_seen = Gauge(
            "detector_workload_signal_seen",
            "1 when the workload has seen the signal (gpu_oom, crash_loop, lb_errors, "
            "gpu_memory), else 0",
            ["workload", "signal"],
            registry=self.registry,
        )
        self.signal_missing = Gauge(
            "detector_workload_signal_missing",
            "1 for each signal the workload has not seen, labelled with why: no lines, not "
            "attributed, other workloads only, format not read",
            ["workload", "signal", "reason"],
            registry=self.registry,
        )
        # the detector's own health (deploy/prometheus/detector-rules.yaml alerts on these)
        self.last_record = Gauge(
            "detector_last_record_timestamp_seconds",
            "Wall clock (Unix seconds) of the last batch of records committed",
            registry=self.registry,
        )
        self.batch_failures = Counter(
            "detector_batch_failures",
            "Batches that failed and were retried, by cause: store (the database), stream "
            "(Kafka), isolated (one record failed on its own), unexpected",
            ["cause"],
            registry=self.registry,
        )
        self.store_up = Gauge(
            "detector_store_up",
            "1 when the incident store answered the last health probe, else 0",
            registry=self.registry,
        )
        self.outbox_pending = Gauge(
            "detector_slack_outbox_pending",
            "Timeline entries queued for Slack and not sent yet",
            registry=self.registry,
        )
        self.outbox_oldest = Gauge(
            "detector_slack_outbox_oldest_pending_age_seconds",
            "Seconds since the event time of the oldest entry queued for Slack (0: none)",
            registry=self.registry,
        )
        self.failed_actions = Gauge(
            "detector_actuator_failed_actions",
            "Live actuator actions the store records as failed, all time",
            registry=self.registry,
        )
        self._seen: set[tuple[str, ...]] = set()  # the label sets exported last
        self._missing: set[tuple[str, ...]] = set()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)

    def set_coverage(
        self,
        coverage: Mapping[WorkloadRef, Sequence[SignalCoverage]],
        first: Sequence[WorkloadRef] = (),
    ) -> None:
        """Export each workload's signal coverage (``first``: open incidents' workloads, kept
        before the others when more than ``COVERAGE_WORKLOADS_MAX`` are held); the series of
        workloads no longer exported, and of reasons no longer true, are removed."""
        firsts = set(first)
        order = [r for r in firsts if r in coverage] + [r for r in coverage if r not in firsts]
        seen: set[tuple[str, ...]] = set()
        missing: set[tuple[str, ...]] = set()
        for ref in order[:COVERAGE_WORKLOADS_MAX]:
            for c in coverage[ref]:
                seen.add((ref.label, c.signal))
                self.signal_seen.labels(ref.label, c.signal).set(1 if c.count else 0)
                if not c.count:
                    missing.add((ref.label, c.signal, c.reason))
                    self.signal_missing.labels(ref.label, c.signal, c.reason).set(1)
        for labels in self._missing - missing:
            self.signal_missing.remove(*labels)
        for labels in self._seen - seen:
            self.signal_seen.remove(*labels)
        self._seen, self._missing = seen, missing

    def set_health(self, health: StoreHealth | None) -> None:
        """Export the store's health numbers; None: the store did not answer."""
        self.store_up.set(0 if health is None else 1)
        if health is not None:
            self.outbox_pending.set(health.outbox_pending)
            self.outbox_oldest.set(health.outbox_oldest_s)
            self.failed_actions.set(health.failed_actions)

    def set_lag(self, lag: dict[Partition, int]) -> None:
        """Record the consumer lag per partition."""
        for (topic, partition), behind in lag.items():
            self.lag.labels(topic, str(partition)).set(behind)
