"""Kubernetes Pods, Events and the event shippers' records -> CRASH_LOOP / HOST_OOM / POD_READY."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from detector.errors import ParseError
from detector.events.detect import MAX_DOCUMENT_BYTES, MAX_RECORD_BYTES, parse_record
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.reader import read_records
from detector.events.sources.k8s_event import signals_from_event
from detector.events.sources.k8s_pod import owner_from_refs, signals_from_pod
from detector.events.sources.timeparse import parse_iso8601

FIXTURES = Path(__file__).parent / "fixtures"
SRC = SourcePos("k8s", 1)


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def _check(signals: list[Signal], expect: list[list[Any]]) -> None:
    assert [s.kind.value for s in signals] == [e[0] for e in expect]
    for sig, (_kind, attrs, time, *identity) in zip(signals, expect, strict=True):
        for key, value in attrs.items():
            assert sig.attrs[key] == value, key
        assert sig.time == parse_iso8601(time)
        for key, value in (identity[0] if identity else {}).items():
            assert getattr(sig, key) == value, key


@pytest.mark.parametrize(
    "row", _rows("sources_k8s_pods.jsonl"), ids=lambda r: r["source"].split("github.com/")[1]
)
def test_real_pods(row: dict[str, Any]) -> None:
    _check(signals_from_pod(row["pod"], SRC), row["expect"])


@pytest.mark.parametrize(
    "row", _rows("sources_k8s_events.jsonl"), ids=lambda r: r["source"].split("github.com/")[1]
)
def test_real_events(row: dict[str, Any]) -> None:
    _check(signals_from_event(row["event"], SRC), row["expect"])


def _vllm_pod(**status: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": "vllm-llama-7d9f8b6c5d-x2kqz",
            "namespace": "llm",
            "labels": {"app": "vllm-llama"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": "vllm-llama-7d9f8b6c5d", "controller": True}
            ],
        },
        "spec": {"nodeName": "gpu-node-1"},
        "status": status,
    }


def _cs(**fields: Any) -> dict[str, Any]:
    return {"name": "vllm", "ready": False, "restartCount": 3, **fields}


CRASHLOOP = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}
OOM_LAST = {
    "terminated": {
        "exitCode": 137,
        "reason": "OOMKilled",
        "startedAt": "2024-12-17T10:00:00Z",
        "finishedAt": "2024-12-17T10:05:00Z",
    }
}


@pytest.mark.parametrize(
    ("status", "kinds"),
    [
        (
            {"phase": "Running", "containerStatuses": [_cs(state=CRASHLOOP, lastState=OOM_LAST)]},
            ["host_oom", "crash_loop"],
        ),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    _cs(
                        state=CRASHLOOP,
                        lastState={
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "finishedAt": "2024-12-17T10:05:00Z",
                            }
                        },
                    )
                ],
            },
            ["crash_loop"],
        ),
        # exit 137 without a reason: treated as an OOM kill
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    _cs(
                        state={"running": {"startedAt": "2024-12-17T10:06:00Z"}},
                        lastState={
                            "terminated": {"exitCode": 137, "finishedAt": "2024-12-17T10:05:00Z"}
                        },
                    )
                ],
            },
            ["host_oom"],
        ),
        # healthy and ready
        (
            {
                "phase": "Running",
                "startTime": "2024-12-17T09:00:00Z",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": "2024-12-17T09:03:00Z",
                    }
                ],
                "containerStatuses": [
                    _cs(
                        ready=True,
                        restartCount=0,
                        state={"running": {"startedAt": "2024-12-17T09:01:00Z"}},
                    )
                ],
            },
            ["pod_ready"],
        ),
        # Ready condition False wins over container flags
        (
            {
                "phase": "Running",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "lastTransitionTime": "2024-12-17T09:03:00Z",
                    }
                ],
                "containerStatuses": [_cs(ready=True, restartCount=0)],
            },
            [],
        ),
        # pending, pulling the image
        (
            {
                "phase": "Pending",
                "startTime": "2024-12-17T09:00:00Z",
                "containerStatuses": [
                    _cs(restartCount=0, state={"waiting": {"reason": "ContainerCreating"}})
                ],
            },
            [],
        ),
    ],
)
def test_pod_table(status: dict[str, Any], kinds: list[str]) -> None:
    signals = signals_from_pod(_vllm_pod(**status), SRC)
    assert [s.kind.value for s in signals] == kinds
    for sig in signals:
        assert sig.owner == ("ReplicaSet", "vllm-llama-7d9f8b6c5d")
        assert (sig.namespace, sig.pod, sig.node) == (
            "llm",
            "vllm-llama-7d9f8b6c5d-x2kqz",
            "gpu-node-1",
        )
        assert sig.labels == {"app": "vllm-llama"}


def test_pod_crash_loop_attrs_and_times() -> None:
    status = {"phase": "Running", "containerStatuses": [_cs(state=CRASHLOOP, lastState=OOM_LAST)]}
    host_oom, crash = signals_from_pod(_vllm_pod(**status), SRC)
    assert host_oom.kind is SignalKind.HOST_OOM
    assert host_oom.attrs == {"reason": "OOMKilled", "exit_code": 137}
    assert host_oom.container == "vllm"
    assert crash.attrs == {
        "reason": "CrashLoopBackOff",
        "restart_count": 3,
        "last_reason": "OOMKilled",
        "exit_code": 137,
    }
    assert crash.time == host_oom.time == parse_iso8601("2024-12-17T10:05:00Z")


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ({"phase": "Pending"}, "missing_field"),
        ({}, "missing_field"),
        ({"phase": "Running", "startTime": "yesterday"}, "bad_timestamp"),
        ({"containerStatuses": [_cs(state=CRASHLOOP)]}, "missing_field"),
    ],
)
def test_pod_rejects(status: dict[str, Any], reason: str) -> None:
    with pytest.raises(ParseError) as err:
        signals_from_pod(_vllm_pod(**status), SRC)
    assert err.value.reason == reason


def test_pod_tolerates_wrong_types() -> None:
    pod = _vllm_pod(
        phase="Running",
        startTime="2024-12-17T09:00:00Z",
        containerStatuses=[
            "junk",
            {"name": 5, "state": [], "lastState": {"terminated": "x"}, "restartCount": "3"},
        ],
        conditions="nope",
    )
    pod["metadata"]["labels"] = ["a"]
    pod["metadata"]["ownerReferences"] = {"kind": "x"}
    assert signals_from_pod(pod, SRC) == []


@pytest.mark.parametrize(
    ("refs", "expected"),
    [
        ([{"kind": "ReplicaSet", "name": "a", "controller": True}], ("ReplicaSet", "a")),
        (
            [{"kind": "X", "name": "b"}, {"kind": "StatefulSet", "name": "c", "controller": True}],
            ("StatefulSet", "c"),
        ),
        ([{"kind": "X", "name": "b"}], ("X", "b")),
        ([{"kind": "", "name": "b"}, "junk"], None),
        (None, None),
    ],
)
def test_owner_from_refs(refs: Any, expected: tuple[str, str] | None) -> None:
    assert owner_from_refs(refs) == expected


def _event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "metadata": {
            "name": "vllm.1",
            "namespace": "llm",
            "creationTimestamp": "2024-12-17T10:00:00Z",
        },
        "involvedObject": {
            "kind": "Pod",
            "namespace": "llm",
            "name": "vllm-llama-7d9f8b6c5d-x2kqz",
            "fieldPath": "spec.containers{vllm}",
            "labels": {"app": "vllm-llama"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": "vllm-llama-7d9f8b6c5d", "controller": True}
            ],
        },
        "reason": "BackOff",
        "message": "Back-off restarting failed container vllm in pod "
        "vllm-llama-7d9f8b6c5d-x2kqz_llm(1234)",
        "source": {"component": "kubelet", "host": "gpu-node-1"},
        "firstTimestamp": "2024-12-17T10:00:00Z",
        "lastTimestamp": "2024-12-17T10:04:00Z",
        "count": 5,
        "type": "Warning",
        "clusterName": "prod-a",
    }
    base.update(fields)
    return base


def test_backoff_event_from_the_exporter() -> None:
    (sig,) = signals_from_event(_event(), SRC)
    assert sig.kind is SignalKind.CRASH_LOOP
    assert sig.attrs == {"reason": "BackOff", "count": 5}
    assert sig.time == parse_iso8601("2024-12-17T10:04:00Z")
    assert (sig.namespace, sig.pod, sig.container, sig.node, sig.cluster) == (
        "llm",
        "vllm-llama-7d9f8b6c5d-x2kqz",
        "vllm",
        "gpu-node-1",
        "prod-a",
    )
    assert sig.owner == ("ReplicaSet", "vllm-llama-7d9f8b6c5d")
    assert sig.labels == {"app": "vllm-llama"}


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        (
            {"reason": "BackOff", "message": 'Back-off pulling image "vllm/vllm-openai:v0.6.3"'},
            None,
        ),
        (
            {
                "reason": "Killing",
                "message": "Container vllm failed liveness probe, will be restarted",
            },
            None,
        ),
        (
            {
                "reason": "Unhealthy",
                "message": 'Startup probe failed: Get "http://192.0.2.31:8000/hi"',
            },
            None,
        ),
        ({"reason": "Started", "message": "Started container vllm"}, None),
        ({"reason": "Pulled", "message": "Container image already present on machine"}, None),
        ({"reason": "Killing", "message": "Container vllm was OOMKilled"}, "host_oom"),
        (
            {
                "reason": "OOMKilling",
                "message": "Memory cgroup out of memory: Killed process 4242 "
                "(python3) total-vm:85GB, anon-rss:70GB",
            },
            "host_oom",
        ),
        ({"reason": "BackOff", "message": "Back-off restarting failed container"}, "crash_loop"),
        ({"reason": 7, "message": None}, None),
    ],
)
def test_event_table(fields: dict[str, Any], kind: str | None) -> None:
    signals = signals_from_event(_event(**fields), SRC)
    assert [s.kind.value for s in signals] == ([kind] if kind else [])


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"lastTimestamp": None}, "2024-12-17T10:00:00Z"),  # firstTimestamp
        (
            {"lastTimestamp": None, "firstTimestamp": None, "eventTime": "2024-12-17T10:01:00.5Z"},
            "2024-12-17T10:01:00.5Z",
        ),
        (
            {
                "lastTimestamp": None,
                "firstTimestamp": None,
                "series": {"count": 9, "lastObservedTime": "2024-12-17T10:09:00Z"},
            },
            "2024-12-17T10:09:00Z",
        ),
        ({"lastTimestamp": None, "firstTimestamp": None}, "2024-12-17T10:00:00Z"),  # creation
    ],
)
def test_event_time_fallbacks(fields: dict[str, Any], expected: str) -> None:
    (sig,) = signals_from_event(_event(**fields), SRC)
    assert sig.time == parse_iso8601(expected)


def test_event_series_count_and_events_k8s_io_shape() -> None:
    event = _event(count=None, series={"count": 9, "lastObservedTime": "2024-12-17T10:09:00Z"})
    assert signals_from_event(event, SRC)[0].attrs["count"] == 9
    new_api = {
        "regarding": event["involvedObject"],
        "reason": "BackOff",
        "note": event["message"],
        "eventTime": "2024-12-17T10:01:00Z",
        "deprecatedCount": 4,
    }
    (sig,) = signals_from_event(new_api, SRC)
    assert sig.attrs == {"reason": "BackOff", "count": 4}
    assert sig.pod == "vllm-llama-7d9f8b6c5d-x2kqz"


def test_event_without_any_time() -> None:
    event = _event(lastTimestamp=None, firstTimestamp=None, metadata={})
    with pytest.raises(ParseError) as err:
        signals_from_event(event, SRC)
    assert err.value.reason == "missing_field"
    assert signals_from_event(event, SRC, default_time=9.0)[0].time == 9.0
    bad = copy.deepcopy(event)
    bad["lastTimestamp"] = "last tuesday"
    with pytest.raises(ParseError):
        signals_from_event(bad, SRC)


# --- events.k8s.io/v1 and the event shippers' records -------------------------------------------


def _krane_event() -> dict[str, Any]:
    (row,) = [r for r in _rows("sources_k8s_events.jsonl") if "krane" in r["source"]]
    event: dict[str, Any] = copy.deepcopy(row["event"])
    return event


def test_events_k8s_io_deprecated_fields() -> None:
    """The real events.k8s.io item as a BackOff: time and count from the deprecated* fields."""
    event = _krane_event()
    event.update(reason="BackOff", note="Back-off restarting failed container vllm in pod pvc")
    (sig,) = signals_from_event(event, SRC)
    assert sig.kind is SignalKind.CRASH_LOOP
    assert sig.time == parse_iso8601("2020-01-17T04:41:48Z")  # deprecatedLastTimestamp
    assert sig.attrs == {"reason": "BackOff", "count": 25}  # deprecatedCount
    assert (sig.namespace, sig.pod, sig.container) == (
        "k8sdeploy-test-pvc-no-pv-cfe011ad17574fc0",  # from metadata: regarding has none
        "pvc",
        "vllm",
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "2020-01-17T04:41:48Z"),
        ({"series": {"count": 30, "lastObservedTime": "2020-01-17T04:50:00.000001Z"}},
         "2020-01-17T04:41:48Z"),  # deprecatedLastTimestamp is the core/v1 lastTimestamp
        ({"deprecatedLastTimestamp": None,
          "series": {"count": 30, "lastObservedTime": "2020-01-17T04:50:00.000001Z"}},
         "2020-01-17T04:50:00.000001Z"),
        ({"deprecatedLastTimestamp": None, "eventTime": "2020-01-17T04:45:00.123456Z"},
         "2020-01-17T04:45:00.123456Z"),
        ({"deprecatedLastTimestamp": None}, "2020-01-17T04:41:19Z"),  # deprecatedFirstTimestamp
    ],
)  # fmt: skip
def test_events_k8s_io_time_order(fields: dict[str, Any], expected: str) -> None:
    event = _krane_event()
    event.update(reason="BackOff", note="Back-off restarting failed container", **fields)
    (sig,) = signals_from_event(event, SRC)
    assert sig.time == parse_iso8601(expected)


@pytest.mark.parametrize(
    ("fields", "node"),
    [
        ({"deprecatedSource": {"component": "kubelet", "host": "gpu-node-1"}}, "gpu-node-1"),
        (
            {"reportingController": "kubelet", "reportingInstance": "gpu-node-2",
             "deprecatedSource": {}},
            "gpu-node-2",
        ),
        ({"reportingController": "default-scheduler", "reportingInstance": "x"}, None),
    ],
)  # fmt: skip
def test_events_k8s_io_node(fields: dict[str, Any], node: str | None) -> None:
    event = _krane_event()
    event.update(reason="BackOff", note="Back-off restarting failed container", **fields)
    assert signals_from_event(event, SRC)[0].node == node


CORPUS_K8S = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "k8s"


@pytest.mark.parametrize(
    ("name", "envelope", "identity"),
    [
        (  # OpenShift eventrouter: {"verb", "event"}
            "event_core_v1_openshift_eventrouter_envelope.jsonl",
            ("event",),
            {"pod": "redhat-operators-w8svm", "namespace": "openshift-marketplace",
             "container": "registry-server", "node": "master-0"},
        ),
        (  # OpenTelemetry stanza k8s_event_input: {"timestamp", "body"}; pretty-printed file
            "event_core_v1_otel_stanza_k8s_event_input.json",
            ("body",),
            {"pod": "stanza-g6rzd", "namespace": "default", "container": "stanza",
             "node": "kube-master-1"},
        ),
        (  # Fluent Bit kubernetes_events input: the Event plus "date"
            "events_fluentbit_kubernetes_events_input.jsonl",
            (),
            {"pod": None, "namespace": None, "node": "events-exporter-test-control-plane"},
        ),
        (  # kubernetes-event-exporter: enriched involvedObject, clusterName
            "kubernetes_event_exporter_stdout_sink.jsonl",
            (),
            {"pod": None, "namespace": "monitoring", "owner": ("Deployment", "event-exporter")},
        ),
    ],
)  # fmt: skip
def test_corpus_event_records(
    name: str, envelope: tuple[str, ...], identity: dict[str, Any]
) -> None:
    """Each shipper's record parses (Normal events: no signal); as a BackOff it names its pod."""
    path = CORPUS_K8S / name
    if not path.exists():
        pytest.skip("corpus not found")
    records = list(read_records([path]))
    for source, raw in records:
        assert parse_record(raw, source) == []
    record = json.loads(records[0][1])
    target = record
    for key in envelope:
        target = target[key]
    target.update(reason="BackOff", message="Back-off restarting failed container", count=2)
    (sig,) = parse_record(json.dumps(record), SRC)
    assert sig.kind is SignalKind.CRASH_LOOP and sig.attrs["count"] == 2
    for key, value in identity.items():
        assert getattr(sig, key) == value, key


# --- kubectl get pods -o json at real size ---------------------------------------------------


def _listed_pod(i: int) -> dict[str, Any]:
    """A vLLM pod as ``kubectl get pods -o json`` lists it (managedFields, env, volumes ...)."""
    name = f"vllm-llama-7d9f8b6c5d-{i:05d}"
    pod = _vllm_pod(
        phase="Running",
        startTime="2024-12-17T09:00:00Z",
        conditions=[
            {"type": t, "status": "True", "lastProbeTime": None,
             "lastTransitionTime": "2024-12-17T09:05:00Z"}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                      "PodScheduled")
        ],
        containerStatuses=[_cs(restartCount=0, ready=True, state={
            "running": {"startedAt": "2024-12-17T09:01:00Z"}},
            image="vllm/vllm-openai:v0.6.3", imageID="docker.io/vllm/vllm-openai@sha256:" + "a" * 9,
            containerID="containerd://" + f"{i:064x}", started=True)],
        podIP=f"10.244.{i // 250}.{i % 250}",
        hostIP="192.0.2.10",
        qosClass="Burstable",
    )  # fmt: skip
    pod["metadata"].update(
        name=name,
        uid=f"32283a8b-c42f-4552-90e0-{i:012d}",
        resourceVersion=str(1000 + i),
        creationTimestamp="2024-12-17T09:00:00Z",
        generateName="vllm-llama-7d9f8b6c5d-",
        annotations={"prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
        managedFields=[
            {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
             "time": "2024-12-17T09:00:00Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {},
                          "f:app": {}, "f:pod-template-hash": {}}},
                          "f:spec": {"f:containers": {'k:{"name":"vllm"}': {".": {}, "f:args": {},
                          "f:image": {}, "f:resources": {}}}}}},
            {"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
             "time": "2024-12-17T09:05:00Z", "fieldsType": "FieldsV1", "subresource": "status",
             "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {},
                          "f:podIP": {}, "f:startTime": {}}}},
        ],
    )  # fmt: skip
    pod["spec"].update(
        containers=[{
            "name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
            "args": ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "32768",
                     "--gpu-memory-utilization", "0.90", "--max-num-seqs", "256"],
            "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}},
                    {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}],
            "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
            "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "64Gi"},
                          "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}},
            "readinessProbe": {"httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"},
                               "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 1},
            "volumeMounts": [{"mountPath": "/root/.cache/huggingface", "name": "cache"},
                             {"mountPath": "/dev/shm", "name": "shm"}],
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
        volumes=[{"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}},
                 {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        restartPolicy="Always", schedulerName="default-scheduler", dnsPolicy="ClusterFirst",
        serviceAccountName="default", terminationGracePeriodSeconds=30,
    )  # fmt: skip
    return pod


def test_a_400_pod_list_is_not_too_large(tmp_path: Path) -> None:
    """``kubectl get pods -o json`` of 400 pods: one pretty-printed record over 1 MiB."""
    document = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}}
    document["items"] = [_listed_pod(i) for i in range(400)]
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(document, indent=4) + "\n")
    ((source, raw),) = list(read_records([path]))
    assert len(raw) > MAX_RECORD_BYTES
    signals = parse_record(raw, source)
    assert [s.kind for s in signals] == [SignalKind.POD_READY] * 400
    assert signals[399].pod == "vllm-llama-7d9f8b6c5d-00399"
    with pytest.raises(ParseError) as err:  # the same list on one line is a runaway record
        parse_record(json.dumps(document), source)
    assert err.value.reason == "too_large"


def test_documents_over_the_document_limit_are_too_large() -> None:
    raw = "{\n" + " " * MAX_DOCUMENT_BYTES + "}"
    with pytest.raises(ParseError) as err:
        parse_record(raw, SRC)
    assert err.value.reason == "too_large"
