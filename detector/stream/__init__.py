"""Kafka in and out: consumer and producer adapters (the only kafka import) and the run loop."""
