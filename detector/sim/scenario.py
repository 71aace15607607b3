"""Scenario files of the endpoint simulator: YAML knobs parsed into pydantic models.

A scenario names the model (its ``config.json`` shape), the GPU, the engine's ceilings and
speeds, the replicas and the load balancer, the traffic (a steady rate with knots, bursts,
one-off requests), the clients' retries and any non-memory faults. Unknown keys are errors;
every error is one line naming the key (``ConfigError("scenario", "<file>: <key>: <what>")``).
Shipped scenarios live in ``detector/sim/scenarios/<name>.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from detector.errors import ConfigError

SCENARIO_DIR = Path(__file__).parent / "scenarios"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """The served model: its shape from config.json, its weights and load time.

    Defaults are Llama-3.1-8B-Instruct
    (https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json): 32 layers, 8 KV
    heads, head dim 128, vocab 128,256, bf16; weights 14.99 GiB as vLLM logs them ("Model
    loading took 14.9889 GiB"); ``load_s``: the range (seconds, uniform) from container start
    to Ready, drawn per start (the bundled recording's vLLM 0.10 start-up: 43 s; weights from a
    warm page cache plus torch.compile and CUDA graph capture take 1-4 min for larger models,
    https://github.com/vllm-project/vllm/issues/19824).
    """

    name: str = "meta-llama/Llama-3.1-8B-Instruct"
    layers: int = Field(32, gt=0)
    kv_heads: int = Field(8, gt=0)
    head_dim: int = Field(128, gt=0)
    dtype_bytes: int = Field(2, gt=0)
    vocab: int = Field(128_256, gt=0)
    weights_gib: float = Field(14.99, gt=0)
    load_s: tuple[float, float] = (40.0, 75.0)

    @model_validator(mode="after")
    def _load_range(self) -> ModelSpec:
        if not 0 < self.load_s[0] <= self.load_s[1]:
            raise ValueError("load_s must be (min, max) with 0 < min <= max")
        return self


class GpuSpec(_Strict):
    """One GPU per replica: nvidia-smi's name and framebuffer, and what PyTorch calls capacity.

    H100 80GB HBM3: nvidia-smi 81,559 MiB; ``torch.cuda.mem_get_info`` total 79.19 GiB
    (the ``total capacity`` of the OOM message in the bundled recording); HBM3 at 3.35 TB/s
    (NVIDIA's H100 SXM datasheet).
    """

    model: str = "NVIDIA H100 80GB HBM3"
    total_mib: int = Field(81_559, gt=0)
    capacity_gib: float = Field(79.19, gt=0)
    hbm_bytes_per_s: float = Field(3.35e12, gt=0)


class EngineSpec(_Strict):
    """The engine's kind, ceilings, speed and memory (``detector.sim.engine``, ``memory``).

    ``kind``: ``vllm`` (V1: paged KV pool, admission by blocks, preemption), ``sglang`` (a token
    pool of ``mem_fraction_static``, admission by ``new_token_ratio``, retraction) or
    ``unpaged`` (a server without paged attention: batch x length is the memory); for SGLang
    ``max_num_seqs`` is ``--max-running-requests`` and ``max_num_batched_tokens``
    ``--chunked-prefill-size``. Ceilings:
    https://docs.vllm.ai/en/latest/configuration/engine_args.html.

    Speed: an iteration takes ``iteration_overhead_s + iteration_per_seq_s x running + (weights
    + KV held) / the GPU's HBM bandwidth + prefill tokens / prefill_tokens_per_s`` (decode reads
    every weight and every KV byte once; Llama-3.1-8B on an H100: ~7 ms at batch 1, ~30 ms at
    256 requests of 1k tokens; prefill ~16 GFLOP a token at half of 989 TFLOPS is ~30k tokens/s
    for short prompts, about half for 32k ones: 20k).

    Memory: ``activation_bytes_per_token`` of a batched token (profiled); ``non_torch_gib``
    (CUDA context, NCCL, cuBLAS); ``cuda_graph_gib`` captured after the KV pool is sized, so
    beside it (vLLM: "memory_profiling does not consider CUDAGraph memory size");
    ``co_tenant_gib``: another process on the GPU; ``prompt_logprobs_bytes_per_entry``: bytes
    per ``[token, vocab]`` entry of prompt logprobs, never profiled (bf16 logits 2 + fp32
    ``log_softmax`` 4, vllm PR #52054); ``sampler_logprobs_bytes_per_entry``: of sampled
    logprobs beyond the profiled logits (fp32 ``log_softmax`` 4 + the rank compare 1);
    ``long_context_bytes_per_token``: the stand-in of ``memory``'s docstring, bounded on both
    sides: a full pool of context must fit beside it at utilization 0.95 (vLLM runs full every
    day: at most ~10 KiB for Llama-3.1-8B on an H100) and vllm#13100's three ~10.5k-token
    requests must not at 0.99 (~17 KB for its 123B model, ~6 KB scaled to an 8B model's hidden
    size): 6 KiB.
    """

    kind: Literal["vllm", "sglang", "unpaged"] = "vllm"
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(8192, gt=0)
    max_model_len: int = Field(32_768, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    mem_fraction_static: float = Field(0.88, gt=0, le=1)
    block_size: int = Field(16, gt=0)
    iteration_overhead_s: float = Field(0.002, ge=0)
    iteration_per_seq_s: float = Field(0.00005, ge=0)
    prefill_tokens_per_s: float = Field(20_000.0, gt=0)
    activation_bytes_per_token: int = Field(160 * 1024, ge=0)
    non_torch_gib: float = Field(0.79, ge=0)
    cuda_graph_gib: float = Field(0.5, ge=0)
    co_tenant_gib: float = Field(0.0, ge=0)
    prompt_logprobs_bytes_per_entry: int = Field(6, ge=0)
    sampler_logprobs_bytes_per_entry: int = Field(5, ge=0)
    long_context_bytes_per_token: float = Field(6144.0, ge=0)


class ProbeSpec(_Strict):
    """One kubelet probe on ``/health``; Kubernetes' defaults
    (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#Probe)."""

    period_s: float = Field(10.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    failure_threshold: int = Field(3, ge=1)


class PodSpec(_Strict):
    """The pods' probes, the server's ``/health`` latency and restarts that fail.

    ``/health`` answers in ``health_base_s + health_per_request_s x requests in the server``:
    vLLM's API server answers probes on the event loop that also tokenizes, detokenizes and
    streams every request. A probe slower than its timeout fails; ``failure_threshold``
    failures in a row take the pod out of the endpoints (readiness) or restart its container
    (liveness). ``liveness``: None when the pods have none. ``restart_fail_share``: the share of
    container restarts after a crash that find the dead engine's GPU memory not yet freed and
    fail at start ("Free memory on device ... is less than desired GPU memory utilization";
    vllm#42017). ``zombie_share``: the share of engine deaths after which the API server stays
    up, answers ``/health`` 200 and queues requests that are never scheduled (vllm#39863;
    before vLLM PR #21728 a dead EngineCore left ``/health`` at 200): the pod stays Ready,
    every request it takes waits for a timeout, and nothing restarts it.
    """

    readiness: ProbeSpec = ProbeSpec()
    liveness: ProbeSpec | None = None
    health_base_s: float = Field(0.005, ge=0)
    health_per_request_s: float = Field(0.0, ge=0)
    restart_fail_share: float = Field(0.0, ge=0, le=1)
    zombie_share: float = Field(0.0, ge=0, le=1)


class BalancerSpec(_Strict):
    """The ingress-nginx load balancer in front of the replicas.

    ``upstream_timeout_s``: ``proxy-read-timeout`` (default 60 s,
    https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/configmap/);
    ``endpoint_lag_s``: how long a dead pod stays in the balancer's endpoints;
    ``gateway_replicas``: controller replicas behind the cloud load balancer, arrivals spread
    evenly, each enforcing the gateway limit in its own ``limit_req`` zone (an nginx zone is
    per process: N replicas let N times the limit through).
    """

    policy: Literal["round_robin", "least_connections"] = "round_robin"
    gateway_replicas: int = Field(1, ge=1, le=16)
    upstream_timeout_s: float = Field(60.0, gt=0)
    endpoint_lag_s: float = Field(2.0, ge=0)
    host: str = "llm.example.com"


class PromptClass(_Strict):
    """One class of requests in the mix: lognormal prompt length, exponential output length;
    ``logprobs_share`` of them ask for sampled ``logprobs`` (evaluation, guardrail scoring)."""

    weight: float = Field(1.0, gt=0)
    logprobs_share: float = Field(0.0, ge=0, le=1)
    prompt_median: int = Field(600, gt=0)
    prompt_sigma: float = Field(0.8, ge=0)
    prompt_max: int = Field(16_000, gt=0)
    output_mean: int = Field(150, gt=0)
    output_max: int = Field(1024, gt=0)


class Burst(_Strict):
    """Extra arrivals in ``[start_s, end_s)``, prompts and outputs uniform in ranges.

    The rate is ``rps``, or rises linearly from ``rps`` to ``rps_end`` over the window (a ramp).
    """

    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)
    rps: float = Field(gt=0)
    rps_end: float | None = Field(None, gt=0)
    prompt_tokens: tuple[int, int] = (30_000, 32_000)
    output_tokens: tuple[int, int] = (300, 900)

    @model_validator(mode="after")
    def _ordered(self) -> Burst:
        if self.end_s <= self.start_s:
            raise ValueError("end_s must be after start_s")
        return self


class OneOff(_Strict):
    """A request at ``at_s``, and every ``every_s`` until ``until_s`` when given;
    ``prompt_logprobs`` asks for the logprobs of every prompt token (lm-eval's loglikelihood)."""

    at_s: float = Field(ge=0)
    prompt_tokens: int = Field(gt=0)
    output_tokens: int = Field(1, gt=0)
    prompt_logprobs: bool = False
    every_s: float | None = Field(None, gt=0)
    until_s: float | None = None


class TrafficSpec(_Strict):
    """Arrivals: steady rate knots ``(offset_s, rps)`` (linear between), mix, bursts, one-offs."""

    rps: list[tuple[float, float]] = Field(default_factory=lambda: [(0.0, 10.0)], min_length=1)
    mix: list[PromptClass] = Field(default_factory=lambda: [PromptClass()], min_length=1)
    bursts: list[Burst] = Field(default_factory=list)
    requests: list[OneOff] = Field(default_factory=list)

    @model_validator(mode="after")
    def _knots_in_order(self) -> TrafficSpec:
        times = [t for t, _ in self.rps]
        if times != sorted(times) or any(rate < 0 for _, rate in self.rps):
            raise ValueError("rps knots must be [offset_s, rps] in time order, rps >= 0")
        return self


class ClientSpec(_Strict):
    """Clients as the OpenAI Python SDK behaves (``_constants.py``, ``_base_client.py``,
    https://github.com/openai/openai-python): ``max_retries`` 2 (3 attempts); 408, 409, 429,
    5xx, timeouts and connection errors are retried after ``min(0.5 x 2^n, 8) s x U(0.75, 1)``;
    a request times out after ``timeout_s`` (600); ``stream_share`` of requests stream, and a
    stream cut after its 200 is not retried (the SDK reads the body outside its retry loop).
    """

    max_retries: int = Field(2, ge=0)
    initial_retry_delay_s: float = Field(0.5, ge=0)
    max_retry_delay_s: float = Field(8.0, ge=0)
    timeout_s: float = Field(600.0, gt=0)
    stream_share: float = Field(0.0, ge=0, le=1)


class Fault(_Strict):
    """A non-memory crash of replica ``replica`` at ``at_s`` (or when it next runs)."""

    at_s: float = Field(ge=0)
    replica: int = Field(0, ge=0)
    cause: Literal["illegal_memory_access"] = "illegal_memory_access"


class Scenario(_Strict):
    """One simulator scenario: the endpoint, its traffic and how long it runs (event seconds)."""

    name: str
    description: str
    duration_s: float = Field(gt=0)
    seed: int = 7
    namespace: str = "llm"
    workload: str = "vllm-llama"
    replicas: int = Field(4, gt=0, le=64)
    step_s: float = Field(0.5, gt=0, le=5)
    model: ModelSpec = ModelSpec()
    gpu: GpuSpec = GpuSpec()
    engine: EngineSpec = EngineSpec()
    balancer: BalancerSpec = BalancerSpec()
    traffic: TrafficSpec = TrafficSpec()
    clients: ClientSpec = ClientSpec()
    pods: PodSpec = PodSpec()
    faults: list[Fault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _replicas_known(self) -> Scenario:
        for fault in self.faults:
            if fault.replica >= self.replicas:
                raise ValueError(f"faults: replica {fault.replica} >= replicas {self.replicas}")
        return self


def scenario_names() -> list[str]:
    """Return the names of the shipped scenarios, sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(path_or_name: str | Path) -> Scenario:
    """Load a scenario file, or a shipped one by bare name (``default``).

    Raises ``ConfigError("scenario", detail)`` with one line naming the file and the bad key.
    """
    path = Path(path_or_name)
    if isinstance(path_or_name, str) and "/" not in path_or_name and path.suffix == "":
        path = SCENARIO_DIR / f"{path_or_name}.yaml"
        if not path.is_file():
            known = ", ".join(scenario_names())
            raise ConfigError("scenario", f"no scenario {path_or_name!r}; one of {known}")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError("scenario", f"{path}: {first}{where}") from exc
    if not isinstance(doc, dict):
        raise ConfigError("scenario", f"{path}: a mapping of knobs is expected at the top")
    try:
        return Scenario.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise ConfigError("scenario", f"{path}: {key}: {msg}") from exc
