"""Device-memory exhaustion by its shape, whatever the vendor: phrases, device evidence, family.

The general rule of ``detector.events.classify`` calls a line a GPU/accelerator OOM when it
carries an allocation-failure phrase (``ALLOC_FAILED``, ``ALLOC_FAILED_RE``, or an
out-of-memory phrase) together with evidence that the memory is an accelerator's
(``device_evidence``: device/DRAM/HBM/VRAM/pool words, a device index, or the API or
runtime of any accelerator vendor), and no host look-alike (``HOST_VETO``). The evidence also
names the accelerator family (``accelerator_of``) and a GPU-sharing layer that enforces its own
memory quota below the device's (``sharing_layer_of``). Wordings and their sources:

- Intel Gaudi ("FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::N"):
  https://github.com/huggingface/optimum-habana/issues/1469
- Huawei Ascend CANN ("EL0004 ... Failed to allocate memory", "Failed to allocate
  resource[DeviceMemory] ... Memory resources are exhausted"):
  https://github.com/vllm-project/vllm-ascend/issues/3141
- Tenstorrent tt-metal ("TT_FATAL: Out of Memory: Not enough space to allocate N B DRAM buffer
  across 12 banks"): https://github.com/tenstorrent/tt-xla/issues/4130
- HAMi-core, the vGPU interposer of Project-HAMi ("[HAMI-core ERROR (...allocator.c:53)]: Device
  0 OOM USED / LIMIT", its predecessor "[4pdvGPU ERROR ...]: device OOM encountered"):
  https://github.com/Project-HAMi/HAMi/issues/662, https://github.com/Project-HAMi/HAMi/issues/43
- Vulkan ("vk::Device::allocateMemory: ErrorOutOfDeviceMemory", "VK_ERROR_OUT_OF_DEVICE_MEMORY"):
  https://github.com/ggml-org/llama.cpp/issues/15256, https://github.com/mlc-ai/mlc-llm/issues/974
- SYCL / Level Zero / Unified Runtime ("[UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY]"):
  https://github.com/ggml-org/llama.cpp/issues/25286
- Metal (ggml "failed to allocate Metal buffer of size N"):
  https://github.com/BodhiSearch/BodhiApp/issues/4
- DirectML (TensorFlow-DirectML "OOM when allocating tensor ... device:DML:0"):
  https://github.com/microsoft/DirectML/issues/34
- OpenCL ("CL_MEM_OBJECT_ALLOCATION_FAILURE"): https://github.com/PRiME-project/PRiMEStereoMatch/issues/1
- Host look-alikes: Ray's memory monitor ("Task was killed due to the node running low on
  memory", https://github.com/real-stanford/flingbot/issues/11), pinned host memory
  (https://github.com/Accenture/AIR/issues/7), the CUDA compiler's own host memory ("ptxas fatal
  : Memory allocation failure", https://github.com/microsoft/onnxruntime/issues/25377).
"""

from __future__ import annotations

import re
from typing import Final

_I = re.IGNORECASE

# Allocation-failure phrases beyond "out of memory", as lower-case substrings (a plain scan is
# cheaper than a case-blind regex) grouped under a token every phrase of the group contains,
# so a line without the token skips the group; then the phrases that need a gap ("allocation
# of size N failed", "allocate device memory failed", or an API's name: "cuMemoryAllocate
# failed").
ALLOC_FAILED: Final = (
    (
        "alloc",
        (
            "alloc failed",
            "allocation failed",
            "alloc_failed",
            "allocation_failed",
            "allocation failure",
            "allocation_failure",
            "bad_alloc",
            "badalloc",
            "could not be allocated",
            "cannot allocate",
            "can't allocate",
            "failed to allocate",
            "unable to allocate",
            "error allocating",
            "not enough space to allocate",
        ),
    ),
    (
        "memory",
        (
            "insufficient memory",
            "insufficient gpu memory",
            "insufficient device memory",
            "out_of_device_memory",
            "outofdevicememory",
        ),
    ),
    ("exhausted", ("resources are exhausted", "resource_exhausted", "resource exhausted")),
    ("pool", ("maximum pool size exceeded",)),
)
ALLOC_FAILED_RE: Final = re.compile(r"allocat\w*(?: [\w ]{1,40}?)? failed\b", _I)

# Accelerator families, most specific first: (family, needles, pattern). ``needles`` are
# lower-case substrings of which every match contains one (the cheap check before the regex);
# the first family that matches names the line's. "GPU" alone names none (any vendor's).
Family = tuple[str, tuple[str, ...], re.Pattern[str]]
FAMILIES: Final[tuple[Family, ...]] = (
    (
        "tenstorrent",
        ("tt_", "tt-metal", "ttnn", "tenstorrent"),
        re.compile(r"\bTT_(?:FATAL|THROW)\b|tt[-_]metal|\bttnn\b|tenstorrent", _I),
    ),
    (
        "hpu",
        ("hpu", "habana", "gaudi", "synstatus", "pt_devmem", "hl-smi"),
        re.compile(r"\bHPU\b|habana|gaudi|\bsynStatus|PT_DEVMEM|\bhl-smi", _I),
    ),
    (
        "npu",
        ("npu", "ascend", "acl", "cann", "el0004", "hccl", "devicememory]"),
        re.compile(
            r"\bNPU\b|ascend|\baclrt|\bACL_ERROR|\bCANN\b|torch_npu|\bEL0004\b|\bHCCL\b"
            r"|resource\[DeviceMemory\]",
            _I,
        ),
    ),
    ("tpu", ("tpu",), re.compile(r"\bTPU\b|libtpu", _I)),
    (
        "rocm",
        ("hip", "rocm", "amdgpu", "miopen", "rocblas"),
        re.compile(r"\bhip(?:Error|Malloc|_ERROR|\b)|\brocm|\bamdgpu|\bmiopen|rocblas", _I),
    ),
    ("xpu", ("xpu", "ipex"), re.compile(r"\bXPU\b|\bipex\b", _I)),
    (
        "sycl",
        ("sycl", "level", "ur_result_", "ze_result_", "zemem"),
        re.compile(r"\bSYCL\d*\b|level[_ ]zero|\bUR_RESULT_|\bZE_RESULT_|\bzeMem", _I),
    ),
    (
        "vulkan",
        ("vulkan", "vk::", "vk_error_", "erroroutofdevicememory"),
        re.compile(r"vulkan|\bvk::|\bVK_ERROR_|ErrorOutOfDeviceMemory", _I),
    ),
    ("metal", ("metal", "mps", "mlx"), re.compile(r"metal\b|_metal|\bMPS\b|\bmlx\b", _I)),
    (
        "directml",
        ("directml", "dml"),
        re.compile(r"directml|\bDML\b|\bdml_|\bDml[A-Z]|device:DML", _I),
    ),
    (
        "opencl",
        ("opencl", "cl_mem_", "cl_out_of_", "clenqueue", "clcreate", "ocl_"),
        re.compile(r"opencl|\bCL_MEM_|\bCL_OUT_OF_|\bclEnqueue|\bclCreate|\bocl_", _I),
    ),
    (
        "cuda",
        ("cu", "nccl", "tensorrt", "[trt]", "nvinfer", "nvidia"),
        re.compile(
            r"\bcu(?:da|Mem|blas|dnn|fft|rand|sparse|solver)\w*|\bCU(?:BLAS|DNN|FFT|RAND)_"
            r"|\bnccl\b|tensorrt|\[TRT\]|nvinfer|nvidia",
            _I,
        ),
    ),
)

# Layers that share one GPU among pods and enforce a memory quota of their own (a vGPU
# interposer): an OOM under it may come with free device memory. (layer, needles, pattern).
SHARING_LAYERS: Final[tuple[Family, ...]] = (
    (
        "hami",
        ("hami", "libvgpu", "4pdvgpu"),
        re.compile(r"HAMI-core|\bHAMI_|libvgpu|4pdvGPU|hami\.io", _I),
    ),
    ("vgpu", ("vgpu",), re.compile(r"\bvGPU\b", _I)),
)

# Evidence that the memory is an accelerator's beside a family or a sharing layer:
# device/DRAM/HBM/VRAM/pool words or a device index (CUDA0, "Device 0", device:DML:0). A bare
# "buffer" is none: ONNX Runtime's arena says "requested buffer" for host memory too.
DEVICE_NEEDLES: Final = ("device", "devmem", "dram", "hbm", "vram", "gpu", "accelerator", "pool")
DEVICE_WORDS: Final = re.compile(
    r"\bdevice(?:[ _]?memory)?\b|DeviceMemory|\bDEVMEM\b|\bDRAM\b|\bHBM\b|\bVRAM\b|\bGPU"
    r"|\baccelerator|\bmemory[ _]pool|device:\w+:\d",
    _I,
)

# Host look-alikes that carry the same phrases (the general rule stays silent on them): Ray's
# node memory monitor, host and pinned host memory, the compiler's own memory, a full disk.
HOST_VETO: Final = re.compile(
    r"\bon host\b|host memory|OUT_OF_HOST_MEMORY|node running low on memory|Memory on the node"
    r"|memory usage threshold|memory pressure|RayOutOfMemoryError|OOM killer|\bptxas\b"
    r"|catastrophic error|No space left on device",
    _I,
)


def alloc_failed(lower: str, text: str) -> bool:
    """Tell whether ``text`` (``lower`` is it lower-cased) says an allocation failed."""
    for token, phrases in ALLOC_FAILED:
        if token in lower:
            for phrase in phrases:
                if phrase in lower:
                    return True
    return "allocat" in lower and "fail" in lower and ALLOC_FAILED_RE.search(text) is not None


def device_evidence(lower: str, text: str) -> bool:
    """Tell whether ``text`` shows the memory is an accelerator's: a device word or index, a
    family's API or runtime, or a GPU-sharing layer."""
    for needle in DEVICE_NEEDLES:
        if needle in lower:
            if DEVICE_WORDS.search(text) is not None:
                return True
            break
    return accelerator_of(lower, text) is not None or sharing_layer_of(lower, text) is not None


def host_veto(text: str) -> bool:
    """Tell whether ``text`` is a host-memory look-alike (``HOST_VETO``)."""
    return HOST_VETO.search(text) is not None


def accelerator_of(lower: str, text: str) -> str | None:
    """Return the accelerator family ``text`` names (tenstorrent, hpu, npu, tpu, rocm, xpu,
    sycl, vulkan, metal, directml, opencl, cuda), or None; ``lower`` is it lower-cased."""
    return _first(FAMILIES, lower, text)


def sharing_layer_of(lower: str, text: str) -> str | None:
    """Return the GPU-sharing layer ``text`` names (hami, vgpu), or None."""
    return _first(SHARING_LAYERS, lower, text)


def _first(table: tuple[Family, ...], lower: str, text: str) -> str | None:
    for name, needles, pattern in table:
        for needle in needles:  # a plain loop: any() with a generator costs more here
            if needle in lower:
                if pattern.search(text) is not None:
                    return name
                break
    return None
