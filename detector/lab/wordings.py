"""Log wordings of the recorded streams: vLLM, uvicorn, ingress-nginx, Kubernetes, host OOM.

Every template follows a real line seen in a public bug report or in the project's corpus
(``examples/README.md`` lists the sources). Functions return plain text lines, or lists of
``(offset_s, stream, text)`` for multi-line blocks, one Fluent Bit record per line; the
recorder wraps them in their wire envelopes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

Line = tuple[float, str, str]  # (offset in seconds, stream, text)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CHAT = "/v1/chat/completions"
VLLM_VERSION = "0.10.1.1"
API = "(APIServer pid=1)"
DIST = "/usr/local/lib/python3.12/dist-packages"
GIB = 1024**3


def utc(t: float, fmt: str) -> str:
    """Format epoch seconds ``t`` in UTC with a ``time.strftime`` pattern."""
    return time.strftime(fmt, time.gmtime(t))


def rfc3339(t: float) -> str:
    """Return ``t`` as RFC 3339 with whole seconds (Go ``time.RFC3339``, UTC)."""
    return utc(t, "%Y-%m-%dT%H:%M:%SZ")


def rfc3339_nano(t: float, nanos: int) -> str:
    """Return ``t`` as RFC 3339 with nanoseconds; ``nanos`` is the sub-second part."""
    return f"{utc(t, '%Y-%m-%dT%H:%M:%S')}.{nanos:09d}Z"


def vllm_prefix(t: float, level: str, where: str, proc: str = API) -> str:
    """Return vLLM's logger prefix, e.g. ``(APIServer pid=1) INFO 03-14 09:00:06 [x.py:1] ``."""
    head = f"{proc} " if proc else ""
    return f"{head}{level} {utc(t, '%m-%d %H:%M:%S')} [{where}] "


def torch_size(n_bytes: float) -> str:
    """Format a size the way PyTorch's caching allocator does in its OOM message."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.2f} {unit}"
    return f"{n_bytes:.0f} bytes"


# vLLM 0.10.x start-up, one line per row: offset_s, process (A = API server, E = engine core,
# - = none, S = stderr without prefix), file:line, message. Shapes of vllm-project/vllm#20707,
# #24162 and kyuz0/amd-strix-halo-vllm-toolboxes#5; figures for Llama-3.1-8B on an H100 80GB.
_STARTUP = """\
0.0|-|__init__.py:241|Automatically detected platform cuda.
3.1|A|api_server.py:1805|vLLM API server version {version}
3.1|A|utils.py:326|non-default args: {{'model_tag': '{model}', 'host': '0.0.0.0', \
'model': '{model}', 'max_model_len': 32768, 'max_num_seqs': 256, \
'gpu_memory_utilization': 0.9, 'enable_prefix_caching': True}}
9.0|A|__init__.py:711|Resolved architecture: LlamaForCausalLM
9.0|A|__init__.py:1750|Using max model len 32768
9.1|A|scheduler.py:222|Chunked prefill is enabled with max_num_batched_tokens=8192.
14.3|E|core.py:74|Initializing a V1 LLM engine (v{version}) with config: model='{model}', \
speculative_config=None, tokenizer='{model}', dtype=torch.bfloat16, max_seq_len=32768, \
tensor_parallel_size=1, kv_cache_dtype=auto, enable_prefix_caching=True
17.1|E|gpu_model_runner.py:1953|Starting to load model {model}...
21.6|S||Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:03<00:00,  1.06it/s]
21.7|E|default_loader.py:262|Loading weights took 3.86 seconds
22.4|E|gpu_model_runner.py:2007|Model loading took 14.9889 GiB and 4.612310 seconds
35.9|E|gpu_worker.py:276|Available KV cache memory: 54.08 GiB
36.0|E|kv_cache_utils.py:849|GPU KV cache size: 443,024 tokens
36.0|E|kv_cache_utils.py:853|Maximum concurrency for 32,768 tokens per request: 13.52x
41.2|E|gpu_model_runner.py:2708|Graph capturing finished in 5 secs, took 0.52 GiB
41.3|E|core.py:214|init engine (profile, create kv cache, warmup model) took 18.02 seconds
42.0|A|loggers.py:142|Engine 000: vllm cache_config_info with initialization after \
num_gpu_blocks is: 27689
42.1|A|api_server.py:1611|Supported_tasks: ['generate']
42.2|A|api_server.py:1880|Starting vLLM API server 0 on http://0.0.0.0:8000
43.0|U||Started server process [1]
43.0|U||Waiting for application startup.
43.0|U||Application startup complete.
"""


def vllm_startup(t0: float, engine: str) -> list[Line]:
    """Return a vLLM V1 (0.10.x) OpenAI server start-up, from platform detection to ready."""
    out: list[Line] = []
    for row in _STARTUP.format(version=VLLM_VERSION, model=MODEL).splitlines():
        offset, proc, where, msg = row.split("|", 3)
        dt = float(offset)
        if proc == "S":
            out.append((dt, "stderr", msg))
        elif proc == "U":
            out.append((dt, "stdout", f"{API} INFO:     {msg}"))
        else:
            head = {"A": API, "E": engine, "-": ""}[proc]
            out.append((dt, "stdout", vllm_prefix(t0 + dt, "INFO", where, head) + msg))
    return out


def vllm_stats(
    t: float,
    prompt_tps: float,
    gen_tps: float,
    running: int,
    waiting: int,
    kv: float,
    prefix_hit: float,
) -> str:
    """Return vLLM V1's periodic ``Engine 000: Avg prompt throughput ...`` stats line."""
    return vllm_prefix(t, "INFO", "loggers.py:123") + (
        f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
        f"Avg generation throughput: {gen_tps:.1f} tokens/s, Running: {running} reqs, "
        f"Waiting: {waiting} reqs, GPU KV cache usage: {kv * 100:.1f}%, "
        f"Prefix cache hit rate: {prefix_hit * 100:.1f}%"
    )


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


def uvicorn_access(client: str, method: str, path: str, status: int, prefix: str = "") -> str:
    """Return a uvicorn access line, ``INFO:     ip:port - "POST /x HTTP/1.1" 200 OK``."""
    head = f"{prefix} " if prefix else ""
    return f'{head}INFO:     {client} - "{method} {path} HTTP/1.1" {status} {_REASONS[status]}'


@dataclass(frozen=True, slots=True)
class OomNumbers:
    """The figures of one ``torch.OutOfMemoryError`` message, in bytes."""

    tried: float
    capacity: float
    free: float
    reserved_unallocated: float
    non_torch: float = 0.79 * GIB

    def message(self) -> str:
        """Return PyTorch's ``torch.OutOfMemoryError: CUDA out of memory...`` line."""
        in_use = self.capacity - self.free
        allocated = in_use - self.non_torch - self.reserved_unallocated
        return (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{torch_size(self.tried)}. GPU 0 has a total capacity of "
            f"{torch_size(self.capacity)} of which {torch_size(self.free)} is free. Including "
            f"non-PyTorch memory, this process has {torch_size(in_use)} memory in use. Of the "
            f"allocated memory {torch_size(allocated)} is allocated by PyTorch, and "
            f"{torch_size(self.reserved_unallocated)} is reserved by PyTorch but unallocated. "
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/"
            "cuda.html#environment-variables)"
        )


# Traceback frames, one per row: path|line|function|code ({d} = site-packages of the image).
_ENGINE_FRAMES = """\
{d}/vllm/v1/engine/core.py|691|run_engine_core|engine_core.run_busy_loop()
{d}/vllm/v1/engine/core.py|718|run_busy_loop|self._process_engine_step()
{d}/vllm/v1/engine/core.py|743|_process_engine_step|outputs, model_executed = self.step_fn()
{d}/vllm/v1/engine/core.py|288|step|model_output = self.execute_model_with_error_logging(
{d}/vllm/v1/engine/core.py|265|execute_model_with_error_logging|return model_fn(scheduler_output)
"""
_LOGITS_FRAMES = """\
{d}/vllm/v1/worker/gpu_model_runner.py|1620|execute_model|logits = self.model.compute_logits(
{d}/vllm/model_executor/layers/logits_processor.py|104|_get_logits|logits = lm_head.quant_\
method.apply(
"""
_API_FRAMES = """\
{d}/vllm/v1/engine/async_llm.py|375|output_handler|outputs = await engine_core.get_output_async()
{d}/vllm/v1/engine/core_client.py|751|get_output_async|raise self._format_exception(outputs)
"""
_MP_FRAMES = """\
/usr/lib/python3.12/multiprocessing/process.py|314|_bootstrap|self.run()
/usr/lib/python3.12/multiprocessing/process.py|108|run|self._target(*self._args, **self._kwargs)
{d}/vllm/v1/engine/core.py|704|run_engine_core|raise e
"""


def frames(table: str, site: str = DIST) -> list[str]:
    """Expand ``path|line|function|code`` rows into Python traceback lines."""
    out: list[str] = []
    for row in table.replace("{d}", site).splitlines():
        path, lineno, func, code = row.split("|", 3)
        out += [f'  File "{path}", line {lineno}, in {func}', f"    {code}"]
    return out


def vllm_oom_death(
    t: float, engine: str, oom: OomNumbers, clients: Sequence[str], where: str | None = None
) -> list[Line]:
    """Return a vLLM V1 engine death by CUDA OOM, one line per record, then the shutdown.

    ``where``: the innermost frames (``path|line|function|code`` rows) below
    ``execute_model``: by default (None) the logits of the step.

    Shape of https://github.com/noonghunna/club-3090/issues/16 and issues/58: the engine
    core logs the traceback ending in ``torch.OutOfMemoryError``, the API server raises
    ``EngineDeadError``, in-flight requests (``clients``) get 500, multiprocessing prints
    the traceback again on stderr, and uvicorn shuts down.
    """
    dump = vllm_prefix(t, "ERROR", "dump_input.py:69", engine)
    config = f"model='{MODEL}', dtype=torch.bfloat16, max_seq_len=32768, enable_prefix_caching=True"
    err = vllm_prefix(t, "ERROR", "core.py:700", engine)
    core = ["EngineCore encountered a fatal error.", "Traceback (most recent call last):"]
    out: list[Line] = [
        (
            0.0,
            "stdout",
            f"{dump}Dumping input data for V1 LLM engine (v{VLLM_VERSION}) with config: {config}",
        ),
        *[
            (0.001, "stdout", err + text)
            for text in [*core, *frames(_ENGINE_FRAMES + (where or _LOGITS_FRAMES)), oom.message()]
        ],
    ]
    out += _api_server_death(t, clients)
    name = engine.split()[0].lstrip("(")
    mp = [f"Process {name}:", "Traceback (most recent call last):", *frames(_MP_FRAMES)]
    out += [(0.02, "stderr", f"{engine} {text}") for text in [*mp, oom.message()]]
    shutdown = (
        "Shutting down",
        "Waiting for application shutdown.",
        "Application shutdown complete.",
        "Finished server process [1]",
    )
    return out + [(0.9, "stdout", f"{API} INFO:     {msg}") for msg in shutdown]


def _api_server_death(t: float, clients: Sequence[str]) -> list[Line]:
    """Return the API server's ``EngineDeadError`` and the 500s of in-flight requests."""
    api = vllm_prefix(t, "ERROR", "async_llm.py:416")
    dead = [
        "AsyncLLM output_handler failed.",
        "Traceback (most recent call last):",
        *frames(_API_FRAMES),
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
        "See stack trace (above) for the root cause.",
    ]
    out: list[Line] = [(0.004, "stdout", api + text) for text in dead]
    return out + [(0.01, "stdout", uvicorn_access(c, "POST", CHAT, 500, API)) for c in clients]


def nginx_time_local(t: float) -> str:
    """Return nginx ``$time_local`` in UTC, e.g. ``14/Mar/2025:09:00:03 +0000``."""
    return utc(t, "%d/%b/%Y:%H:%M:%S +0000")


@dataclass(frozen=True, slots=True)
class Upstream:
    """The upstream part of one ingress-nginx access line; each field may list retries."""

    name: str
    addr: str = "-"
    length: str = "-"
    time: str = "-"
    status: str = "-"


def ingress_access(
    t: float,
    client: str,
    request: str,
    status: int,
    body_bytes: int,
    agent: str,
    request_length: int,
    request_time: float,
    up: Upstream,
    req_id: str,
) -> str:
    """Return one ingress-nginx access line in the default ``upstreaminfo`` log format.

    https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/log-format/
    """
    return (
        f'{client} - - [{nginx_time_local(t)}] "{request} HTTP/1.1" {status} {body_bytes} '
        f'"-" "{agent}" {request_length} {request_time:.3f} [{up.name}] [] {up.addr} '
        f"{up.length} {up.time} {up.status} {req_id}"
    )


def nginx_error(
    t: float, conn: int, what: str, client: str, host: str, request: str, upstream_url: str
) -> str:
    """Return an nginx error_log line about an upstream failure (ingress-nginx stderr)."""
    return (
        f"{utc(t, '%Y/%m/%d %H:%M:%S')} [error] 31#31: *{conn} {what}, client: {client}, "
        f'server: {host}, request: "{request} HTTP/1.1", upstream: "{upstream_url}", '
        f'host: "{host}"'
    )


def klog_warning(t: float, where: str, msg: str) -> str:
    """Return a klog warning line as the ingress-nginx controller writes it."""
    micros = round((t % 1) * 1e6) % 1_000_000
    return f"W{utc(t, '%m%d %H:%M:%S')}.{micros:06d}       7 {where}] {msg}"


def nginx_combined(
    t: float, client: str, request: str, status: int, size: int, agent: str, forwarded: str
) -> str:
    """Return a plain nginx ``main`` access line (a web-frontend container's own log)."""
    return (
        f'{client} - - [{nginx_time_local(t)}] "{request} HTTP/1.1" {status} {size} "-" '
        f'"{agent}" "{forwarded}"'
    )


def prometheus_log(t: float, caller: str, msg: str) -> str:
    """Return a Prometheus server logfmt line (monitoring noise)."""
    millis = round((t % 1) * 1000) % 1000
    stamp = utc(t, "%Y-%m-%dT%H:%M:%S")
    return f"ts={stamp}.{millis:03d}Z caller={caller} level=info component=tsdb msg={msg}"


def pylog(t: float, level: str, logger: str, msg: str) -> str:
    """Return a Python ``logging`` line in the ``%(asctime)s %(levelname)s %(name)s`` style."""
    millis = round((t % 1) * 1000) % 1000
    return f"{utc(t, '%Y-%m-%d %H:%M:%S')},{millis:03d} {level} {logger}: {msg}"


_UVICORN_UP = (
    "Started server process [1]",
    "Waiting for application startup.",
    "Application startup complete.",
    "Uvicorn running on http://0.0.0.0:8080 (Press CTRL+C to quit)",
)


def _python_service(t: float, steps: Sequence[tuple[float, str, str]]) -> list[Line]:
    """Return Python logging lines then uvicorn's start-up, all on stderr as uvicorn does."""
    out = [(dt, "stderr", pylog(t + dt, "INFO", name, msg)) for dt, name, msg in steps]
    last = steps[-1][0] + 0.3
    return out + [(last, "stderr", f"INFO:     {msg}") for msg in _UVICORN_UP]


def embedder_startup(t: float) -> list[Line]:
    """Return the embedder's start-up: torch and allocator settings, model load, uvicorn."""
    env = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    return _python_service(
        t,
        [
            (
                0.0,
                "embedder.app",
                f"torch 2.4.1+cu121, CUDA available: True (NVIDIA H100 80GB HBM3), {env}",
            ),
            (0.4, "embedder.model", "loading BAAI/bge-large-en-v1.5 on cuda:0 (float16)"),
            (
                6.6,
                "embedder.model",
                "model ready in 6.2 s: max_seq_length=512, encode batch_size=256, "
                "DataLoader num_workers=4",
            ),
        ],
    )


def embedder_warnings(texts: int) -> list[tuple[float, str]]:
    """Return (seconds before the kill, text) of the embedder's host-memory warnings."""
    batches = -(-texts // 256)
    return [
        (
            25.0,
            f"request carries {texts} texts; tokenizing in {batches} batches of 256 "
            "with 4 DataLoader workers",
        ),
        (
            9.0,
            "host memory high: resident set 14.6 GiB of the 16 GiB container limit "
            "(tokenizer output queues)",
        ),
    ]


def reranker_startup(t: float) -> list[Line]:
    """Return the reranker's start-up: model on the GPU, database pool, uvicorn."""
    return _python_service(
        t,
        [
            (0.0, "reranker.model", "loading BAAI/bge-reranker-v2-m3 on cuda:0 (float16)"),
            (3.8, "reranker.model", "model ready in 3.8 s"),
            (
                4.0,
                "reranker.store",
                "catalog-db pool ready (postgresql://reranker@10.96.41.17:5432/"
                "catalog, min_size=2, max_size=10)",
            ),
        ],
    )
