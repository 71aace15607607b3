"""Actuators: adapters that change gateways and serving systems, behind one interface (base.py).

They know nothing of runbooks or incidents; what a runbook step asks of them is translated by
the step bindings of the runbooks package.
"""
