"""Bindings from runbook steps to actuators: which actuator serves which action, and how."""
