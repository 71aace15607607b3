"""The detector's HTTP surface: the approvals endpoint (more pages later)."""
