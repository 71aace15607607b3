"""Alertmanager alerts as our signals: names to signals, labels to workloads, the time.

The payload is ``fixtures/alertmanager_webhook_v4.json`` (shape and alerts: its ``_source``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from detector.incidents.alerts import (
    HARDWARE_FAULT,
    AlertIn,
    WebhookIn,
    dedupe_key,
    signal_name,
    signal_of,
)

PAYLOAD = json.loads((Path(__file__).parent / "fixtures/alertmanager_webhook_v4.json").read_text())


@pytest.mark.parametrize(
    ("name", "signal"),
    [
        ("KubePodCrashLooping", "crash_loop"),
        ("NginxIngressHigh5xxRate", "lb_errors"),
        ("IngressHighHttp5xxErrorRate", "lb_errors"),
        ("DCGMFramebufferMemoryHigh", "gpu_memory"),
        ("GPUMemoryNearFull", "gpu_memory"),
        ("VLLMKVCacheUsageHigh", "engine_pressure"),
        ("VLLMRequestQueueLong", "engine_pressure"),
        ("GPUXidError", HARDWARE_FAULT),
        ("DCGMDoubleBitEccErrors", HARDWARE_FAULT),
        ("GPURowRemapFailure", HARDWARE_FAULT),
        ("ProbeFailure", "alert"),
        ("Watchdog", "alert"),
    ],
)
def test_names_map_to_signals(name: str, signal: str) -> None:
    assert signal_name(name) == signal


def test_crash_loop_alert_names_its_workload_from_the_pod() -> None:
    sig = signal_of(AlertIn.model_validate(PAYLOAD["alerts"][0]))
    assert (sig.signal, sig.namespace, sig.pod) == ("crash_loop", "llm", PAYLOAD["alerts"][0]
                                                    ["labels"]["pod"])  # fmt: skip
    assert sig.workload == "vllm-llama"  # the Deployment the ReplicaSet pod name implies
    assert sig.time == datetime(2026, 12, 8, 0, 40, 12, 500000, tzinfo=UTC).timestamp()
    assert sig.summary == "alert KubePodCrashLooping firing: Pod is crash looping."


def test_an_explicit_workload_label_wins_and_resolved_takes_ends_at() -> None:
    alert = AlertIn.model_validate(
        {**PAYLOAD["alerts"][0], "status": "resolved", "endsAt": "2026-12-08T00:50:00Z",
         "labels": {**PAYLOAD["alerts"][0]["labels"], "deployment": "vllm-other"}}
    )  # fmt: skip
    sig = signal_of(alert)
    assert sig.workload == "vllm-other"
    assert sig.time == datetime(2026, 12, 8, 0, 50, tzinfo=UTC).timestamp()


def test_an_alert_without_workload_labels_names_none() -> None:
    sig = signal_of(AlertIn.model_validate(PAYLOAD["alerts"][2]))
    assert (sig.signal, sig.namespace, sig.workload) == ("alert", None, None)


def test_dedupe_key_changes_with_status_and_start_only() -> None:
    first = AlertIn.model_validate(PAYLOAD["alerts"][0])
    same = AlertIn.model_validate({**PAYLOAD["alerts"][0], "annotations": {}})
    resolved = AlertIn.model_validate({**PAYLOAD["alerts"][0], "status": "resolved"})
    again = AlertIn.model_validate({**PAYLOAD["alerts"][0], "startsAt": "2026-12-08T01:00:00Z"})
    key = dedupe_key("g", first)
    assert key == dedupe_key("g", same)
    assert (
        len({key, dedupe_key("g", resolved), dedupe_key("g", again), dedupe_key("h", first)}) == 4
    )


@pytest.mark.parametrize(
    "change",
    [
        {"version": "3"},
        {"status": "pending"},
        {"groupKey": ""},
        {"alerts": [{"status": "firing", "labels": {}, "startsAt": "not a time"}]},
        {"alerts": "none"},
    ],
)
def test_a_payload_that_is_not_version_4_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        WebhookIn.model_validate({**PAYLOAD, **change})


def test_the_fixture_is_a_valid_payload() -> None:
    payload = WebhookIn.model_validate(PAYLOAD)
    assert [a.fingerprint for a in payload.alerts] == [a["fingerprint"] for a in PAYLOAD["alerts"]]
