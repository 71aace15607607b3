"""events/sources package."""
