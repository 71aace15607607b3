"""The registry built from env settings acts through the Kubernetes API, only when armed.

``detector replay`` of examples/cascade runs as a subprocess with
``DETECTOR_CONTAINMENT__KUBERNETES__*`` naming a kubeconfig that points at the fake API server
of kube_fake.py (its ``kube`` fixture, which also checks every call is granted by
deploy/rbac.yaml). Armed and not in dry-run, the ceiling step must PATCH the Deployment with
the computed ``--max-num-seqs`` and the rate-limit step the Ingress with the computed
annotations; not armed, only GETs may reach the server.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ceiling_for_any_mechanism
from kube_fake import FakeKube, Recorded, kube, write_kubeconfig
from test_kubernetes_actuator import controller_configmap, ingress, pod, vllm_deployment

from detector.actuators.base import Status
from detector.config import ContainmentSettings, KubernetesSettings, Settings
from detector.runbooks.bindings.registry import step_actuators
from detector.runbooks.definition import Action
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import planned_step

__all__ = ["kube"]  # a fixture, used by name
CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
NS, WORKLOAD = "llm", "vllm-llama"  # the workload of examples/cascade
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/{WORKLOAD}"
INGRESS = f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses/{WORKLOAD}"
LIMIT_RPS = "nginx.ingress.kubernetes.io/limit-rps"
LIMIT_CONNECTIONS = "nginx.ingress.kubernetes.io/limit-connections"


def _moved(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """Return ``obj`` in namespace ``llm`` under ``name``."""
    obj = copy.deepcopy(obj)
    obj["metadata"].update(namespace=NS, name=name)
    return obj


def _seed(kube: FakeKube) -> None:
    kube.put(_moved(vllm_deployment(), WORKLOAD))
    kube.put(_moved(ingress(WORKLOAD), WORKLOAD))
    kube.put(controller_configmap({"limit-req-status-code": "429"}))


def _replay(tmp_path: Path, kubeconfig: Path, *, armed: bool) -> dict[str, Any]:
    env = {
        "DETECTOR_DRY_RUN": "false",
        "DETECTOR_CONTAINMENT__KUBERNETES__KUBECONFIG": str(kubeconfig),
        "DETECTOR_CONTAINMENT__KUBERNETES__CONTAINERS": json.dumps({f"{NS}/{WORKLOAD}": "vllm"}),
        "DETECTOR_CONTAINMENT__KUBERNETES__REQUEST_TIMEOUT_S": "5",
        "DETECTOR_CONTAINMENT__KUBERNETES__FIELD_MANAGER": "detector-test",
    }
    env["DETECTOR_RUNBOOK_PATH"] = ceiling_for_any_mechanism(tmp_path)  # the ceiling's binding
    if armed:
        env["DETECTOR_CONTAINMENT__ARMED_WORKLOADS"] = json.dumps([f"{NS}/{WORKLOAD}"])
    args = [sys.executable, "-m", "detector", "replay", "--json"]
    args += ["--db", f"sqlite:///{tmp_path / 'store.db'}", str(CASCADE)]
    base = {k: v for k, v in os.environ.items() if not k.startswith("DETECTOR_")}
    done = subprocess.run(args, env={**base, **env}, capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    (incident,) = json.loads(done.stdout)["incidents"]
    return dict(incident)


def _live(kube: FakeKube, method: str, path: str) -> list[Recorded]:
    return [r for r in kube.history if (r.method, r.path, r.dry_run) == (method, path, False)]


def test_an_armed_replay_patches_the_deployment_and_the_ingress(
    kube: FakeKube, tmp_path: Path
) -> None:
    _seed(kube)
    incident = _replay(tmp_path, write_kubeconfig(tmp_path, kube.url), armed=True)
    steps = {s["action"]: s for s in incident["steps"]}
    ceiling, rate = steps["lower_batch_ceiling"]["params"], steps["enable_rate_limit"]["params"]
    assert ceiling["new_ceiling"] == 13  # computed from the cascade's own lines (the basis)

    dry = [r for r in kube.history if r.path == DEPLOY and r.dry_run]
    (patch,) = _live(kube, "PATCH", DEPLOY)
    assert dry and dry[0].body == patch.body  # the server-side dry run came first, same body
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.query == {"fieldManager": "detector-test"}
    (container,) = patch.body["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "vllm"
    assert container["args"] == [
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-num-seqs",
        "13",
        "--gpu-memory-utilization=0.9",
        "--max-model-len=32768",
    ]
    assert patch.body["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert set(patch.body["metadata"]) == {"resourceVersion"}

    ingress_patches = _live(kube, "PATCH", INGRESS)
    assert ingress_patches, [r.path for r in kube.history]
    first = ingress_patches[0].body
    assert first["metadata"]["annotations"] == {  # what the planner computed for the step
        LIMIT_RPS: str(rate["limit_rps"]),
        LIMIT_CONNECTIONS: str(rate["limit_connections"]),
    }
    assert first["metadata"]["resourceVersion"]
    # nothing else was written: no pod was evicted (that step waits for an approver)
    writes = {(r.method, r.path) for r in kube.history if r.method != "GET"}
    assert writes == {("PATCH", DEPLOY), ("PATCH", INGRESS)}


def test_not_armed_only_reads(kube: FakeKube, tmp_path: Path) -> None:
    _seed(kube)
    incident = _replay(tmp_path, write_kubeconfig(tmp_path, kube.url), armed=False)
    assert [r for r in kube.history if r.method != "GET"] == []
    assert {r.path for r in kube.history} >= {DEPLOY, INGRESS}  # the plans read the objects
    statuses = {s["action"]: s["status"] for s in incident["steps"]}
    assert statuses["lower_batch_ceiling"] == "dry_run"
    diffs = " ".join(json.dumps(t) for t in incident["timeline"])
    assert "max-num-seqs" in diffs and "13" in diffs


def test_a_restart_move_evicts_the_pod_it_names(kube: FakeKube, tmp_path: Path) -> None:
    victim = _moved(pod("uid-victim"), "vllm-llama-0")
    kube.put(victim)
    kube.put(_moved(vllm_deployment(), WORKLOAD))
    settings = Settings(
        containment=ContainmentSettings(
            kubernetes=KubernetesSettings(kubeconfig=write_kubeconfig(tmp_path, kube.url))
        )
    )
    registry = step_actuators(settings)
    runbook = load_runbook(default_runbook_path())
    position = next(i for i, s in enumerate(runbook.steps, 1) if s.id == "stagger_restarts")
    params = {"namespace": NS, "workload": WORKLOAD, "workload_kind": "Deployment"}
    params |= {"pods": '["vllm-llama-0"]', "pod": "vllm-llama-0"}
    step = planned_step(runbook, position, params, "planned")
    actuator = registry[Action.STAGGER_RESTARTS.value]
    plan = actuator.plan_step(step)
    assert actuator.apply(plan).status is Status.DRY_RUN
    victim_path = f"/api/v1/namespaces/{NS}/pods/vllm-llama-0"
    assert [(r.method, r.path) for r in kube.history] == [
        ("GET", DEPLOY),  # which controller: a Deployment (not a Rollout, nor an LWS leader)
        ("GET", victim_path),  # plan
        ("GET", victim_path),  # dry-run re-read
    ]
    result = actuator.apply(plan, dry_run=False)
    assert result.status is Status.OK, result
    (dry, live) = [r for r in kube.history if r.method == "POST"]
    path = f"/api/v1/namespaces/{NS}/pods/vllm-llama-0/eviction"
    assert (dry.path, dry.dry_run, live.path, live.dry_run) == (path, True, path, False)
    assert live.body["deleteOptions"] == {"preconditions": {"uid": "uid-victim"}}
