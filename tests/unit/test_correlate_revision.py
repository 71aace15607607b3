"""A pod's workload revised after its evidence was given (issue 11, item 6): its state and an
incident made only of its evidence follow it to the workload its owner names.

The OOM text is the torch error of a published vLLM report
(https://github.com/vllm-project/vllm/issues/15039, in ``fixtures/oom_public.jsonl``), cut
to its first sentences; it arrives in a Fluent Bit record that names only the pod, so the
first workload comes from the pod name; the pod object (``kubectl get pod -o json`` shape)
names the LeaderWorkerSet later.
"""

from __future__ import annotations

import json
from typing import Any

from detector.config import CorrelateSettings
from detector.correlate.correlator import Correlator
from detector.correlate.identity import WorkloadRef
from detector.correlate.state import (
    Decision,
    IncidentOpened,
    Stage,
    StageChanged,
    VictimAdded,
)
from detector.events.detect import parse_record
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.k8s_pod import signals_from_pod
from detector.events.sources.timeparse import parse_time

SRC = SourcePos("t", 1)
OOM_TEXT = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a "
    "total capacity of 79.33 GiB of which 16.00 MiB is free. Process 36891 has 79.29 GiB "
    "memory in use."
)
LWS = {"leaderworkerset.sigs.k8s.io/name": "vllm-lws"}
WORKER = "vllm-lws-0-1"  # by its name alone: StatefulSet vllm-lws-0
BY_NAME = WorkloadRef("llm", "vllm-lws-0", "StatefulSet")
BY_LWS = WorkloadRef("llm", "vllm-lws", "LeaderWorkerSet")
T0 = parse_time("2024-06-21T01:00:00Z")


def _oom(pod: str, time: float, labels: dict[str, str] | None = None) -> Signal:
    k8s: dict[str, Any] = {"namespace_name": "llm", "pod_name": pod, "container_name": "vllm"}
    if labels:
        k8s["labels"] = labels
    record = {"@timestamp": time, "log": OOM_TEXT + "\n", "kubernetes": k8s}
    (sig,) = parse_record(json.dumps(record), SRC)
    assert sig.kind is SignalKind.GPU_OOM and not sig.attrs.get("ambiguous")
    return sig


def _worker_pod(ready_at: float) -> Signal:
    """The worker's pod object: LWS label, owned by the group's StatefulSet, Ready."""
    stamp = "2024-06-21T01:00:20Z"
    assert parse_time(stamp) == ready_at
    obj = {
        "kind": "Pod",
        "metadata": {
            "name": WORKER,
            "namespace": "llm",
            "labels": LWS,
            "ownerReferences": [{"kind": "StatefulSet", "name": "vllm-lws-0", "controller": True}],
        },
        "spec": {"nodeName": "gpu-1"},
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "startTime": "2024-06-21T00:50:00Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}],
            "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 1}],
        },
    }
    (sig,) = [s for s in signals_from_pod(obj, SRC) if s.kind is SignalKind.POD_READY]
    return sig


def _run() -> tuple[Correlator, list[Decision]]:
    corr = Correlator(CorrelateSettings())
    out = corr.observe(_oom(WORKER, T0))
    out += corr.observe(_worker_pod(T0 + 20))
    out += corr.observe(_oom("vllm-lws-1-1", T0 + 60, LWS))
    return corr, out


def test_first_seen_by_name_then_revised_by_its_pod_object() -> None:
    corr, out = _run()
    opened = [d for d in out if isinstance(d, IncidentOpened)]
    assert [d.workload for d in opened] == [BY_NAME, BY_LWS]
    old_key, new_key = opened[0].key, opened[1].key
    # the old workload's incident is resolved with a note naming the new one
    (closed,) = [d for d in out if isinstance(d, StageChanged) and d.stage is Stage.RESOLVED]
    assert closed.key == old_key and BY_LWS.label in closed.reason
    # one incident for the LWS, both victims in order of death, cascading
    victims = [(d.pod, d.time, d.position) for d in out if isinstance(d, VictimAdded)]
    assert victims == [
        (WORKER, T0, 1),  # under the old workload
        (WORKER, T0, 1),
        ("vllm-lws-1-1", T0 + 60, 2),
    ]
    new_stages = [d.stage for d in out if isinstance(d, StageChanged) and d.key == new_key]
    assert new_stages == [Stage.SUSPECTED, Stage.CASCADING]
    assert corr.open_incidents == 1
    ctx = corr.context(new_key)
    assert ctx is not None and (ctx.workload, ctx.victims) == ("vllm-lws", (WORKER, "vllm-lws-1-1"))
    assert corr.context(old_key) is not None  # the resolved one keeps its view


def test_pod_state_moves_with_the_pod() -> None:
    corr, _ = _run()
    old, new = corr.workloads.get(BY_NAME), corr.workloads[BY_LWS]
    assert old is None or (WORKER not in old.pods and WORKER not in old.last_oom)
    assert old is None or old.incident is None
    assert list(new.pods) == [WORKER, "vllm-lws-1-1"]
    assert new.last_oom == {WORKER: T0, "vllm-lws-1-1": T0 + 60}
    assert new.incident is not None and list(new.incident.victims) == [WORKER, "vllm-lws-1-1"]


def test_an_incident_with_other_victims_keeps_them() -> None:
    """The old workload's incident names another pod too: it stays open, as recorded."""
    corr = Correlator(CorrelateSettings())
    corr.observe(_oom(WORKER, T0))
    corr.observe(_oom("vllm-lws-0-2", T0 + 5))  # same StatefulSet by name
    out = corr.observe(_worker_pod(T0 + 20))
    assert not [d for d in out if isinstance(d, StageChanged)]
    old = corr.workloads[BY_NAME]
    assert old.incident is not None and list(old.incident.victims) == [WORKER, "vllm-lws-0-2"]
    assert WORKER not in old.pods and WORKER in corr.workloads[BY_LWS].last_oom
