"""postmortem package."""
