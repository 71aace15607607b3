"""runbooks/actuators package."""
