"""Actuators: the adapters that make runbook steps act, behind one interface (base.py)."""
