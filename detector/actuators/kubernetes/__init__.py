"""Kubernetes actuators: the base actuator and RBAC (actuator.py), API calls (api.py), patches
(patch.py), workload ceilings, restarts and evictions (workloads.py), gateway rate limits
(gateways.py)."""
