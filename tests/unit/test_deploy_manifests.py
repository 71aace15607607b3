"""Every Kubernetes manifest in deploy/ against the Kubernetes schemas and the actuators' calls.

The schemas are the official ``kubernetes`` client's model classes, generated from the API's
OpenAPI document: each document is walked against ``openapi_types``/``attribute_map``, so an
unknown or misspelled field is an error (the API server would drop it or, with
``fieldValidation=Strict``, refuse it), then deserialized by the client (required fields).
An apiVersion/kind pair is real when the client's API class for that group and version can
create that kind (``RbacAuthorizationV1Api.create_namespaced_role``), which also says whether
the kind is namespaced. The RBAC rules must grant exactly
``detector.actuators.kubernetes.actuator.RBAC_PERMISSIONS``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from detector.actuators.kubernetes.actuator import (
    DEFAULT_CONTROLLER_CONFIGMAP,
    RBAC_PERMISSIONS,
    RESOURCE_NAMES,
)
from detector.actuators.kubernetes.api import (
    CALLS,
    DEPLOYMENTS,
    LEADERWORKERSETS,
    ROLLOUTS,
    STATEFULSETS,
    Verb,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NOT_KUBERNETES = {"compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"}
# a Helm chart (templates, values: tests/integration/test_helm_chart.py renders and checks it),
# Prometheus rule files (tests/integration/test_health_rules.py), shipper configurations
# (tests/unit/test_shipping_configs.py)
NOT_MANIFEST_DIRS = {"helm", "prometheus", "shipping"}
_PRIMITIVES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "bool": bool,
    "float": (int, float),
    "object": object,
    "datetime": str,
    "date": str,
}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]):
        if path.name in NOT_KUBERNETES or path.relative_to(DEPLOY).parts[0] in NOT_MANIFEST_DIRS:
            continue
        for index, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if doc is not None:
                found.append((f"{path.relative_to(DEPLOY)}#{index}", doc))
    return found


DOCUMENTS = _documents()


def _split(type_name: str) -> tuple[str, str]:
    """Return ("list"|"dict"|"", inner type) for the client's type strings (old and new)."""
    type_name = re.sub(r"^Optional\[(.*)\]$", r"\1", type_name)
    for pattern, shape in (
        (r"^[Ll]ist\[(.*)\]$", "list"),
        (r"^Dict\[str, (.*)\]$", "dict"),
        (r"^dict\(str, (.*)\)$", "dict"),
    ):
        match = re.match(pattern, type_name)
        if match:
            return shape, match.group(1)
    return "", type_name


def strict_errors(data: Any, type_name: str, where: str) -> list[str]:
    """Return every unknown field or wrong primitive type in ``data`` read as ``type_name``."""
    shape, inner = _split(type_name)
    if shape == "list":
        if not isinstance(data, list):
            return [f"{where}: expected a list"]
        return [
            e for i, item in enumerate(data) for e in strict_errors(item, inner, f"{where}[{i}]")
        ]
    if shape == "dict":
        if not isinstance(data, dict):
            return [f"{where}: expected a map"]
        return [e for k, v in data.items() for e in strict_errors(v, inner, f"{where}.{k}")]
    if inner in _PRIMITIVES:
        ok = isinstance(data, _PRIMITIVES[inner]) and not (
            inner == "int" and isinstance(data, bool)
        )
        return [] if ok else [f"{where}: expected {inner}, got {data!r}"]
    model = getattr(client, inner)
    if not isinstance(data, dict):
        return [f"{where}: expected a {inner} object"]
    attrs = {json_key: attr for attr, json_key in model.attribute_map.items()}
    errors = []
    for key, value in data.items():
        if key not in attrs:
            errors.append(f"{where}.{key}: unknown field of {inner}")
        else:
            errors += strict_errors(value, model.openapi_types[attrs[key]], f"{where}.{key}")
    return errors


def api_class(api_version: str) -> Any:
    """Return the client's API class for ``group/version`` (``CoreV1Api`` for ``v1``)."""
    group, _, version = api_version.rpartition("/")
    words = group.removesuffix(".k8s.io").replace("-", ".").split(".") if group else ["core"]
    return getattr(client, "".join(w.capitalize() for w in words) + version.capitalize() + "Api")


def _snake(kind: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


def model_name(api_version: str) -> str:
    """Return the model prefix: ``V1`` for ``rbac.authorization.k8s.io/v1``."""
    return api_version.rpartition("/")[2].capitalize()


@pytest.mark.parametrize(("where", "doc"), DOCUMENTS, ids=[w for w, _ in DOCUMENTS])
def test_manifest_is_a_real_kind_with_only_known_fields(where: str, doc: dict[str, Any]) -> None:
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    assert isinstance(api_version, str) and isinstance(kind, str), f"{where}: apiVersion, kind"
    api = api_class(api_version)
    namespaced = hasattr(api, f"create_namespaced_{_snake(kind)}")
    assert namespaced or hasattr(api, f"create_{_snake(kind)}"), f"{where}: {api_version} {kind}"
    meta = doc.get("metadata") or {}
    assert bool(meta.get("namespace")) == namespaced, f"{where}: namespace vs scope of {kind}"

    type_name = f"{model_name(api_version)}{kind}"
    assert strict_errors(doc, type_name, where) == []
    obj = client.ApiClient()._ApiClient__deserialize(doc, type_name)  # type: ignore[attr-defined]
    assert type(obj).__name__ == type_name


def test_strict_walk_catches_unknown_and_misspelled_fields() -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "x", "namespace": "y", "lables": {}},
        "rules": [{"apiGroups": [""], "resource": ["pods"], "verbs": ["get", 1]}],
    }
    assert strict_errors(role, "V1Role", "doc") == [
        "doc.metadata.lables: unknown field of V1ObjectMeta",
        "doc.rules[0].resource: unknown field of V1PolicyRule",
        "doc.rules[0].verbs[1]: expected str, got 1",
    ]
    assert not hasattr(api_class("apps/v1"), "create_namespaced_role")
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding"}
    with pytest.raises(ValueError, match=r"roleRef|role_ref"):  # a required field is missing
        client.ApiClient()._ApiClient__deserialize(binding, "V1RoleBinding")  # type: ignore[attr-defined]


def _grants(doc: dict[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    grants = set()
    for rule in doc.get("rules") or []:
        names = tuple(rule.get("resourceNames") or ())
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    grants.add((group, resource, verb, names))
    return grants


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCUMENTS if doc.get("kind") == kind]


def test_rbac_rules_grant_exactly_what_the_actuators_call() -> None:
    expected = {
        (p.api_group, p.resource, p.verb, RESOURCE_NAMES.get(p, ())) for p in RBAC_PERMISSIONS
    }
    granted = set()
    for role in [*_by_kind("ClusterRole"), *_by_kind("Role")]:
        granted |= _grants(role)
    assert granted == expected
    (cluster_role,) = _by_kind("ClusterRole")
    assert all(not names for *_, names in _grants(cluster_role))
    (role,) = _by_kind("Role")
    assert role["metadata"]["namespace"] == DEFAULT_CONTROLLER_CONFIGMAP[0]


def test_each_serving_controller_is_read_watched_and_patched_never_created_or_deleted() -> None:
    (cluster_role,) = _by_kind("ClusterRole")
    grants = _grants(cluster_role)
    for kind in (DEPLOYMENTS, STATEFULSETS, ROLLOUTS, LEADERWORKERSETS):
        verbs = {v for g, r, v, _ in grants if (g, r) == (kind.group, kind.plural)}
        assert verbs == {"get", "list", "watch", "patch"}, kind.label
        assert {(kind, Verb.GET), (kind, Verb.PATCH)} <= CALLS  # the actuators' own calls
    pod_verbs = {v for _, r, v, _ in grants if r == "pods"}
    assert pod_verbs == {"get", "list", "watch", "delete"}  # an LWS group: its leader pod


def test_bindings_tie_the_service_account_to_the_roles() -> None:
    (account,) = _by_kind("ServiceAccount")
    roles = {(d["kind"], d["metadata"]["name"]) for d in _by_kind("ClusterRole") + _by_kind("Role")}
    bindings = _by_kind("RoleBinding") + _by_kind("ClusterRoleBinding")
    assert {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings} == roles
    for binding in bindings:
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"],
            }
        ]
    assert _by_kind("ClusterRoleBinding") == []  # workload grants are per namespace
