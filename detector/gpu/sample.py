"""Sample GPU memory through NVML as ``nvidia-smi --query-gpu`` CSV lines.

The line shape is that of ``nvidia-smi --query-gpu=timestamp,index,uuid,memory.used,
memory.total --format=csv`` (``QUERY``), which ``detector.events.sources.nvidia_smi`` parses::

    2026/11/29 10:00:00.123, 0, GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e, 79000 MiB, 143771 MiB

optionally after a node-name field (``node-1, 2026/11/29 ...``), the prefix that parser reads as
the node, and optionally followed by ``namespace=NS, pod=POD`` fields naming the pod that owns
the GPU (``detector gpu-sample --namespace --pod``), which that parser reads as the line's pod
and nvidia-smi itself never prints. Memory is in whole MiB rounded up, as nvidia-smi prints
it: on an H200 (driver 580.159.04, ``bench/device/capture_gpu.py``) NVML's 102926.81 MiB
used and 40229.13 MiB free printed as 102927 and 40230 MiB. ``used`` is NVML's v2 value, which
excludes the driver's reserved memory, as nvidia-smi's does (0 MiB on an idle GPU). The time
is UTC: nvidia-smi prints the host's local time and the parser reads it as UTC, so UTC parses
right everywhere.
Source: https://docs.nvidia.com/deploy/nvidia-smi/index.html
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from detector.gpu.nvml import GpuReading, Nvml

MIB = 1024 * 1024
QUERY = "timestamp,index,uuid,memory.used,memory.total"
HEADER = "timestamp, index, uuid, memory.used [MiB], memory.total [MiB]"


def csv_line(
    reading: GpuReading,
    time_s: float,
    node: str | None = None,
    pod: tuple[str, str] | None = None,
) -> str:
    """Format one GPU reading taken at ``time_s`` (Unix seconds) as an nvidia-smi CSV line.

    ``pod`` (namespace, name) appends ``namespace=..., pod=...`` fields.
    """
    millis = round(time_s * 1000)
    stamp = datetime.fromtimestamp(millis // 1000, tz=UTC).strftime("%Y/%m/%d %H:%M:%S")
    line = (
        f"{stamp}.{millis % 1000:03d}, {reading.index}, {reading.uuid}, "
        f"{_mib_up(reading.used_bytes)} MiB, {_mib_up(reading.total_bytes)} MiB"
    )
    if pod is not None:
        line = f"{line}, namespace={pod[0]}, pod={pod[1]}"
    return f"{node}, {line}" if node else line


def _mib_up(size_bytes: int) -> int:
    return -(-size_bytes // MIB)


def sample_lines(
    nvml: Nvml,
    *,
    count: int | None,
    interval_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    node: str | None = None,
    pod: tuple[str, str] | None = None,
) -> Iterator[str]:
    """Yield one CSV line per GPU per sample: ``count`` samples (None: endless), spaced
    ``interval_s`` apart from the first; ``clock`` gives Unix seconds; ``pod`` (namespace,
    name) is the pod the lines name. Raises ``GpuError``.
    """
    started = clock()
    taken = 0
    while count is None or taken < count:
        if taken:
            sleep(max(0.0, started + taken * interval_s - clock()))
        now = clock()
        for reading in nvml.read_gpus():
            yield csv_line(reading, now, node, pod)
        taken += 1
