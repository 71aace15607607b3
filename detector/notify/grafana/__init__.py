"""Grafana: the incident's stage changes and steps as annotations, from the outbox."""
