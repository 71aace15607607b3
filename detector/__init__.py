"""GPU OOM cascade detector: detect and contain GPU out-of-memory cascading failures."""

__version__ = "0.1.0"
