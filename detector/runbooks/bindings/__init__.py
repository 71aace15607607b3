"""Bindings from runbook steps to actuators: the only code that imports ``detector.actuators``."""
