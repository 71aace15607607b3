"""The postmortem's autoscaling action item as a KEDA ScaledObject, checked against the fields
KEDA and the HPA API document, with sizes from what the bundled incident measured.

KEDA's fields: the ScaledObject specification https://keda.sh/docs/2.13/reference/scaledobject-spec/
(``spec``: scaleTargetRef {apiVersion, kind, name, envSourceContainerName}, pollingInterval,
cooldownPeriod, initialCooldownPeriod, idleReplicaCount, minReplicaCount, maxReplicaCount,
fallback, advanced {restoreToOriginalReplicaCount, horizontalPodAutoscalerConfig {name,
behavior}, scalingModifiers}, triggers [{type, name, metadata, authenticationRef, metricType,
useCachedMetrics}]; required scaleTargetRef.name and triggers; metricType AverageValue, Value
or Utilization) and the CRD (https://github.com/kedacore/keda/blob/main/config/crd/bases/
keda.sh_scaledobjects.yaml: metadata values are strings); the Prometheus scaler's metadata
https://keda.sh/docs/2.13/scalers/prometheus/ (serverAddress, query, threshold required).
The HPA's ``behavior`` is read by the ``kubernetes`` client's autoscaling/v2 models, strictly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema_rs
import kubernetes.client
import pytest
import yaml
from kubernetes.client import ApiClient

from detector import db
from detector.config import Settings
from detector.pipeline import replay
from detector.postmortem.autoscaling import Manifest, autoscaling_manifest
from detector.postmortem.export import export_postmortem

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
KEY = "llm/vllm-llama@1741943017"
PROM = "http://prometheus.example:9090"

_TRIGGER = {
    "type": "object",
    "required": ["type", "metadata"],
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string"},
        "name": {"type": "string"},
        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
        "useCachedMetrics": {"type": "boolean"},
        "authenticationRef": {"type": "object"},
        "metadata": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "required": ["serverAddress", "query", "threshold"],
            "propertyNames": {
                "enum": [
                    "serverAddress", "query", "queryParameters", "threshold",
                    "activationThreshold", "namespace", "customHeaders", "ignoreNullValues",
                    "unsafeSsl", "authModes",
                ]
            },
        },
    },
}  # fmt: skip
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        k: {"type": "string"}
                        for k in ("apiVersion", "kind", "name", "envSourceContainerName")
                    },
                },
                **{
                    k: {"type": "integer", "minimum": 0}
                    for k in (
                        "pollingInterval",
                        "cooldownPeriod",
                        "initialCooldownPeriod",
                        "idleReplicaCount",
                        "minReplicaCount",
                        "maxReplicaCount",
                    )
                },
                "fallback": {"type": "object"},
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"name": {"type": "string"}, "behavior": {}},
                        },
                        "scalingModifiers": {"type": "object"},
                    },
                },
                "triggers": {"type": "array", "minItems": 1, "items": _TRIGGER},
            },
        },
    },
}


def strict_model(data: Any, type_name: str) -> None:
    """Fail unless ``data`` uses only the fields of the client model ``type_name``, with the
    types it declares (the client itself ignores unknown keys)."""
    if type_name.startswith("list["):
        assert isinstance(data, list)
        for item in data:
            strict_model(item, type_name[5:-1])
        return
    klass = getattr(kubernetes.client, type_name, None)
    if klass is None:
        expected = {"int": int, "str": str, "bool": bool, "object": object}[type_name]
        assert isinstance(data, expected), (data, type_name)
        return
    assert isinstance(data, dict)
    attrs = {json_key: attr for attr, json_key in klass.attribute_map.items()}
    for key, value in data.items():
        assert key in attrs, f"{type_name} has no field {key!r}"
        strict_model(value, klass.openapi_types[attrs[key]])


def _hpa_behavior(obj: dict[str, Any]) -> Any:
    behavior = obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    strict_model(behavior, "V2HorizontalPodAutoscalerBehavior")
    return ApiClient()._ApiClient__deserialize(behavior, "V2HorizontalPodAutoscalerBehavior")  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, dict[str, Any]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('autoscaling') / 'd.db'}"
    settings = Settings()
    settings.database.url = url
    replay([CASCADE], settings)
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            export = export_postmortem(
                session=session, ref=KEY, fmt="json", settings=settings, prometheus_url=PROM
            )
    finally:
        engine.dispose()
    assert export.manifest is not None and export.manifest.text is not None
    return export.manifest, json.loads(export.text)


# The values autoscaling/v2 accepts for stabilizationWindowSeconds, a field's validity, not a
# timing: "must be greater than or equal to zero and less than or equal to 3600 (one hour)"
# (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/horizontal-pod-autoscaler-v2/).
HPA_STABILIZATION_WINDOW_VALUES = range(0, 3601)


def test_the_manifest_has_only_fields_keda_and_the_hpa_document(
    exported: tuple[Manifest, dict[str, Any]],
) -> None:
    manifest, _ = exported
    assert manifest.filename == "scaledobject-llm-vllm-llama.yaml"
    obj = yaml.safe_load(manifest.text or "")
    jsonschema_rs.validate(SCALED_OBJECT, obj)
    ref = obj["spec"]["scaleTargetRef"]
    strict_model(ref, "V2CrossVersionObjectReference")
    assert ref == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-llama"}
    assert obj["metadata"] == {"name": "vllm-llama", "namespace": "llm"}
    window = _hpa_behavior(obj).scale_down.stabilization_window_seconds
    assert window in HPA_STABILIZATION_WINDOW_VALUES


def test_sizes_come_from_what_the_incident_measured(
    exported: tuple[Manifest, dict[str, Any]],
) -> None:
    manifest, doc = exported
    obj = yaml.safe_load(manifest.text or "")
    spec = obj["spec"]
    (item,) = [i for i in doc["action_items"] if "threshold" in i]
    (limit,) = [i["sizing"] for i in doc["action_items"] if "sizing" in i]
    pods = len(doc["incident"]["pods"])
    assert spec["minReplicaCount"] == pods == 4
    peak, healthy = limit["peak_per_min"], limit["limit_per_min"]
    assert spec["maxReplicaCount"] == math.ceil(pods * peak / healthy) == 15  # 4 x 479 / 131
    kv, queue = spec["triggers"]
    assert kv["metadata"]["threshold"] == str(item["threshold"]) == "0.61"
    assert kv["metricType"] == "Value" and queue["metricType"] == "AverageValue"
    window = _hpa_behavior(obj).scale_down.stabilization_window_seconds
    assert window == math.ceil(doc["impact"]["time_to_recover_s"]) == 204
    for trigger in (kv, queue):
        assert trigger["metadata"]["serverAddress"] == PROM
        assert (
            'namespace="llm",pod=~"vllm-llama-[a-z0-9]+-[a-z0-9]{5}"'
            in trigger["metadata"]["query"]
        )
    assert "vllm:kv_cache_usage_perc{" in kv["metadata"]["query"]
    assert "vllm:gpu_cache_usage_perc{" in kv["metadata"]["query"]  # vLLM before the rename
    assert queue["metadata"]["query"].startswith("sum(vllm:num_requests_waiting{")
    assert manifest.text is not None and manifest.text.startswith("# Autoscaling for Deployment")


def _content(workload: str, kind: str) -> dict[str, Any]:
    return {
        "incident": {"workload": workload, "workload_kind": kind, "pods": ["a-0", "a-1"]},
        "impact": {"time_to_recover_s": 9000.5},
        "action_items": [{"title": "Autoscale", "threshold": 0.5, "detail": "baseline 20%"}],
    }


SIZING = {"limit_per_min": 100, "peak_per_min": 250}


def test_a_statefulset_gets_its_pod_names_and_the_api_window_cap() -> None:
    manifest = autoscaling_manifest(_content("ml/tgi", "StatefulSet"), SIZING, PROM)
    obj = yaml.safe_load(manifest.text or "")
    jsonschema_rs.validate(SCALED_OBJECT, obj)
    assert obj["spec"]["maxReplicaCount"] == 5  # ceil(2 x 250 / 100)
    assert 'pod=~"tgi-[0-9]+"' in obj["spec"]["triggers"][0]["metadata"]["query"]
    assert _hpa_behavior(obj).scale_down.stabilization_window_seconds == 3600


@pytest.mark.parametrize(
    ("workload", "kind", "sizing", "reason"),
    [
        ("ml/isvc", "InferenceService", SIZING, "a InferenceService is not scaled by an HPA"),
        ('ml/x"}or vector(1)', "Deployment", SIZING, "not a Kubernetes name"),
        ("ml/tgi", "Deployment", None, "no healthy load"),
    ],
)
def test_no_manifest_says_why(
    workload: str, kind: str, sizing: dict[str, Any] | None, reason: str
) -> None:
    manifest = autoscaling_manifest(_content(workload, kind), sizing, PROM)
    assert manifest.text is None and reason in manifest.reason
