"""The per-stream clock of the replay merge: wild timestamps vs genuine quiet gaps."""

from __future__ import annotations

import json

import pytest

from detector.events.model import SourcePos
from detector.pipeline import parse_stream

T0 = 1_741_942_800.0
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def record(t: float, line: str = OOM) -> bytes:
    kube = {"pod_name": "vllm-llama-7d9f8b6c5d-x2k4p", "namespace_name": "llm"}
    return json.dumps({"@timestamp": t, "log": line + "\n", "kubernetes": kube}).encode()


def run(times: list[float]) -> tuple[list[float], list[float]]:
    """Return (accepted signal times in yield order, rejected times)."""
    records = [(SourcePos("f", i + 1), record(T0 + t)) for i, t in enumerate(times)]
    accepted, rejected = [], []
    for parsed in parse_stream(records, max_time=T0 + 10**8):
        if parsed.error is not None:
            rejected.append(json.loads(parsed.raw)["@timestamp"] - T0)
        else:
            accepted += [s.time - T0 for s in parsed.signals]
    return accepted, rejected


@pytest.mark.parametrize(
    ("times", "accepted", "rejected"),
    [
        ([0, 5, 10], [0, 5, 10], []),
        ([0, 7200, 7205], [0, 7200, 7205], []),  # a quiet stream: nothing lost
        ([0, 5, 10**7, 10, 15], [0, 5, 10, 15], [10**7]),  # one broken clock mid-stream
        ([10**9, 0, 5], [0, 5], [10**9]),  # ... or on the first record: out of range
        ([0, -T0, 5], [0, 5], [-T0]),  # a 1970 timestamp: out of range, its neighbours kept
        ([0, 5, 3, 10], [0, 5, 3, 10], []),  # a late record is kept
        ([0, 5, 10**7], [0, 5, 10**7], []),  # the last record cannot be judged: kept
    ],
)
def test_stream_clock(times: list[float], accepted: list[float], rejected: list[float]) -> None:
    assert run(times) == (accepted, rejected)


def test_merge_keys_never_go_back() -> None:
    records = [(SourcePos("f", i), record(T0 + t)) for i, t in enumerate([0, 9, 4, 10**9, 12])]
    keys = [p.time for p in parse_stream(records)]
    assert keys == sorted(keys)
