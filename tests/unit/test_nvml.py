"""The NVML adapter (``detector.gpu.nvml``) over a patched pynvml, and its fake.

The numbers are an H200's (``fixtures/nvml_h200_readings.json``, captured by
``bench/device/capture_gpu.py``): NVML v2 reports 0 bytes used on the idle GPU and the driver's
615 MiB apart as reserved, where v1 counts them as used.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from detector.errors import DetectorError
from detector.gpu import nvml
from detector.gpu.nvml import FakeNvml, GpuError, GpuProcess, GpuReading, open_nvml

H200 = json.loads((Path(__file__).parent / "fixtures" / "nvml_h200_readings.json").read_text())
HOLDING = H200["holding"]["reading"]
V1 = H200["holding"]["v1_memory"]
UUID = HOLDING["uuid"]


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeLibrary:
    """The pynvml functions the adapter calls, answering with the H200's holding numbers."""

    def __init__(self) -> None:
        self.processes: Any = [SimpleNamespace(pid=449, usedGpuMemory=107917344768)]
        self.memory_v2: Any = None  # an exception to raise from the v2 call, if set
        self.shutdowns = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlSystemGetDriverVersion",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetComputeRunningProcesses",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.159.04"  # older bindings return bytes

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle-{index}"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return UUID

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: str, version: int | None = None) -> Any:
        if version is None:
            return SimpleNamespace(**V1)
        if self.memory_v2 is not None:
            raise self.memory_v2
        keys = ("used_bytes", "total_bytes", "free_bytes", "reserved_bytes")
        return SimpleNamespace(**{k.removesuffix("_bytes"): HOLDING[k] for k in keys})

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> Any:
        if isinstance(self.processes, BaseException):
            raise self.processes
        return self.processes


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch) -> FakeLibrary:
    fake = FakeLibrary()
    fake.install(monkeypatch)
    return fake


def test_reads_index_uuid_name_memory_and_processes(library: FakeLibrary) -> None:
    gpus = open_nvml()
    assert gpus.driver_version() == "580.159.04"
    (reading,) = gpus.read_gpus()
    assert reading == GpuReading(
        index=0,
        uuid=UUID,
        name="NVIDIA H200",
        used_bytes=107926585344,
        total_bytes=150754820096,
        free_bytes=42183294976,
        reserved_bytes=644939776,
        memory_api="v2",
        processes=(GpuProcess(449, 107917344768),),
    )
    assert reading.reserved_bytes is not None
    assert reading.used_bytes + reading.reserved_bytes + reading.free_bytes == reading.total_bytes
    gpus.close()
    assert library.shutdowns == 1


@pytest.mark.parametrize(
    "failure",
    [
        _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),  # a driver before R510
        _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        TypeError("nvmlDeviceGetMemoryInfo() got an unexpected keyword argument 'version'"),
    ],
    ids=["function_not_found", "version_mismatch", "old_binding"],
)
def test_falls_back_to_v1_memory(library: FakeLibrary, failure: BaseException) -> None:
    library.memory_v2 = failure
    (reading,) = open_nvml().read_gpus()
    assert (reading.memory_api, reading.reserved_bytes) == ("v1", None)
    assert reading.used_bytes == V1["used"] == HOLDING["used_bytes"] + HOLDING["reserved_bytes"]


def test_a_memory_error_other_than_a_missing_v2_is_raised(library: FakeLibrary) -> None:
    library.memory_v2 = _error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(GpuError) as err:
        open_nvml().read_gpus()
    assert err.value.reason == "NVML_ERROR_GPU_IS_LOST"
    assert isinstance(err.value, DetectorError) and "GPU is lost" in str(err.value)


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,  # vGPU, some MIG setups
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    ],
)
def test_processes_nvml_cannot_list_are_unknown(library: FakeLibrary, code: int) -> None:
    library.processes = _error(code)
    (reading,) = open_nvml().read_gpus()
    assert reading.processes is None and reading.used_bytes == HOLDING["used_bytes"]


def test_a_binding_newer_than_the_driver_gives_no_process_list(library: FakeLibrary) -> None:
    library.processes = pynvml.NVMLLibraryMismatchError("Unversioned function called ...")
    (reading,) = open_nvml().read_gpus()
    assert reading.processes is None


def test_a_process_list_error_of_another_kind_is_raised(library: FakeLibrary) -> None:
    library.processes = _error(pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(GpuError, match="NVML_ERROR_UNKNOWN"):
        open_nvml().read_gpus()


def test_process_memory_nvml_does_not_know_is_none(library: FakeLibrary) -> None:
    library.processes = [
        SimpleNamespace(pid=7, usedGpuMemory=None),  # pynvml's mapping of "not available"
        SimpleNamespace(pid=8, usedGpuMemory=(1 << 64) - 1),  # NVML_VALUE_NOT_AVAILABLE raw
        SimpleNamespace(pid=9, usedGpuMemory=0),
    ]
    (reading,) = open_nvml().read_gpus()
    assert reading.processes == (GpuProcess(7, None), GpuProcess(8, None), GpuProcess(9, 0))


def test_init_errors_carry_the_nvml_error_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def init() -> None:
        raise _error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    with pytest.raises(GpuError) as err:
        open_nvml()
    assert (err.value.reason, err.value.detail) == (
        "NVML_ERROR_DRIVER_NOT_LOADED",
        "Driver Not Loaded",
    )
    assert str(err.value) == "Driver Not Loaded (NVML_ERROR_DRIVER_NOT_LOADED)"


def test_the_real_library() -> None:
    """Here (no driver): NVML Shared Library Not Found; on a GPU machine: real readings."""
    try:
        gpus = open_nvml()
    except GpuError as exc:
        assert exc.reason in ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")
        assert isinstance(exc.__cause__, pynvml.NVMLError)
        return
    try:
        for reading in gpus.read_gpus():
            assert 0 <= reading.used_bytes <= reading.total_bytes and reading.uuid
    finally:
        gpus.close()


def test_error_name_of_something_else() -> None:
    assert nvml.error_name(ValueError("x")) == "ValueError"


def test_fake_returns_samples_in_turn_then_repeats_the_last() -> None:
    first = GpuReading(0, UUID, "NVIDIA H200", 0, 150754820096, 150109880320)
    second = GpuReading(0, UUID, "NVIDIA H200", 107926585344, 150754820096, 42183294976)
    fake = FakeNvml([first], [second])
    assert [fake.read_gpus(), fake.read_gpus(), fake.read_gpus()] == [[first], [second], [second]]
    assert fake.driver_version() == "580.159.03"
    fake.close()
    assert fake.closed


def test_fake_raises_its_error() -> None:
    fake = FakeNvml(error=GpuError("NVML_ERROR_GPU_IS_LOST", "GPU is lost"))
    with pytest.raises(GpuError, match="GPU is lost"):
        fake.read_gpus()
