"""Prometheus metrics of the live loop, in their own registry (nothing global at import).

Scraped from ``http://<host>:<kafka.metrics_port>/metrics`` while ``detector run`` runs.
Format: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from detector.stream.consumer import Partition


class LoopMetrics:
    """Records consumed and rejected, batch latency, consumer lag, offset resets, open
    incidents."""

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
        self.open_incidents = Gauge(
            "detector_open_incidents", "Incidents not yet resolved", registry=self.registry
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)

    def set_lag(self, lag: dict[Partition, int]) -> None:
        """Record the consumer lag per partition."""
        for (topic, partition), behind in lag.items():
            self.lag.labels(topic, str(partition)).set(behind)
