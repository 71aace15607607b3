"""Device-memory exhaustion by its shape, whatever the vendor: phrases, device evidence, family.

The general rule of ``detector.events.classify`` calls a line a GPU/accelerator OOM when it
carries an allocation-failure phrase (``ALLOC_FAILED``, ``ERROR_CODES``, or an
out-of-memory phrase) together with evidence that the memory is an accelerator's
(``device_evidence``: device/DRAM/HBM/VRAM/pool words, a device index, an accelerator's memory
kind, or the API or runtime of any accelerator vendor), and no host look-alike (``HOST_VETO``);
a phrase that only says a memory is full (``memory_full``) needs a named accelerator or an
accelerator's memory kind. A byte size alone is no evidence: host allocators print one too
(Rust's "memory allocation of N bytes failed", NumPy's "Unable to allocate N GiB"). The
evidence also names the accelerator family (``accelerator_of``) and a GPU-sharing layer that
enforces its own memory quota below the device's (``sharing_layer_of``). Wordings and their sources:

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
- AWS Neuron ("[TDRV:dmem_alloc] Failed to alloc DEVICE memory", "nrt_tensor_allocate status=4
  message="Allocation Failure"", "TDRAM 0/0 has no free space"):
  https://github.com/aws-neuron/aws-neuron-sdk/issues/302,
  https://github.com/vllm-project/vllm/issues/12443,
  https://github.com/aws-neuron/aws-neuron-sdk/issues/178
- MIOpen ("Memory not available to allocate buffer: N"): https://github.com/ROCm/MIOpen/issues/47
- Apple IOGPU ("Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)"):
  https://github.com/ggml-org/llama.cpp/pull/7010; MLX ("[metal::malloc] Attempting to allocate N
  bytes which is greater than the maximum allowed buffer size"): held-apart fixture
- Vulkan through rendy ("rendy_memory::heaps: All suitable heaps are exhausted"):
  https://github.com/szeged/webrender/issues/298
- DirectML ("Could not allocate tensor with N bytes. There is not enough GPU video memory
  available!", Windows' "Not enough memory resources ..." from DmlExecutionProvider):
  https://github.com/microsoft/DirectML/issues/579,
  https://github.com/huggingface/diffusers/issues/791
- Tenstorrent L1 ("Not enough space to allocate N B L1 buffer across 56 banks", "Statically
  allocated circular buffers ... beyond max L1 size"):
  https://github.com/tenstorrent/tt-metal/issues/24944,
  https://github.com/tenstorrent/tt-inference-server/issues/225
- Ascend status codes ("call aclnn... failed, error code is 207001"):
  https://github.com/vllm-project/vllm-ascend/issues/3141 (the codes' meaning: ``ERROR_CODES``)
- Host look-alikes: Ray's memory monitor ("Task was killed due to the node running low on
  memory", https://github.com/real-stanford/flingbot/issues/11), pinned host memory
  (https://github.com/Accenture/AIR/issues/7; cudaMallocHost in the runtime's device-OOM words:
  https://github.com/ashalliants/ninfer-3090/pull/25), the CUDA compiler's own host memory
  ("ptxas fatal : Memory allocation failure", https://github.com/microsoft/onnxruntime/issues/25377).
"""

from __future__ import annotations

import re
from typing import Final

_I = re.IGNORECASE

# Allocation-failure phrases beyond "out of memory", as lower-case substrings (a plain scan is
# cheaper than a case-blind regex) grouped under a token every phrase of the group contains,
# so a line without the token skips the group; then, where the line has one of the group's
# gate words, the phrases that need a gap ("allocation of size N failed", "allocate device
# memory failed", an API's name: "cuMemoryAllocate failed", a status name:
# cudaErrorMemoryAllocation, ACL_ERROR_RT_MEMORY_ALLOCATION, "not enough GPU memory available").
# (token, phrases, gate words, pattern).
ALLOC_FAILED: Final[
    tuple[tuple[str, tuple[str, ...], tuple[str, ...], re.Pattern[str] | None], ...]
] = (
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
            "alloc failure",
            "allocation error",
            "could not be allocated",
            "could not allocate",
            "couldn't allocate",
            "cannot allocate",
            "can't allocate",
            "failed to alloc",
            "unable to alloc",
            "error allocating",
            "not enough space to allocate",
            "not available to allocate",
        ),
        ("fail", "memory_alloc", "memoryalloc", "mem_alloc"),
        re.compile(
            r"allocat\w*(?: [\w ]{1,40}?)? failed\b|ERROR\w*_MEM(?:ORY)?_ALLOC\w*"
            r"|Error\w*MemoryAllocation",
            _I,
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
            "enough memory resources",  # Windows E_OUTOFMEMORY: "Not enough memory resources ..."
        ),
        ("not enough",),
        re.compile(
            r"\bnot enough (?:[\w-]+ ){0,2}memory (?:is )?(?:available|left|remaining"
            r"|to allocate|for (?:allocation|command))\b",
            _I,
        ),
    ),
    (
        "exhausted",
        ("resources are exhausted", "resource_exhausted", "resource exhausted"),
        (),
        None,
    ),
    ("pool", ("maximum pool size exceeded",), (), None),
)
# Lower-case tokens of which every phrase of the general rule has one: an out-of-memory phrase
# ("memory", "oom"), ``ALLOC_FAILED`` (its group tokens), ``ERROR_CODES`` and ``memory_full``.
PHRASE_TOKENS: Final = ("memory", "alloc", "oom", "exhausted", "pool", "free space", "2070")
# Phrases that say a memory is full rather than that an allocation failed ("TDRAM 0/0 has no
# free space", "All suitable heaps are exhausted", "... grow to N B which is beyond max L1 size"):
# a host disk or a parser says the same, so they count only beside a named accelerator or a
# device-memory kind (``MEMORY_KIND``), never beside a bare "device".
# "no free space" needs no pattern; FULL_EXHAUSTED runs where "exhausted" is in the line,
# FULL_BEYOND_MAX where "allocat" and "max" are.
FULL_EXHAUSTED: Final = re.compile(
    r"\b(?:memory|[TV]?RAM|HBM|heaps?|pools?|buffers?)"
    r" (?:(?:are|is|was|were|has been|have been) )?exhausted\b",
    _I,
)
FULL_BEYOND_MAX: Final = re.compile(
    r"allocat\w*\b[^.;]{0,100}?\b(?:beyond|greater than|exceeds?|exceeding) (?:the )?max",
    _I,
)
# Runtime status codes that the vendor documents as a device-memory allocation failure, read
# only beside the vendor's own family: Ascend CANN ACL_ERROR_RT_MEMORY_ALLOCATION = 207001 and
# ACL_ERROR_RT_DEVIDE_OOM = 207018 (aclError return codes:
# https://www.hiascend.com/document/detail/zh/CANNCommunityEdition/910/API/runtimeapi/aclcppdevg_03_1345.html).
# (family, needles, pattern): the code after "code", "error", "ret" or "status".
ERROR_CODES: Final = (
    (
        "npu",
        ("2070",),
        re.compile(r"\b(?:code|error|ret|status)\b[^\d\n]{0,15}\b(?:207001|207018)\b", _I),
    ),
)

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
        ("hpu", "habana", "gaudi", "syn", "pt_devmem", "hl-smi"),
        re.compile(
            r"\bHPU\b|habana|gaudi|(?-i:\bsyn(?:Status|Device|Malloc|Host)\w*)|PT_DEVMEM|\bhl-smi",
            _I,
        ),
    ),
    (
        "npu",
        ("npu", "ascend", "acl", "cann", "el0004", "hccl", "devicememory]"),
        re.compile(
            r"\bNPU\b|ascend|\bacl(?:rt|nn|op)|\bACL_ERROR|\bCANN\d*\b|torch_npu|\bEL0004\b"
            r"|\bHCCL\b"
            r"|resource\[DeviceMemory\]",
            _I,
        ),
    ),
    ("tpu", ("tpu",), re.compile(r"\bTPU\b|libtpu", _I)),
    (  # AWS Neuron (Inferentia, Trainium): runtime nrt_*, its driver's [TDRV:...] tags
        "neuron",
        ("nrt", "tdrv", "neuron"),
        re.compile(
            r"\bnrt_\w+|\blibnrt|\bNRT:|\bTDRV\b|aws-neuron|\bneuron(?:x|core|_?rt|cc)\b", _I
        ),
    ),
    (
        "rocm",
        ("hip", "rocm", "amdgpu", "miopen", "rocblas", "migraphx"),
        re.compile(
            r"\bhip(?:Error|Malloc|_ERROR|\b)|\brocm|\bamdgpu|\bmiopen|rocblas|migraphx", _I
        ),
    ),
    (  # Moore Threads MUSA, Cambricon MLU (CNRT/CNNL), Enflame GCU (TopsRider), Hygon DCU
        "musa",
        ("musa",),
        re.compile(r"\bMUSA\d*\b|(?-i:\bmusa[A-Z]\w*)|torch_musa", _I),
    ),
    ("mlu", ("mlu", "cnrt", "cnnl"), re.compile(r"\bMLU\d*\b|\bCNRT|\bCNNL|torch_mlu", _I)),
    ("gcu", ("gcu", "tops"), re.compile(r"\bGCU\d*\b|torch_gcu|(?-i:\btops[A-Z]\w*)", _I)),
    ("dcu", ("dcu",), re.compile(r"\bDCU\d*\b", _I)),
    (  # Qualcomm AI Engine Direct (QNN) on the Hexagon NPU
        "qnn",
        ("qnn", "hexagon"),
        re.compile(r"\bQNN(?:_\w+)?\b|\bqnn\w*|\bhexagon\b", _I),
    ),
    ("webgpu", ("wgpu", "webgpu"), re.compile(r"\bwgpu\w*|webgpu", _I)),
    ("xpu", ("xpu", "ipex"), re.compile(r"\bXPU\b|\bipex\b", _I)),
    (
        "sycl",
        ("sycl", "level", "ur_result_", "ze_result_", "zemem", "urusm"),
        re.compile(r"\bSYCL\d*\b|level[_ ]zero|\bUR_RESULT_|\bZE_RESULT_|\bzeMem|\burUSM", _I),
    ),
    (
        "vulkan",
        ("vulkan", "vk", "erroroutofdevicememory", "rendy"),
        re.compile(
            r"vulkan|\bvk::|\bVK_ERROR_|ErrorOutOfDeviceMemory|(?-i:\bvk[A-Z][a-z]+[A-Z]\w*)"
            r"|\brendy[_-]",
            _I,
        ),
    ),
    (  # Apple: Metal, MPS, MLX, and the IOGPU/IOAccelerator command-buffer status names
        "metal",
        ("metal", "mps", "mlx", "kiogpu", "kioaccel", "mtl"),
        re.compile(r"metal\b|_metal|\bMPS\b|\bmlx\b|\bkIOGPU|\bkIOAccel|(?-i:\bMTL[A-Z]\w+)", _I),
    ),
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
    (  # XLA and its PJRT runtime, on whichever accelerator: named when nothing closer is
        "xla",
        ("xla", "pjrt"),
        re.compile(r"\bXLA(?:_\w+)?\b|\bEXLA\b|\bPJRT|\bpjrt_|/xla/", _I),
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
# device/DRAM/HBM/VRAM/pool words or a device index (CUDA0, "Device 0", device:DML:0), or a
# device-memory kind (``MEMORY_KIND``). A bare "buffer" is none: ONNX Runtime's arena says
# "requested buffer" for host memory too.
DEVICE_NEEDLES: Final = ("device", "devmem", "dram", "hbm", "vram", "gpu", "accelerator", "pool")
DEVICE_WORDS: Final = re.compile(
    r"\bdevice(?:[ _]?memory)?\b|DeviceMemory|\bDEVMEM\b|\bDRAM\b|\bHBM\b|\bVRAM\b|\bGPU"
    r"|\baccelerator|\bmemory[ _]pool|device:\w+:\d",
    _I,
)
# Memory that only an accelerator has: its DRAM/HBM/GDDR (Neuron's TDRAM), video memory, a
# core's L1 SRAM split in banks (Tenstorrent: "N B L1 buffer across 56 banks", "beyond max L1
# size"). Enough on its own for the "memory is full" phrases (``FULL_RE``).
KIND_NEEDLES: Final = ("dram", "hbm", "vram", "gddr", "l1 ", "banks", "memory")
MEMORY_KIND: Final = re.compile(
    r"\bT?DRAM\b|\bHBM\d?\w?\b|\bVRAM\b|\bGDDR\d?\w?\b|\bL1 (?:buffers?|size|memory|banks?)\b"
    r"|\bacross \d+ banks\b|\bvideo memory\b|\b(?:GPU|device) memory\b",
    _I,
)

# Host look-alikes that carry the same phrases (the general rule stays silent on them): Ray's
# node memory monitor, host and pinned host memory (cudaMallocHost, cudaHostAlloc,
# cudaHostRegister, page-locked), the compiler's own memory, a full disk, and a device itself
# as the thing allocated rather than its memory (kubelet's device manager: "Allocate failed due
# to requested number of devices unavailable for nvidia.com/gpu", a VM's "failed to allocate
# device for vif").
HOST_VETO: Final = re.compile(
    r"\bon host\b|host memory|MallocHost|HostAlloc|HostRegister|\bpage[- ]locked\b"
    r"|\balloc\w* (?:an? |the )?(?:devices?|GPUs?)\b(?![ _-]?(?:mem|buf|tensor|\d))"
    r"|number of devices unavailable|OUT_OF_HOST_MEMORY|node running low on memory"
    r"|Memory on the node"
    r"|memory usage threshold|memory pressure|RayOutOfMemoryError|OOM killer|\bptxas\b"
    r"|catastrophic error|No space left on device",
    _I,
)


def alloc_failed(lower: str, text: str) -> bool:
    """Tell whether ``text`` (``lower`` is it lower-cased) says an allocation failed: a phrase
    (``ALLOC_FAILED``) or a vendor's documented status code beside that
    vendor's name (``ERROR_CODES``)."""
    for token, phrases, gates, gap in ALLOC_FAILED:
        if token in lower:
            for phrase in phrases:
                if phrase in lower:
                    return True
            for gate in gates:
                if gate in lower:
                    if gap is not None and gap.search(text) is not None:
                        return True
                    break
    for family, codes, pattern in ERROR_CODES:
        for code in codes:
            if code in lower:
                if pattern.search(text) is not None and accelerator_of(lower, text) == family:
                    return True
                break
    return False


def memory_full(lower: str, text: str) -> bool:
    """Tell whether ``text`` says an accelerator's memory is full ("no free space",
    ``FULL_EXHAUSTED``, ``FULL_BEYOND_MAX``) beside a named accelerator or a device-memory
    kind: the general rule's weaker phrase, never enough beside a bare "device" or "GPU"."""
    full = "no free space" in lower
    if not full and "exhausted" in lower:
        full = FULL_EXHAUSTED.search(text) is not None
    if not full and "allocat" in lower and "max" in lower:
        full = FULL_BEYOND_MAX.search(text) is not None
    return full and (accelerator_of(lower, text) is not None or memory_kind(lower, text))


def memory_kind(lower: str, text: str) -> bool:
    """Tell whether ``text`` names memory only an accelerator has (``MEMORY_KIND``)."""
    for needle in KIND_NEEDLES:
        if needle in lower:
            return MEMORY_KIND.search(text) is not None
    return False


def device_evidence(lower: str, text: str) -> bool:
    """Tell whether ``text`` shows the memory is an accelerator's: a device word or index, a
    family's API or runtime, or a GPU-sharing layer."""
    for needle in DEVICE_NEEDLES:
        if needle in lower:
            if DEVICE_WORDS.search(text) is not None:
                return True
            break
    if memory_kind(lower, text):
        return True
    return accelerator_of(lower, text) is not None or sharing_layer_of(lower, text) is not None


def host_veto(text: str) -> bool:
    """Tell whether ``text`` is a host-memory look-alike (``HOST_VETO``)."""
    return HOST_VETO.search(text) is not None


def accelerator_of(lower: str, text: str) -> str | None:
    """Return the accelerator family ``text`` names (tenstorrent, hpu, npu, tpu, neuron, rocm,
    musa, mlu, gcu, dcu, qnn, webgpu, xpu, sycl, vulkan, metal, directml, opencl, cuda, xla),
    or None; ``lower`` is it lower-cased."""
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
