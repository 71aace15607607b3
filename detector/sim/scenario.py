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
    loading took 14.9889 GiB"); ``load_s`` seconds from container start to Ready (the
    bundled recording's vLLM 0.10 start-up: 43 s).
    """

    name: str = "meta-llama/Llama-3.1-8B-Instruct"
    layers: int = Field(32, gt=0)
    kv_heads: int = Field(8, gt=0)
    head_dim: int = Field(128, gt=0)
    dtype_bytes: int = Field(2, gt=0)
    vocab: int = Field(128_256, gt=0)
    weights_gib: float = Field(14.99, gt=0)
    load_s: float = Field(45.0, gt=0)


class GpuSpec(_Strict):
    """One GPU per replica: nvidia-smi's name and framebuffer, and what PyTorch calls capacity.

    H100 80GB HBM3: nvidia-smi 81,559 MiB; ``torch.cuda.mem_get_info`` total 79.19 GiB
    (the ``total capacity`` of the OOM message in the bundled recording).
    """

    model: str = "NVIDIA H100 80GB HBM3"
    total_mib: int = Field(81_559, gt=0)
    capacity_gib: float = Field(79.19, gt=0)


class EngineSpec(_Strict):
    """vLLM's ceilings and the speeds of one replica.

    ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
    ``gpu_memory_utilization``: https://docs.vllm.ai/en/latest/configuration/engine_args.html.
    ``decode_tokens_per_s``: tokens each running sequence gains per second;
    ``prefill_tokens_per_s``: prompt tokens the replica prefills per second (chunked by
    ``max_num_batched_tokens``); ``activation_bytes_per_token``: activation peak per batched
    token of a step; ``non_torch_gib``: CUDA context, NCCL and cuBLAS workspaces;
    ``logprobs_copies``: fp32-sized ``[tokens, vocab]`` tensors a prompt-logprobs prefill
    holds: logits and log-softmax (fp32), the top-k sort's values (fp32) and indices (int64,
    two) = 5.
    """

    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(8192, gt=0)
    max_model_len: int = Field(32_768, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    decode_tokens_per_s: float = Field(40.0, gt=0)
    prefill_tokens_per_s: float = Field(15_000.0, gt=0)
    activation_bytes_per_token: int = Field(160 * 1024, ge=0)
    non_torch_gib: float = Field(0.79, ge=0)
    logprobs_copies: int = Field(5, ge=1)


class BalancerSpec(_Strict):
    """The ingress-nginx load balancer in front of the replicas.

    ``upstream_timeout_s``: ``proxy-read-timeout`` (default 60 s,
    https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/configmap/);
    ``endpoint_lag_s``: how long a dead pod stays in the balancer's endpoints.
    """

    policy: Literal["round_robin", "least_connections"] = "round_robin"
    upstream_timeout_s: float = Field(60.0, gt=0)
    endpoint_lag_s: float = Field(2.0, ge=0)
    host: str = "llm.example.com"


class PromptClass(_Strict):
    """One class of requests in the mix: lognormal prompt length, exponential output length."""

    weight: float = Field(1.0, gt=0)
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
    """A single request at ``at_s``; ``prompt_logprobs`` asks for logits of every prompt token."""

    at_s: float = Field(ge=0)
    prompt_tokens: int = Field(gt=0)
    output_tokens: int = Field(1, gt=0)
    prompt_logprobs: bool = False
    attempts: int = Field(1, ge=1)


class TrafficSpec(_Strict):
    """Arrivals: steady rate knots ``(offset_s, rps)`` (linear between), mix, bursts, one-offs."""

    rps: list[tuple[float, float]] = Field(default_factory=lambda: [(0.0, 10.0)], min_length=1)
    mix: list[PromptClass] = Field(default_factory=lambda: [PromptClass()], min_length=1)
    bursts: list[Burst] = Field(default_factory=list)
    requests: list[OneOff] = Field(default_factory=list)


class ClientSpec(_Strict):
    """Clients retry a 5xx with back-off ``backoff_s x 2^k`` (jitter 0.5-1), ``max_attempts``."""

    max_attempts: int = Field(3, ge=1)
    backoff_s: float = Field(1.0, ge=0)


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
        raise ConfigError("scenario", f"{path}: {first}") from exc
    if not isinstance(doc, dict):
        raise ConfigError("scenario", f"{path}: a mapping of knobs is expected at the top")
    try:
        return Scenario.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise ConfigError("scenario", f"{path}: {key}: {msg}") from exc
