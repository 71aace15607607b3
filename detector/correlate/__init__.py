"""correlate package."""
