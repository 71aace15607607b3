"""One small adapter over NVML (``pynvml``, package nvidia-ml-py), and its fake.

Per GPU it reads the index, UUID, name, memory (used/total/free, bytes) and the compute
processes with their GPU memory. Nothing beyond ``pynvml`` and the standard library is
imported (``detector.errors`` is standard library only), so ``bench/device/capture_gpu.py``
can load it on a GPU machine without this project's dependencies.

Memory: ``nvmlDeviceGetMemoryInfo_v2`` (NVML >= R510) where the driver and the binding have it,
else v1. The two differ in ``used``: v1 counts the memory the driver and firmware reserve as
used; v2 reports it apart as ``reserved`` and its ``used`` excludes it, so on an idle GPU v1
shows a few hundred MiB used where v2 (and nvidia-smi's ``memory.used`` of recent drivers) shows
about zero; ``free`` is the same in both (total = reserved + used + free under v2).
Processes: ``nvmlDeviceGetComputeRunningProcesses``; ``None`` where NVML cannot list them
(``NVML_ERROR_NOT_SUPPORTED`` on some vGPU/MIG setups, ``NVML_ERROR_NOT_FOUND``,
``NVML_ERROR_NO_PERMISSION``, a binding newer than the driver); a process's ``used_bytes`` is
``None`` where NVML does not know it (MIG without privileges, some containers).
Sources: https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html ,
https://docs.nvidia.com/deploy/nvml-api/structnvmlMemory__v2__t.html
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pynvml

from detector.errors import DetectorError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Codes for which a device cannot list its compute processes; the reading still stands.
_NO_PROCESS_LIST = ("NOT_SUPPORTED", "NOT_FOUND", "NO_PERMISSION", "FUNCTION_NOT_FOUND")
# Codes for which the v2 memory call is missing: fall back to v1.
_NO_MEMORY_V2 = ("FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH", "NOT_SUPPORTED")


class _NeverRaised(Exception):
    """Stands in for ``pynvml.NVMLLibraryMismatchError`` in bindings without it."""


# Raised (not an NVMLError) when the binding calls a function newer than the driver's library.
_LIBRARY_MISMATCH: type[Exception] = getattr(pynvml, "NVMLLibraryMismatchError", _NeverRaised)


class GpuError(DetectorError):
    """NVML failed; ``reason`` is NVML's error name (``NVML_ERROR_LIBRARY_NOT_FOUND`` ...).

    Belongs to the tree in ``detector.errors`` (a subclass per package). It reads like NVML's
    own messages: ``detail (reason)``.
    """

    def __str__(self) -> str:
        """Return ``detail (reason)``, or the reason alone."""
        return f"{self.detail} ({self.reason})" if self.detail else self.reason


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One compute process on a GPU; ``used_bytes`` None where NVML does not know it."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's identity and memory at one moment; sizes in bytes.

    ``reserved_bytes`` is set by the v2 memory call only (``memory_api`` "v2" or "v1", see the
    module docstring); ``processes`` is None where NVML cannot list them.
    """

    index: int
    uuid: str
    name: str
    used_bytes: int
    total_bytes: int
    free_bytes: int
    reserved_bytes: int | None = None
    memory_api: str = "v2"
    processes: tuple[GpuProcess, ...] | None = ()


class Nvml(Protocol):
    """What the detector reads from NVML; ``PynvmlNvml`` is the real one, ``FakeNvml`` a fake."""

    def driver_version(self) -> str:
        """Return the driver's version string, e.g. ``580.159.03``."""
        ...

    def read_gpus(self) -> list[GpuReading]:
        """Read every GPU, in index order. Raises ``GpuError``."""
        ...

    def close(self) -> None:
        """Release NVML (``nvmlShutdown``)."""
        ...


def error_name(exc: BaseException) -> str:
    """Return NVML's name for an ``NVMLError`` (``NVML_ERROR_NOT_SUPPORTED``), else its class."""
    value = getattr(exc, "value", None)
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == value:
            return str(name)
    return type(exc).__name__


def _is(exc: BaseException, short_names: Sequence[str]) -> bool:
    return error_name(exc).removeprefix("NVML_ERROR_") in short_names


def _call(fn: Callable[..., T], *args: Any) -> T:
    """Call one pynvml function; NVML errors become ``GpuError`` with NVML's error name."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise GpuError(error_name(exc), str(exc)) from exc


def _text(value: str | bytes) -> str:
    """Old bindings return bytes, newer ones str."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def open_nvml() -> PynvmlNvml:
    """Initialise NVML and return the real adapter.

    Raises ``GpuError``: ``NVML_ERROR_LIBRARY_NOT_FOUND`` without the driver's libnvidia-ml,
    ``NVML_ERROR_DRIVER_NOT_LOADED`` without the kernel driver, ``NVML_ERROR_NO_PERMISSION``.
    """
    _call(pynvml.nvmlInit)
    return PynvmlNvml()


class PynvmlNvml:
    """The real NVML, through pynvml; make it with ``open_nvml()``."""

    def driver_version(self) -> str:
        """Return the driver's version string. Raises ``GpuError``."""
        return _text(_call(pynvml.nvmlSystemGetDriverVersion))

    def read_gpus(self) -> list[GpuReading]:
        """Read every GPU, in index order. Raises ``GpuError``."""
        return [self.read_gpu(index) for index in range(_call(pynvml.nvmlDeviceGetCount))]

    def read_gpu(self, index: int) -> GpuReading:
        """Read one GPU by its NVML index. Raises ``GpuError``."""
        handle = _call(pynvml.nvmlDeviceGetHandleByIndex, index)
        used, total, free, reserved, api = self.memory(handle)
        return GpuReading(
            index=index,
            uuid=_text(_call(pynvml.nvmlDeviceGetUUID, handle)),
            name=_text(_call(pynvml.nvmlDeviceGetName, handle)),
            used_bytes=used,
            total_bytes=total,
            free_bytes=free,
            reserved_bytes=reserved,
            memory_api=api,
            processes=self.processes(handle),
        )

    def memory(self, handle: Any, *, v2: bool = True) -> tuple[int, int, int, int | None, str]:
        """Return (used, total, free, reserved or None, "v2"/"v1") in bytes; v2 if it can."""
        version = getattr(pynvml, "nvmlMemory_v2", None)
        if v2 and version is not None:
            try:
                info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                return int(info.used), int(info.total), int(info.free), int(info.reserved), "v2"
            except TypeError:  # a binding without the version argument
                pass
            except pynvml.NVMLError as exc:
                if not _is(exc, _NO_MEMORY_V2):
                    raise GpuError(error_name(exc), str(exc)) from exc
        info = _call(pynvml.nvmlDeviceGetMemoryInfo, handle)
        return int(info.used), int(info.total), int(info.free), None, "v1"

    def processes(self, handle: Any) -> tuple[GpuProcess, ...] | None:
        """Return the compute processes and their GPU memory; None where NVML cannot tell."""
        try:
            found = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except (
            _LIBRARY_MISMATCH
        ) as exc:  # the binding asked for a newer function than the driver has
            log.debug("no process list reason=%s", type(exc).__name__)
            return None
        except pynvml.NVMLError as exc:
            if not _is(exc, _NO_PROCESS_LIST):
                raise GpuError(error_name(exc), str(exc)) from exc
            log.debug("no process list reason=%s", error_name(exc))
            return None
        return tuple(GpuProcess(int(p.pid), _process_bytes(p.usedGpuMemory)) for p in found)

    def close(self) -> None:
        """Release NVML. Raises ``GpuError``."""
        _call(pynvml.nvmlShutdown)


def _process_bytes(value: Any) -> int | None:
    """``usedGpuMemory``: None, or NVML_VALUE_NOT_AVAILABLE (2**64 - 1), means unknown."""
    if not isinstance(value, int) or value >= (1 << 64) - 1:
        return None
    return value


class FakeNvml:
    """An NVML for unit tests: each ``read_gpus()`` returns the next sample, the last repeats.

    ``error``, if given, is raised by ``read_gpus()`` (e.g. ``GpuError("NVML_ERROR_GPU_IS_LOST")``).
    """

    def __init__(
        self,
        *samples: Sequence[GpuReading],
        driver: str = "580.159.03",
        error: GpuError | None = None,
    ) -> None:
        self._samples = [list(sample) for sample in samples] or [[]]
        self._driver = driver
        self._error = error
        self.reads = 0
        self.closed = False

    def driver_version(self) -> str:
        """Return the fake driver version."""
        return self._driver

    def read_gpus(self) -> list[GpuReading]:
        """Return the next sample (the last one once they run out), or raise ``error``."""
        if self._error is not None:
            raise self._error
        sample = self._samples[min(self.reads, len(self._samples) - 1)]
        self.reads += 1
        return list(sample)

    def close(self) -> None:
        """Mark the fake closed."""
        self.closed = True
