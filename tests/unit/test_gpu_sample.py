"""``detector gpu-sample``: NVML readings as nvidia-smi ``--query-gpu`` CSV lines.

The round trip: the H200's NVML bytes (``fixtures/nvml_h200_readings.json``) formatted by
``detector.gpu.sample`` parse, through the pipeline's parser, into the same GPU_MEMORY signal
as the real nvidia-smi line captured at the same moment.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
from typer.testing import CliRunner

from detector.cli import gpu as gpu_cli
from detector.cli.main import app
from detector.events.detect import parse_record
from detector.events.model import SignalKind, SourcePos
from detector.events.sources.timeparse import parse_iso8601
from detector.gpu import nvml
from detector.gpu.nvml import FakeNvml, GpuError, GpuReading
from detector.gpu.sample import csv_line, sample_lines

H200 = json.loads((Path(__file__).parent / "fixtures" / "nvml_h200_readings.json").read_text())
SRC = SourcePos("gpu-metrics", 0, partition=0)
T = parse_iso8601("2026-11-29T19:07:31.673Z")  # the holding nvidia-smi line's time
MIB = 1 << 20
LINE = re.compile(
    r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}, \d+, (?:GPU|MIG)-[\w/-]+, \d+ MiB, \d+ MiB"
)  # the shape nvidia-smi --query-gpu=timestamp,index,uuid,memory.used,memory.total prints


def _reading(state: str) -> GpuReading:
    raw: dict[str, Any] = dict(H200[state]["reading"])
    raw["processes"] = tuple(nvml.GpuProcess(pid, used) for pid, used in raw["processes"])
    return GpuReading(**raw)


@pytest.mark.parametrize("state", ["idle", "holding"])
def test_round_trip_matches_the_real_nvidia_smi_line(state: str) -> None:
    real = H200[state]["nvidia_smi_line"]
    ours = csv_line(_reading(state), T)
    assert LINE.fullmatch(ours) and LINE.fullmatch(real)
    assert ours.split(", ")[1:] == real.split(", ")[1:]  # all but the time, to the MiB
    (mine,) = parse_record(ours, SRC)
    (theirs,) = parse_record(real, SRC)
    assert mine.kind is theirs.kind is SignalKind.GPU_MEMORY
    assert mine.attrs == theirs.attrs
    assert mine.attrs["uuid"] == H200[state]["reading"]["uuid"] and mine.attrs["gpu"] == "0"
    assert mine.time == T and mine.node is None


def test_memory_is_rounded_up_to_whole_mib_as_nvidia_smi_prints_it() -> None:
    reading = _reading("holding")
    assert reading.used_bytes / MIB == 102926.8125
    assert csv_line(reading, T).endswith(", 102927 MiB, 143771 MiB")
    exact = GpuReading(0, "GPU-x", "x", 2 * MIB, 4 * MIB, 2 * MIB)
    assert csv_line(exact, T).endswith(", 2 MiB, 4 MiB")


def test_time_is_utc_with_milliseconds() -> None:
    reading = _reading("idle")
    assert csv_line(reading, T).startswith("2026/11/29 19:07:31.673, ")
    assert csv_line(reading, 0.9996).startswith("1970/01/01 00:00:01.000, ")


def test_the_node_prefix_is_read_as_the_node() -> None:
    line = csv_line(_reading("holding"), T, node="gpu-node-7")
    assert line.startswith("gpu-node-7, 2026/11/29 19:07:31.673, 0, GPU-")
    (sig,) = parse_record(line, SRC)
    assert sig.node == "gpu-node-7" and sig.attrs["used_bytes"] == 102927 * MIB


def test_samples_are_spaced_from_the_first() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        now[0] += seconds

    def clock() -> float:
        now[0] += 0.25  # each read of the clock costs a quarter second
        return now[0]

    two = [_reading("idle"), GpuReading(1, "GPU-b", "NVIDIA H200", MIB, 2 * MIB, MIB)]
    lines = list(sample_lines(FakeNvml(two), count=3, interval_s=5.0, clock=clock, sleep=sleep))
    assert len(lines) == 6 and [line.split(", ")[1] for line in lines] == ["0", "1"] * 3
    assert slept == [4.5, 4.5]  # 5 s apart, less the time the reads took


def test_endless_sampling_stops_when_the_reader_stops() -> None:
    lines = sample_lines(FakeNvml([_reading("idle")]), count=None, interval_s=0.0,
                         clock=lambda: T, sleep=lambda _: None)  # fmt: skip
    assert [next(lines) for _ in range(50)][-1].startswith("2026/11/29 19:07:31.673, 0, GPU-")


def _cli(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, *args: str) -> Any:
    monkeypatch.setattr(gpu_cli, "open_nvml", lambda: fake)
    monkeypatch.setattr(gpu_cli.time, "sleep", lambda _: None)
    return CliRunner().invoke(app, ["gpu-sample", *args])


def test_cli_prints_one_line_per_gpu_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([_reading("idle")], [_reading("holding")])
    result = _cli(monkeypatch, fake, "--count", "2", "--interval", "0.5", "--node", "h200-1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split(", ")[4] for line in lines] == ["0 MiB", "102927 MiB"]
    assert all(line.startswith("h200-1, ") for line in lines) and fake.closed
    signals = [s for line in lines for s in parse_record(line, SRC)]
    assert [s.attrs["used_bytes"] for s in signals] == [0, 102927 * MIB]


def test_cli_takes_one_sample_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _cli(monkeypatch, FakeNvml([_reading("idle")]))
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 1


def test_cli_rejects_a_node_the_parser_would_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for node in ("Node_1", "123", "-a"):
        result = _cli(monkeypatch, FakeNvml(), "--node", node)
        assert result.exit_code == 2 and "not a lower-case host name" in result.stderr


def _no_library() -> nvml.PynvmlNvml:
    def init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    return nvml._call(init)  # type: ignore[return-value]


def test_cli_without_a_driver_exits_2_with_nvml_s_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_cli, "open_nvml", _no_library)
    result = CliRunner().invoke(app, ["gpu-sample"])
    assert result.exit_code == 2 and result.stdout == ""
    assert "NVML Shared Library Not Found (NVML_ERROR_LIBRARY_NOT_FOUND)" in result.stderr
    assert "Traceback" not in result.stderr and isinstance(result.exception, SystemExit)


def test_cli_reports_an_nvml_error_while_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(error=GpuError("NVML_ERROR_GPU_IS_LOST", "GPU is lost"))
    result = _cli(monkeypatch, fake, "--count", "3")
    assert result.exit_code == 2 and "GPU is lost (NVML_ERROR_GPU_IS_LOST)" in result.stderr
    assert fake.closed


def test_real_command_without_a_driver() -> None:
    """The real process here, no GPU: exit 2, one clear line, no traceback."""
    try:
        nvml.open_nvml().close()
        pytest.skip("an NVIDIA driver is reachable here")
    except GpuError:
        pass
    cmd = [sys.executable, "-m", "detector", "gpu-sample", "--count", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "NVML Shared Library Not Found" in proc.stderr and "Traceback" not in proc.stderr
