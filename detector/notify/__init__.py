"""notify package."""
