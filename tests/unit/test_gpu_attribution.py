"""GPU memory and pasted pod tables tied to their pod (issue 11, item 4).

``detector gpu-sample --namespace NS --pod POD`` appends ``namespace=NS, pod=POD`` fields to
its nvidia-smi CSV lines; ``detector replay --namespace NS --pod POD`` (a ``LogIdentity``)
attributes plain nvidia-smi output and gives a ``kubectl get pods`` table without a NAMESPACE
column its namespace. The nvidia-smi lines are the H200 captures in ``fixtures/`` (driver
580.159.04, ``bench/device/capture_gpu.py``); the table is ``kubectl get pods`` output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from detector.cli import gpu as gpu_cli
from detector.cli.main import app
from detector.events.detect import LogIdentity, parse_record
from detector.events.model import SignalKind, SourcePos
from detector.events.sources.nvidia_smi import signals_from_csv_line
from detector.gpu import nvml
from detector.gpu.nvml import FakeNvml, GpuReading
from detector.gpu.sample import csv_line

FIXTURES = Path(__file__).parent / "fixtures"
H200 = json.loads((FIXTURES / "nvml_h200_readings.json").read_text())
QUERY_CSV = (FIXTURES / "nvidia_smi_h200_query_holding.csv").read_text().splitlines()
TABLE = (FIXTURES / "nvidia_smi_h200_table_holding.txt").read_text()
SRC = SourcePos("gpu-metrics.csv", 2)
POD = LogIdentity(namespace="llm", pod="vllm-7d9f8b6c5-abcde")
GET_PODS = (
    "NAME                   READY   STATUS             RESTARTS      AGE\n"
    "vllm-7d9f8b6c5-abcde   0/1     CrashLoopBackOff   5 (30s ago)   10m\n"
)


def _reading(state: str) -> GpuReading:
    raw: dict[str, Any] = dict(H200[state]["reading"])
    raw["processes"] = tuple(nvml.GpuProcess(pid, used) for pid, used in raw["processes"])
    return GpuReading(**raw)


def test_gpu_sample_lines_name_their_pod_and_parse_like_nvidia_smi() -> None:
    real = QUERY_CSV[1]
    ours = csv_line(_reading("holding"), 1_795_000_000.0, "h200-1", ("llm", "vllm-0"))
    assert ours.endswith(", 102927 MiB, 143771 MiB, namespace=llm, pod=vllm-0")
    (mine,) = parse_record(ours, SRC)
    (theirs,) = parse_record(real, SRC)
    assert (mine.namespace, mine.pod, mine.node) == ("llm", "vllm-0", "h200-1")
    assert mine.attrs == theirs.attrs
    assert (theirs.namespace, theirs.pod) == (None, None)


def test_labels_work_with_nounits_and_with_a_header_naming_them() -> None:
    line = "2026/11/29 19:07:31.673, 0, GPU-b3f3a64e-498b-373b-e74c-8126d3a663b4, 102927, 143771"
    (sig,) = parse_record(f"{line}, namespace=llm, pod=vllm-0", SRC)
    assert sig.attrs["used_bytes"] == 102927 << 20 and sig.attrs["total_bytes"] == 143771 << 20
    assert (sig.namespace, sig.pod) == ("llm", "vllm-0")
    header = "timestamp, index, uuid, memory.used [MiB], memory.total [MiB], namespace, pod"
    assert parse_record(header, SRC) == []


def test_plain_nvidia_smi_csv_takes_the_replay_identity() -> None:
    for line in QUERY_CSV[1:]:
        (sig,) = parse_record(line, SRC, identity=POD)
        assert sig.kind is SignalKind.GPU_MEMORY
        assert (sig.namespace, sig.pod) == ("llm", "vllm-7d9f8b6c5-abcde")
    assert parse_record(QUERY_CSV[0], SRC, identity=POD) == []  # the header stays silent


def test_a_namespace_alone_names_no_gpu_pod() -> None:
    (sig,) = parse_record(QUERY_CSV[1], SRC, identity=LogIdentity(namespace="llm", pod=None))
    assert (sig.namespace, sig.pod) == (None, None)


def test_the_line_s_own_pod_wins_and_half_a_pod_names_none() -> None:
    line = QUERY_CSV[1]
    (own,) = parse_record(f"{line}, namespace=ml, pod=tgi-0", SRC, identity=POD)
    assert (own.namespace, own.pod) == ("ml", "tgi-0")
    half = signals_from_csv_line(f"{line}, pod=tgi-0", SRC, namespace="llm", pod="vllm-0")
    assert half is not None and (half[0].namespace, half[0].pod) == (None, None)


@pytest.mark.parametrize("field", ["namespace=LLM", "pod=", "namespace=llm=x", "owner=llm"])
def test_other_key_value_fields_are_not_labels(field: str) -> None:
    signals = signals_from_csv_line(f"{QUERY_CSV[1]}, {field}, pod=vllm-0", SRC)
    assert signals is not None
    assert (signals[0].namespace, signals[0].pod) == (None, None)


def test_nvidia_smi_table_takes_the_replay_identity() -> None:
    (sig,) = parse_record(TABLE, SourcePos("nvidia-smi.txt", 1), identity=POD)
    assert sig.attrs["used_bytes"] == 102927 << 20
    assert (sig.namespace, sig.pod) == ("llm", "vllm-7d9f8b6c5-abcde")
    (bare,) = parse_record(TABLE, SourcePos("nvidia-smi.txt", 1))
    assert (bare.namespace, bare.pod) == (None, None)


def test_get_pods_table_without_namespace_column_takes_the_replay_namespace() -> None:
    identity = LogIdentity(namespace="llm", pod=None)
    (sig,) = parse_record(
        GET_PODS, SourcePos("get-pods.txt", 1), default_time=1e9, identity=identity
    )
    assert sig.kind is SignalKind.CRASH_LOOP
    assert (sig.namespace, sig.pod) == ("llm", "vllm-7d9f8b6c5-abcde")
    (bare,) = parse_record(GET_PODS, SourcePos("get-pods.txt", 1), default_time=1e9)
    assert bare.namespace is None


def test_a_namespace_column_wins_over_the_replay_namespace() -> None:
    table = (
        "NAMESPACE   NAME                   READY   STATUS             RESTARTS      AGE\n"
        "ml          vllm-7d9f8b6c5-abcde   0/1     CrashLoopBackOff   5 (30s ago)   10m\n"
    )
    identity = LogIdentity(namespace="llm", pod=None)
    (sig,) = parse_record(table, SourcePos("get-pods.txt", 1), default_time=1e9, identity=identity)
    assert sig.namespace == "ml"


def _cli(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, *args: str) -> Any:
    monkeypatch.setattr(gpu_cli, "open_nvml", lambda: fake)
    return CliRunner().invoke(app, ["gpu-sample", *args])


def test_cli_appends_the_pod_to_every_line(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([_reading("holding")])
    result = _cli(monkeypatch, fake, "--namespace", "llm", "--pod", "vllm-0")
    assert result.exit_code == 0, result.output
    (line,) = result.output.splitlines()
    assert line.endswith(", namespace=llm, pod=vllm-0")
    (sig,) = parse_record(line, SRC)
    assert (sig.namespace, sig.pod) == ("llm", "vllm-0")


@pytest.mark.parametrize(
    "args",
    [
        ["--namespace", "llm"],
        ["--pod", "vllm-0"],
        ["--namespace", "LLM", "--pod", "vllm-0"],
        ["--namespace", "llm", "--pod", "vllm_0"],
    ],
)
def test_cli_rejects_half_a_pod_or_bad_names(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    result = _cli(monkeypatch, FakeNvml([_reading("holding")]), *args)
    assert result.exit_code == 2
