"""Regex tables behind ``detector.events.classify``: GPU OOM wordings and their look-alikes.

Each rule is ``(pattern, verdict, framework, reason)``; the classifier tries the tables in a
fixed order and the first match wins. Wordings and their sources:

- PyTorch caching allocator, three generations ("RuntimeError: CUDA out of memory. Tried to
  allocate ... (GPU 0; ... total capacity; ... free ...)", "torch.cuda.OutOfMemoryError ...
  GPU 0 has a total capacty of ...", "torch.OutOfMemoryError ... this process has ...") and
  the cudaMallocAsync backend ("Allocation on device 0 would exceed allowed memory"):
  https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp
- vLLM KV-cache sizing and start checks ("No available memory for the cache blocks", "... is
  larger than the maximum number of tokens that can be stored in KV cache", "... larger than
  the available KV cache memory", "Free memory on device ... on startup is less than desired
  GPU memory utilization"): https://github.com/vllm-project/vllm/issues/2418,
  https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/kv_cache_utils.py
- vLLM engine death ("EngineDeadError", "AsyncEngineDeadError", "Engine loop has died",
  "Engine process (pid N) died", "Worker proc X died unexpectedly", "EngineCore failed to
  start"): https://github.com/vllm-project/vllm/pull/5173,
  https://github.com/vllm-project/vllm/issues/12233, https://github.com/vllm-project/vllm/issues/18446
- TGI warmup ("Not enough memory to handle 4096 prefill tokens") and shard death ("Shard 0
  failed to start", "ShardCannotStart"):
  https://github.com/huggingface/text-generation-inference/issues/755,
  https://github.com/huggingface/text-generation-inference/issues/866
- vLLM worker death ("Worker VllmWorkerProcess pid N died, exit code: -15", "MulitprocExecutor
  got fatal signal from worker processes"): https://github.com/vllm-project/vllm/issues/6145,
  https://github.com/vllm-project/vllm/issues/14452; SGLang TP worker death
  ("TpModelWorkerClient hit an exception"): https://github.com/sgl-project/sglang/issues/5284
- SGLang KV pool sizing ("Not enough memory. Please try to increase --mem-fraction-static"),
  exhaustion ("No space left for only one request") and scheduler death ("Scheduler hit an
  exception"): https://github.com/sgl-project/sglang/issues/322,
  https://github.com/sgl-project/sglang/pull/14948, https://github.com/sgl-project/sglang/issues/4048
- TensorRT-LLM ("[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(...): out of
  memory"): https://github.com/NVIDIA/TensorRT-LLM/issues/498
- ONNX Runtime BFC arena ("BFCArena::AllocateRawInternal ... Failed to allocate memory for
  requested buffer of size N"): https://github.com/microsoft/onnxruntime/issues/22702
- cuBLAS/cuDNN status codes: https://docs.nvidia.com/cuda/cublas/#cublasstatus-t,
  https://docs.nvidia.com/deeplearning/cudnn/latest/api/cudnn-graph-library.html
- NCCL ("Cuda failure 'out of memory'", "Failed to CUDA calloc N bytes"):
  https://github.com/NVIDIA/nccl/issues/1235
- XLA/JAX and TensorFlow ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate N bytes",
  "OOM when allocating tensor ... device:GPU:0"):
  https://github.com/google-deepmind/alphafold/issues/1023; JAX 0.11 logs the shared XLA/TSL BFC
  allocator's "bfc_allocator.cc:598] Allocator (GPU_0_bfc) ran out of memory trying to allocate"
  without TensorFlow's path (captured on an H200: tests/unit/fixtures/oom_h200_captured.jsonl)
- ggml/llama.cpp ("cudaMalloc failed: out of memory", "failed to allocate CUDA0 buffer of size
  N"): https://github.com/ollama/ollama/issues/3683, https://github.com/ggml-org/llama.cpp/issues/20431
- CUDA runtime ("CUDA error: out of memory", cudaErrorMemoryAllocation = error 2):
  https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html
- Linux OOM killer ("Out of memory: Killed process", "invoked oom-killer", "oom-kill:"),
  Kubernetes "OOMKilled" and compose "exited with code 137" (host-side look-alikes):
  https://github.com/equinor/ert/issues/7797, https://github.com/vectorch-ai/ScaleLLM/issues/38
- Hints that only mention OOM ("If out-of-memory error occurs during cudagraph capture, ..."):
  https://github.com/vllm-project/vllm/pull/14447
- ROCm/HIP ("HIP out of memory. Tried to allocate", "hipErrorOutOfMemory", TensorFlow-ROCm
  "HIP_ERROR_OutOfMemory"): https://github.com/ROCm/TheRock/issues/1054,
  https://github.com/keras-team/keras/issues/13889, https://github.com/ROCm/hip/issues/2132
- vLLM sleep mode, CuMemAllocator ("CUDA Error: out of memory at .../cumem_allocator.cpp:62"):
  https://github.com/TideDra/lmm-r1/issues/43
- TensorRT ("Requested amount of GPU memory (N bytes) could not be allocated") and
  TensorRT-LLM ("Executor creation failed due to insufficient GPU memory", "No free blocks
  left"): https://github.com/pytorch/TensorRT/issues/2836,
  https://github.com/NVIDIA/TensorRT-LLM/issues/5872, https://github.com/NVIDIA/TensorRT-LLM/issues/694
- Allocator warnings that retry ("cuMemCreate CUDA_ERROR_OUT_OF_MEMORY (may not be an issue
  ...)") and pinned host memory ("failed to alloc N bytes on host: CUDA_ERROR_OUT_OF_MEMORY"):
  https://github.com/fzyzcjy/torch_memory_saver/issues/99, https://github.com/jina-ai/dalle-flow/issues/57
"""

from __future__ import annotations

import re
from typing import Final

Rule = tuple[tuple[str, ...], re.Pattern[str], str, str | None, str]
RuleSpec = tuple[tuple[str, ...], str, str, str | None, str]

_I = re.IGNORECASE


def _rules(*items: RuleSpec) -> tuple[Rule, ...]:
    """Compile ``(needles, pattern, verdict, framework, reason)`` specs.

    ``needles`` are lower-case substrings of which every match contains at least one; the
    classifier runs the regex only when one is in the lower-cased line (the cheap check).
    """
    return tuple((needles, re.compile(p, _I), v, fw, why) for needles, p, v, fw, why in items)


GPU, DEAD, HOST, NOT, AMB = "gpu_oom", "engine_dead", "host_oom", "not_gpu_oom", "ambiguous"
OOM = ("out of memory",)

# Lower-case tokens at least one of which every GPU/dead/host rule needs; without any: NOT.
GATE_TOKENS: Final = (
    "mem",
    "oom",
    "alloc",
    "exhaust",
    "kv",
    "dead",
    "died",
    "fail",
    "error",
    "shard",
    "crash",
    "137",
    "exception",
    "sigquit",
    "encountered",
    "no space left",
    "free space",
    "not_initialized",
    "serve at least",
    "fatal signal",
)

# A traceback's source line ("    raise ValueError(...") repeats the message of the next line.
SOURCE_LINE: Final = re.compile(r"(?:^|[\s\]|])raise [\w.]+\(")

# Wordings that are certainly a GPU OOM even when the line also carries a hint.
STRONG: Final = _rules(
    (
        OOM,
        r"\b(?:CUDA|HIP|XPU|NPU) out of memory\. Tried to allocate|\bMPS backend out of memory",
        GPU,
        "pytorch",
        "pytorch_oom",
    ),
    (
        ("outofmemoryerror",),
        r"OutOfMemoryError: (?:CUDA|HIP|XPU|Allocation on device)",
        GPU,
        "pytorch",
        "pytorch_oom",
    ),
)

# Look-alikes that mention the OOM words but are hints, info or explicit non-failures.
# A request logger echoing user input (vLLM's "Received request ...: prompt: '...'", JSON
# bodies with "prompt"/"messages"/"content"): whatever the prompt says is data, not an error.
# Source: https://github.com/vllm-project/vllm/blob/main/vllm/entrypoints/logger.py
REQUEST_PAYLOAD_TOKENS: Final = ("prompt", "received request", '"content"', '"messages"')
REQUEST_PAYLOAD: Final = re.compile(
    r"Received request\b|\bprompt(?:_token_ids)?\s*[:=]\s*['\"\[(]"
    r"|\"(?:prompt|messages|content|input)\"\s*:",
    _I,
)

EXCLUDE: Final = _rules(
    (("not a failure",), r"this is not a failure", NOT, None, "warning_not_a_failure"),
    (
        ("out of memory", "out-of-memory", "oom"),
        r"\b(?:if|in case|to avoid|avoid(?:ing)?|prevent(?:ing|s)?|reduce the (?:risk|chance) of"
        r"|(?:may|might|can|could|will) (?:cause|lead to|result in)|risking)\b[^.;]{0,40}?"
        r"(?:out[- ]of[- ]memory|\bOOMs?\b)",
        NOT,
        None,
        "hint",
    ),
    (("oom",), r"\bwhen (?:an? )?OOMs? (?:happens|occurs)", NOT, None, "hint"),
    (
        ("oom when allocating",),
        r"OOM when allocating tensor.{0,200}?(?:device:CPU|cpu_bfc|\bcpu\b)",
        NOT,
        None,
        "host_ram",
    ),
    (
        ("bfcarena",),
        r"^(?=.*(?:nchwc|CPUExecutionProvider|\bCPU\b|cpu_?allocator)).*BFCArena",
        AMB,
        "onnxruntime",
        "onnxruntime_arena_cpu_hint",
    ),
    (("hostalloc",), r"HostAlloc\w*.{0,160}out of memory", AMB, "pytorch", "pinned_host_memory"),
    (  # pinned (page-locked) host memory in the CUDA runtime's device-OOM words: cudaMallocHost,
        # cudaHostRegister, cuMemAllocHost (https://github.com/ashalliants/ninfer-3090/pull/25,
        # https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__MEMORY.html)
        ("mallochost", "hostregister"),  # cuMemAllocHost has "mallochost" too
        r"^(?=.*(?:MallocHost|HostRegister))"
        r".*(?:out of memory|OUT_OF_MEMORY|MemoryAllocation|alloc\w* fail)",
        AMB,
        "cuda",
        "pinned_host_memory",
    ),
    (("on host",), r"\balloc\w* \d+ bytes on host", AMB, "tensorflow", "pinned_host_memory"),
    (("may not be an issue",), r"OUT_OF_MEMORY.{0,20}may not be an issue", AMB, "cuda", "retried"),
    # a scheduler or builder that recovers on its own: SGLang retracts requests
    # (https://github.com/sgl-project/sglang/issues/4184), llama.cpp retries a smaller batch
    # (https://github.com/ggml-org/llama.cpp/issues/14097), TensorRT skips a tactic
    # (https://github.com/marcoslucianops/DeepStream-Yolo/issues/366)
    (("retract",), r"out of memory happened\W{0,3}#?retract", NOT, "sglang", "scheduler_retract"),
    (("retrying", "skipping tactic"), r"retrying with|Skipping tactic", NOT, None, "retried"),
)

GPU_RULES: Final = _rules(
    (OOM, r"\b(?:CUDA|HIP|XPU) out of memory", GPU, "pytorch", "pytorch_oom"),
    (
        ("exceed allowed memory",),
        r"Allocation on device(?: \d+)? would exceed allowed memory",
        GPU,
        "pytorch",
        "pytorch_oom",
    ),
    (
        ("cache blocks",),
        r"No available memory for the cache blocks",
        GPU,
        "vllm",
        "kv_cache_no_memory",
    ),
    (
        ("stored in kv cache",),
        r"larger than the maximum number of tokens that can be stored in KV cache",
        GPU,
        "vllm",
        "kv_cache_insufficient",
    ),
    (
        ("available kv cache memory",),
        r"larger than the available KV cache memory",
        GPU,
        "vllm",
        "kv_cache_insufficient",
    ),
    (
        ("serve at least",),
        r"To serve at least one request with the models?'?s'? max seq len",
        GPU,
        "vllm",
        "kv_cache_insufficient",
    ),
    (
        ("insufficient", "not enough"),
        r"KV cache[^.]{0,40}\b(?:insufficient|not enough)|(?:insufficient|not enough)"
        r" (?:memory|space) for (?:the )?KV cache",
        GPU,
        "vllm",
        "kv_cache_insufficient",
    ),
    (
        ("free memory on device",),
        r"Free memory on device.{0,40} on startup is less than",
        GPU,
        "vllm",
        "startup_free_memory_check",
    ),
    (
        ("not enough memory to handle",),
        r"Not enough memory to handle \d+ (?:total |prefill )?tokens",
        GPU,
        "tgi",
        "warmup_oom",
    ),
    (
        ("not enough memory",),
        r"Not enough memory\b.{0,60}mem[-_]fraction[-_]static",
        GPU,
        "sglang",
        "kv_pool_sizing",
    ),
    (OOM, r"\bPrefill out of memory\b", GPU, "sglang", "prefill_oom"),
    (  # PyTorch's device caching allocator, whatever the backend's name (torch_npu, torch_mlu,
        # torch_musa ... copy it): "<backend> out of memory. Tried to allocate N"; the CPU
        # allocator words it otherwise ("DefaultCPUAllocator: not enough memory")
        OOM,
        r"(?-i:\b[A-Z][A-Za-z0-9_]{1,15}) out of memory\. Tried to allocate\b",
        GPU,
        "pytorch",
        "pytorch_oom",
    ),
    (  # the KV pool full, nothing left to retract: https://github.com/sgl-project/sglang/issues/4602
        OOM,
        r"\bDecode out of memory\. Try",
        GPU,
        "sglang",
        "kv_pool_exhausted",
    ),
    (OOM, r"\[TensorRT-LLM\].{0,200}out of memory", GPU, "tensorrt_llm", "cuda_runtime_oom"),
    (
        ("bfcarena",),
        r"BFCArena::AllocateRaw\w*.{0,200}Failed to allocate memory",
        GPU,
        "onnxruntime",
        "bfc_arena",
    ),
    (
        ("alloc_failed",),
        r"\bCU(BLAS|DNN|SPARSE|SOLVER|FFT|RAND)_(?:STATUS_)?ALLOC_FAILED",
        GPU,
        "cuda",
        "library_alloc_failed",
    ),
    (OOM, r"Cuda failure '?out of memory", GPU, "nccl", "nccl_cuda_failure"),
    (  # CuPy/Chainer: https://github.com/cupy/cupy/issues/1912, .../issues/2537
        OOM,
        r"\bout of memory (?:to allocate|allocating) [\d,]+ bytes \((?:total|allocated so far)",
        GPU,
        "cupy",
        "cupy_pool_oom",
    ),
    (("failed to cuda",), r"Failed to CUDA c?alloc \d+ bytes", GPU, "nccl", "nccl_cuda_alloc"),
    (
        ("resource_exhausted",),
        r"RESOURCE_EXHAUSTED:.{0,80}(?:out of memory|Failed to allocate request|ran out of memory)",
        GPU,
        "jax",
        "xla_resource_exhausted",
    ),
    (
        ("oom when allocating",),
        r"OOM when allocating tensor.{0,200}?(?:device:(?:GPU|DML|XLA_\w+)|GPU_\d+_bfc)",
        GPU,
        "tensorflow",
        "tf_resource_exhausted",
    ),
    (  # the same XLA/TSL allocator line without a TensorFlow path: JAX (captured, H200)
        ("ran out of memory",),
        r"^(?!.*tensorflow).*Allocator \(GPU_\d+_bfc\) ran out of memory trying to allocate",
        GPU,
        "jax",
        "xla_bfc_allocator",
    ),
    (
        ("ran out of memory",),
        r"Allocator \(GPU_\d+_bfc\) ran out of memory trying to allocate",
        GPU,
        "tensorflow",
        "tf_bfc_allocator",
    ),
    (OOM, r"\berror\s*[=(]\s*2\)?\s*:\s*out of memory", GPU, "pytorch", "thc_error_2"),
    (
        ("cuda_error_out_of_memory", "cudaerrormemoryallocation"),
        r"CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
        GPU,
        "cuda",
        "cuda_error_2",
    ),
    (
        OOM,
        r"\bcu(?:da)?Malloc\w*(?:\(\))? failed: out of memory",
        GPU,
        "cuda",
        "cuda_malloc_failed",
    ),
    (
        ("cuda",),  # every match has "cuda" and "error"; "cuda" is the rarer word in logs
        r"\bCUDA error: out of memory|\bcuda\w*[\w ]{0,30}?error[\s=(:]*2\b(?![.\d])",
        GPU,
        "cuda",
        "cuda_error_2",
    ),
    (OOM, r"\bcuda\b.{0,80}\bout of memory", GPU, "cuda", "cuda_error_2"),
    (
        ("to allocate cuda",),
        r"(?:failed|unable) to allocate CUDA\d* buffer",
        GPU,
        "ggml",
        "ggml_buffer_alloc",
    ),
    (("no space left",), r"No space left for only one request", GPU, "sglang", "kv_pool_exhausted"),
    (
        ("hiperroroutofmemory", "hip_error_outofmemory", "hiperror_t(1002)"),
        r"hipErrorOutOfMemory|HIP_ERROR_OutOfMemory|from device: hipError_t\(1002\)",
        GPU,
        "rocm",
        "hip_error_oom",
    ),
    (OOM, r"\bhip\w*\b.{0,80}\bout of memory", GPU, "rocm", "hip_error_oom"),
    (
        ("requested amount of gpu memory",),
        r"Requested amount of GPU memory \(\d+ bytes\) could not be allocated",
        GPU,
        "tensorrt",
        "trt_alloc_failed",
    ),
    (
        ("insufficient gpu memory",),
        r"failed due to insufficient GPU memory",
        GPU,
        "tensorrt_llm",
        "executor_insufficient_memory",
    ),
    (
        ("no free blocks left",),
        r"allocate new blocks\. No free blocks left",
        GPU,
        "tensorrt_llm",
        "kv_pool_exhausted",
    ),
)

AMBIGUOUS_RULES: Final = _rules(
    (  # a wrapper re-raising a worker's OOM, its cause on another line: Ray's RayTaskError(X)
        ("outofmemoryerror)",),
        r"\w+Error\((?:\w+\.)*OutOfMemoryError\)",
        AMB,
        None,
        "reraised_cause_elsewhere",
    ),
    (
        ("oom when allocating",),
        r"OOM when allocating tensor",
        AMB,
        "tensorflow",
        "tf_oom_device_unknown",
    ),
    (
        ("execution_failed",),
        r"CUDNN_STATUS_EXECUTION_FAILED",
        AMB,
        "cudnn",
        "cudnn_execution_failed",
    ),
    (
        ("not_initialized",),
        r"CUBLAS_STATUS_NOT_INITIALIZED",
        AMB,
        "cublas",
        "cublas_not_initialized",
    ),
)

DEAD_RULES: Final = _rules(
    (("enginedeaderror",), r"\b\w*EngineDeadError\b", DEAD, "vllm", "engine_dead"),
    (
        (
            "died",
            "task failed",
            "errored",
            "enginecore encountered",
            "enginecore failed",
            "initialization failed",
            "already dead",
            "fatal signal",
        ),
        r"Engine loop has died|Engine background task failed|Background loop has errored"
        r"|Engine (?:core )?process \(pid \d+\) died|Engine core proc \S+ died"
        r"|EngineCore (?:encountered|failed to start)|Engine core initialization failed"
        r"|LLMEngine is already dead|Worker proc \S+ died unexpectedly"
        r"|\bWorker \w*Worker\w* pid \d+ died|got fatal signal from worker process",
        DEAD,
        "vllm",
        "engine_dead",
    ),
    (
        ("shard", "webserver crashed"),
        r"Shard \d+ (?:crashed|failed to start)|\bShardCannotStart\b|Webserver Crashed"
        r"|Shard process was signaled to shutdown",
        DEAD,
        "tgi",
        "shard_dead",
    ),
    (
        ("sigquit", "hit an exception"),
        r"Received sigquit from a child process"
        r"|\b(?:Scheduler|TpModelWorker\w*|DataParallelController|Detokenizer\w*) hit an exception",
        DEAD,
        "sglang",
        "scheduler_dead",
    ),
)

HOST_RULES: Final = _rules(
    (
        ("kill process", "killed process", "oom-kill"),
        r"\bout of memory: Kill(?:ed)? process|\binvoked oom-killer\b|\boom-kill:",
        HOST,
        None,
        "oom_killer",
    ),
    (("oomkilled",), r"\bOOMKilled\b", HOST, None, "oom_killed"),
    (("137",), r"\bexit(?:ed with)? (?:code|status):? 137\b", HOST, None, "exit_137"),
)

# Recognized look-alikes, for the reason of a NOT_GPU_OOM verdict.
LOOKALIKE_RULES: Final = _rules(
    (
        ("memoryerror", "cpuallocator", "can't allocate memory", "java heap space"),
        r"MemoryError|CPUAllocator|can't allocate memory|Java heap space",
        NOT,
        None,
        "host_ram",
    ),
    (("shared memory", "shm"), r"shared memory|\bshm\b", NOT, None, "host_shm"),
    (
        ("illegal memory access", "illegaladdress"),
        r"illegal memory access|cudaErrorIllegalAddress",
        NOT,
        None,
        "illegal_memory_access",
    ),
    (
        ("device-side assert", "assertion `"),
        r"device-side assert|Assertion `",
        NOT,
        None,
        "device_side_assert",
    ),
    (
        ("no cuda-capable", "no cuda gpus", "driver version is insufficient"),
        r"no CUDA-capable device|No CUDA GPUs|driver version is insufficient",
        NOT,
        None,
        "no_device",
    ),
    (("watchdog", "timeout"), r"Watchdog caught|NCCL.{0,40}timeout", NOT, None, "nccl_timeout"),
    (("xid", "fallen off"), r"\bXid\b|fallen off the bus", NOT, None, "xid_fault"),
    (
        ("memory profiling", "model weights take", "sleep mode freed", "preemptionmode"),
        r"Memory profiling|model weights take|Sleep mode freed|preempted by PreemptionMode",
        NOT,
        None,
        "info",
    ),
)

# Framework refinements for generic CUDA-level wordings: (lower-case token, framework).
CUDA_FRAMEWORK_HINTS: Final = (
    ("cumem_allocator", "vllm"),
    ("tensorrt", "tensorrt_llm"),
    ("[trt]", "tensorrt"),
    ("ggml", "ggml"),
    ("llama", "ggml"),
    ("tensorflow", "tensorflow"),
    ("stream_executor", "tensorflow"),
    ("nccl", "nccl"),
    ("onnxruntime", "onnxruntime"),
    ("cublas", "cublas"),
    ("cudnn", "cudnn"),
    ("cusparse", "cusparse"),
    ("cusolver", "cusolver"),
    ("cufft", "cufft"),
    ("curand", "curand"),
)
JAX_FRAMEWORK_HINTS: Final = (("tensorflow", "tensorflow"),)

# The general rule, for the wordings no table above names: a memory-exhaustion phrase or status
# together with accelerator context on the line. Families it covers, with sources:
# glog "Check failed: error == cudaSuccess (2 vs. 0)  out of memory" (Caffe, old Paddle:
# https://github.com/houqb/DSS/issues/25); cuRAND/cuBLAS/cuDNN/cuFFT/cuSOLVER
# "*_ALLOC(ATION)_FAILED" (https://github.com/BVLC/caffe/issues/1026); "<backend> out of
# memory" for MPS, NPU, XPU, HIP (https://github.com/pytorch/pytorch/issues/130112,
# https://github.com/vllm-project/vllm-ascend/issues/19); OpenCV's CUDA module "(-217:Gpu API
# call) out of memory in function" (https://github.com/opencv/opencv/issues/15128); RAPIDS
# RMM and thrust "std::bad_alloc: out_of_memory: CUDA error", "thrust::system::detail::bad_alloc"
# (https://github.com/NVIDIA/cudf/issues/10517, https://github.com/NVIDIA/cccl/issues/2092);
# PaddlePaddle "Out of memory error on GPU 0. Cannot allocate ..."
# (https://github.com/PaddlePaddle/Paddle/issues/26892); Theano "Error allocating N bytes of
# device memory (out of memory)" (https://github.com/Theano/Theano/issues/1814); TensorRT
# "[TRT] ... OutOfMemory", "Requested amount of memory (N bytes) could not be allocated"
# (https://github.com/NVIDIA-AI-IOT/torch2trt/issues/661). Without accelerator context the
# out-of-memory phrases alone are AMBIGUOUS (TensorFlow's "Ran out of memory trying to
# allocate" names no device: https://github.com/tensorflow/tensorflow/issues/4735); the
# allocation-failure phrases and bad_alloc alone are host look-alikes.
# Phrases that mean memory ran out whatever the context: lower-case substrings, then the regex
# for the ones that need a word boundary ("OOM", not "room") or a gap ("ran out of GPU memory").
EXHAUSTED_PHRASES: Final = ("out of memory", "out_of_memory", "outofmemory", "out-of-memory")
EXHAUSTED: Final = re.compile(r"\bOOM\b|ran out of (?:\w+ )?memory", _I)
# The allocation-failure phrases and the device evidence of every vendor: accelerators.py.
# Accelerator context: a backend, a GPU runtime or library, a device allocator, a device index;
# ACCELERATOR_NEEDLES are lower-case substrings of every match (the cheap check first).
ACCELERATOR_NEEDLES: Final = (
    "cu",
    "hip",
    "rocm",
    "mps",
    "npu",
    "xpu",
    "tpu",
    "gpu",
    "vram",
    "device memory",
    "rmm",
    "thrust::",
    "tensorrt",
    "[trt]",
    "nvinfer",
    "nccl",
    "caching allocator",
)
ACCELERATOR: Final = re.compile(
    r"\bcu(?:da|Mem|blas|dnn|fft|rand|sparse|solver)\w*|\bCU(?:BLAS|DNN|FFT|RAND|SPARSE|SOLVER)_"
    r"|\bhip\w*|\brocm|\bMPS\b|\bNPU\b|\bXPU\b|\bTPU\b|\bGPU|\bgpu_?\w*|\bVRAM\b|\bdevice memory"
    r"|\brmm\b|rmm::|thrust::|TensorRT|\[TRT\]|nvinfer|\bcupy\b|\bNCCL\b|caching allocator",
    _I,
)
# Host-side look-alikes that carry the same phrases (sources in the held-out fixture,
# tests/unit/fixtures/oom_general_*.jsonl): Java and V8 heaps, ENOMEM's strerror text,
# OpenCV's host allocator, NumPy, TensorFlow's CPU allocator, shared memory, pinned host
# memory (Triton: https://github.com/triton-inference-server/server/issues/7222), no device,
# kube-scheduler's "0/3 nodes are available: 3 Insufficient memory, 3 Insufficient
# nvidia.com/gpu" (a pod not scheduled, not an OOM), the kernel's oom_score_adj notes.
GENERAL_HOST: Final = re.compile(
    r"java\.lang\.OutOfMemoryError|Java heap|JavaScript heap|heap limit|\bv8::"
    r"|Errno 12|Cannot allocate memory\b|cv::OutOfMemoryError|Unable to allocate .{1,40} array"
    r"|device:CPU|allocator cpu\b|CPUAllocator|shared memory|\bshm\b|illegal memory access"
    r"|\bpinned\b|driver version is insufficient|no CUDA-capable|No CUDA GPUs"
    r"|nodes are available|oom[ _]score",
    _I,
)
# A line logged at INFO/DEBUG level reports, it does not fail: the general rule stays silent
# ("INFO ... gpu_memory_utilization=0.9; OOM protection enabled").
INFO_LEVEL: Final = re.compile(r"^[^a-z]{0,40}?\b(?:INFO|DEBUG|TRACE)\b|^I\d{4} ")

# Framework hints for a general-rule match: (lower-case token, framework).
GENERAL_FRAMEWORK_HINTS: Final = (
    ("mps", "pytorch_mps"),
    ("npu", "torch_npu"),
    ("xpu", "pytorch_xpu"),
    ("paddle", "paddle"),
    ("out of memory error on gpu", "paddle"),
    ("opencv", "opencv"),
    ("gpu api call", "opencv"),
    ("rmm", "rapids_rmm"),
    ("thrust", "thrust"),
    ("cupy", "cupy"),
    ("gpuarray", "theano"),
    ("device memory (out of memory)", "theano"),
    ("cudandarray", "theano"),
    ("[trt]", "tensorrt"),
    ("tensorrt", "tensorrt"),
    ("check failed", "caffe"),
    ("hip", "rocm"),
    ("rocm", "rocm"),
)
