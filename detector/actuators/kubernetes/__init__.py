"""Kubernetes actuators: the base actuator and RBAC (actuator.py), API calls (api.py), patches
(patch.py), Deployment ceilings, restarts and pod evictions (workloads.py), the other serving
controllers (controllers.py: StatefulSet, Argo Rollout, LeaderWorkerSet; templates.py: their
ceilings and Argo's restart), restart moves by controller (restarts.py), which controller a
workload is and the manual step (resolve.py), gateway rate limits (gateways.py)."""
