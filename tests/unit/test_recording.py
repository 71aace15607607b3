"""The recording generator: deterministic, real wire shapes, the cascade and its look-alikes."""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from detector.lab.recording import SCENARIOS, main, write_recording

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GPU_OOM = re.compile(r"out of memory|OutOfMemoryError|cudaErrorMemoryAllocation", re.IGNORECASE)
H100_MIB = 81559


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _count(paths: list[Path]) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in paths)


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _record_time(name: str, record: dict[str, Any]) -> float | None:
    """Return the event time a record carries, per stream file (Pods carry none of their own)."""
    if name in ("container-logs.jsonl", "lb-access.jsonl"):
        return float(record["@timestamp"])
    if name == "k8s-events.jsonl":
        return _epoch(record["lastTimestamp"])
    if name == "gpu-metrics.jsonl":
        return _epoch(record["timestamp"])
    return None


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("cascade")
    return {p.name: _records(p) for p in write_recording("cascade", out)}


def test_same_seed_gives_same_bytes_and_another_seed_differs(tmp_path: Path) -> None:
    for scenario in SCENARIOS:
        first = write_recording(scenario, tmp_path / "a" / scenario, seed=11)
        second = write_recording(scenario, tmp_path / "b" / scenario, seed=11)
        other = write_recording(scenario, tmp_path / "c" / scenario, seed=12)
        assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
        assert [p.read_bytes() for p in first] != [p.read_bytes() for p in other]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_record_is_a_json_object_in_time_order(scenario: str, tmp_path: Path) -> None:
    for path in write_recording(scenario, tmp_path):
        times = []
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            assert isinstance(record, dict)
            times.append(_record_time(path.name, record))
        assert times, path.name
        if times[0] is not None:
            assert times == sorted(times), path.name


def test_container_records_have_the_fluent_bit_kubernetes_shape(
    cascade: dict[str, list[dict[str, Any]]],
) -> None:
    keys = {
        "pod_name",
        "namespace_name",
        "pod_id",
        "labels",
        "host",
        "container_name",
        "docker_id",
        "container_hash",
        "container_image",
    }
    for record in cascade["container-logs.jsonl"] + cascade["lb-access.jsonl"]:
        assert record["log"].endswith("\n")
        assert record["stream"] in ("stdout", "stderr")
        assert record["time"].endswith("Z")
        assert keys <= set(record["kubernetes"])


def test_cascade_four_pods_of_one_deployment_die_of_gpu_oom_in_order(
    cascade: dict[str, list[dict[str, Any]]],
) -> None:
    first_oom: dict[str, float] = {}
    dead_after: dict[str, float] = {}
    for record in cascade["container-logs.jsonl"]:
        pod, text = record["kubernetes"]["pod_name"], record["log"]
        if "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in text:
            first_oom.setdefault(pod, record["@timestamp"])
        if "EngineDeadError" in text and pod in first_oom:
            dead_after.setdefault(pod, record["@timestamp"])
    assert len(first_oom) >= 4
    assert len({re.sub(r"-[^-]+$", "", pod) for pod in first_oom}) == 1  # one ReplicaSet
    assert all(pod.startswith("vllm-llama-") for pod in first_oom)
    times = sorted(first_oom.values())
    assert all(20.0 <= later - earlier <= 60.0 for earlier, later in itertools.pairwise(times))
    assert set(dead_after) == set(first_oom)


def test_cascade_memory_is_at_the_ceiling_only_before_each_death(
    cascade: dict[str, list[dict[str, Any]]],
) -> None:
    deaths = {
        r["kubernetes"]["pod_name"]: r["@timestamp"]
        for r in cascade["container-logs.jsonl"]
        if "EngineCore encountered a fatal error" in r["log"]
    }
    used: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for sample in cascade["gpu-metrics.jsonl"]:
        if sample["name"] == "DCGM_FI_DEV_FB_USED":
            used[sample["labels"]["pod"]].append(
                (_epoch(sample["timestamp"]), int(sample["value"]))
            )
    healthy_until = min(deaths.values()) - 40.0  # before the burst
    for pod, died in deaths.items():
        before = [mib for t, mib in used[pod] if t < died]
        assert before[-1] / H100_MIB >= 0.97  # the last scrape before the death
        healthy = [mib for t, mib in used[pod] if mib > 0 and t < healthy_until]
        assert 0.85 <= min(healthy[-5:]) / H100_MIB <= max(healthy) / H100_MIB <= 0.92


def test_cascade_5xx_rise_after_the_first_death_and_return_to_baseline(
    cascade: dict[str, list[dict[str, Any]]],
) -> None:
    first_death = min(
        r["@timestamp"] for r in cascade["container-logs.jsonl"] if "EngineDeadError" in r["log"]
    )
    status = re.compile(r'" (\d{3}) \d+ ".*\[llm-vllm-llama-8000\]')
    before, during, end = 0, 0, 0
    last = max(r["@timestamp"] for r in cascade["lb-access.jsonl"])
    for record in cascade["lb-access.jsonl"]:
        match = status.search(record["log"])
        if match and match.group(1) in ("502", "503", "504"):
            t = record["@timestamp"]
            before += t < first_death - 40  # healthy traffic, before the burst
            during += first_death <= t < first_death + 150
            end += t > last - 120
    assert before == 0 and end == 0 and during >= 100


def test_cascade_backoff_events_name_each_victim(
    cascade: dict[str, list[dict[str, Any]]],
) -> None:
    backoff = [e for e in cascade["k8s-events.jsonl"] if e["reason"] == "BackOff"]
    pods = {e["involvedObject"]["name"] for e in backoff}
    assert len(pods) == 4
    for event in backoff:
        ref = event["involvedObject"]
        assert event["type"] == "Warning" and ref["kind"] == "Pod"
        assert event["message"] == (
            f"Back-off restarting failed container vllm in pod {ref['name']}_llm({ref['uid']})"
        )
        assert ref["ownerReferences"][0]["kind"] == "ReplicaSet"


@pytest.mark.parametrize("scenario", ["host-oom", "upstream-5xx"])
def test_lookalikes_carry_no_gpu_oom_wording(scenario: str, tmp_path: Path) -> None:
    for path in write_recording(scenario, tmp_path):
        assert not GPU_OOM.search(path.read_text(encoding="utf-8")), path.name


def test_host_oom_pods_are_oomkilled_with_exit_137(tmp_path: Path) -> None:
    files = {p.name: _records(p) for p in write_recording("host-oom", tmp_path)}
    killed = [
        s["lastState"]["terminated"]
        for pod in files["k8s-pods.jsonl"]
        for s in pod["status"]["containerStatuses"]
        if "terminated" in s["lastState"]
    ]
    assert killed and all(t["reason"] == "OOMKilled" and t["exitCode"] == 137 for t in killed)
    assert any(e["reason"] == "BackOff" for e in files["k8s-events.jsonl"])
    assert any(
        "[batch-embedder-8080]" in r["log"] and '" 502 ' in r["log"]
        for r in files["lb-access.jsonl"]
    )


def test_upstream_5xx_has_no_crash_loop_and_flat_gpu_memory(tmp_path: Path) -> None:
    files = {p.name: _records(p) for p in write_recording("upstream-5xx", tmp_path)}
    assert not any(e["reason"] == "BackOff" for e in files["k8s-events.jsonl"])
    statuses = {
        m.group(1)
        for r in files["lb-access.jsonl"]
        if (m := re.search(r'" (5\d\d) \d+ ".*\[shop-reranker-8080\]', r["log"]))
    }
    assert statuses == {"502", "503", "504"}
    used = [
        int(s["value"])
        for s in files["gpu-metrics.jsonl"]
        if s["name"] == "DCGM_FI_DEV_FB_USED" and s["value"] != "0"
    ]
    assert max(used) - min(used) < 50


def test_scale_adds_healthy_noise(tmp_path: Path) -> None:
    small = write_recording("cascade", tmp_path / "1", scale=1)
    large = write_recording("cascade", tmp_path / "3", scale=3)
    assert _count(large) > 1.5 * _count(small)


def test_unknown_scenario_and_bad_scale_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        write_recording("nope", tmp_path)
    with pytest.raises(ValueError, match="scale"):
        write_recording("cascade", tmp_path, scale=0)


def test_committed_examples_are_up_to_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert "records" in capsys.readouterr().out
    for scenario in SCENARIOS:
        fresh = {p.name: p.read_bytes() for p in sorted((tmp_path / scenario).iterdir())}
        committed = {p.name: p.read_bytes() for p in sorted((EXAMPLES / scenario).glob("*.jsonl"))}
        assert fresh.keys() == committed.keys(), scenario
        stale = [name for name in fresh if fresh[name] != committed[name]]
        assert not stale, f"regenerate: python -m detector.lab.recording --out examples ({stale})"


def test_committed_examples_stay_small() -> None:
    total = sum(p.stat().st_size for p in EXAMPLES.glob("*/*.jsonl"))
    assert 0 < total < 4_000_000
