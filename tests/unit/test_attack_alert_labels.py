"""Which pod an alert is about when Prometheus renamed the metric's own labels.

With ``honor_labels: false`` (the default; https://prometheus.io/docs/prometheus/latest/
configuration/configuration/#scrape_config) a scraped metric's label that the target also
has is kept as ``exported_<name>``: dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` names the GPU's
user in its own ``namespace``/``pod`` labels (https://docs.nvidia.com/datacenter/dcgm/latest/
gpu-telemetry/dcgm-exporter.html), which become ``exported_namespace``/``exported_pod``,
while ``namespace``/``pod`` name the exporter's pod. The verdict must go to the GPU's user.
"""

from __future__ import annotations

from detector.incidents.alerts import AlertIn, signal_of

XID_RENAMED = {
    "status": "firing",
    "labels": {
        "alertname": "GPUXidError",
        "namespace": "gpu-operator",
        "pod": "nvidia-dcgm-exporter-7kq2x",
        "service": "nvidia-dcgm-exporter",
        "exported_namespace": "llm",
        "exported_pod": "vllm-llama-7d9f8c6b5-k4m2p",
        "exported_container": "vllm",
        "gpu": "1",
        "Hostname": "gpu-h100-node-01",
    },
    "annotations": {"summary": "GPU XID error 79"},
    "startsAt": "2026-12-08T00:41:00Z",
    "endsAt": "0001-01-01T00:00:00Z",
    "fingerprint": "b1c4e2d90f3a7716",
}


def test_the_exported_labels_name_the_gpu_user_not_the_exporter() -> None:
    sig = signal_of(AlertIn.model_validate(XID_RENAMED))
    assert (sig.signal, sig.namespace, sig.pod, sig.workload) == (
        "hardware_fault", "llm", "vllm-llama-7d9f8c6b5-k4m2p", "vllm-llama")  # fmt: skip


def test_without_exported_labels_the_plain_ones_stand() -> None:
    labels = {k: v for k, v in XID_RENAMED["labels"].items() if not k.startswith("exported_")}
    sig = signal_of(AlertIn.model_validate({**XID_RENAMED, "labels": labels}))
    assert (sig.namespace, sig.pod) == ("gpu-operator", "nvidia-dcgm-exporter-7kq2x")
