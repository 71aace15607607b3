"""lab package."""
