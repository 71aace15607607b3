"""Safe values for batch ceilings, computed from the model and the engine's own numbers.

KV-cache bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element
(the standard KV-cache size, https://arxiv.org/abs/2309.06180 section 2.3); usable memory =
GPU memory x utilization - weights - activation reserve; concurrent sequences at length L =
usable / (bytes per token x L). One path serves ``detector ceilings`` and the
lower-batch-ceiling runbook step: a ``KvCapacity`` (tokens the KV cache holds, from the
memory formula, ``kv_capacity_from_memory``, or from what the engine logged at start,
``kv_capacity_from_evidence``) goes through ``safe_ceilings`` to the engines' ceilings;
``ceiling_from_evidence`` lowers the current ceiling to at most that, or halves a documented
default when nothing was logged.

Worked example (tests/unit/test_sizing.py): Llama-3.1-8B in bf16 has 32 layers, 8 KV heads and
head dim 128 (https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json), so
2 x 32 x 8 x 128 x 2 = 131,072 bytes (128 KiB) per token and 4 GiB per 32,768-token sequence.
On an 80 GB GPU at utilization 0.90 that leaves about 13 such sequences: 80 GiB x 0.90 = 72 GiB,
minus 16.06 GB of weights (8,030,261,248 parameters x 2 bytes = 14.96 GiB), minus a 4 GiB
activation reserve = 53.04 GiB, / 4 GiB = 13.26 -> 13. Without a reserve it would be 14; any
reserve between about 1 and 5 GiB gives 13.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from detector.capacity.numbers import coerce_float, coerce_int

GIB = 1024**3

KNOWN_ENGINES = ("vllm", "tgi", "sglang")
_ENGINE_ALIASES = {
    "vllm": "vllm",
    "tgi": "tgi",
    "text-generation-inference": "tgi",
    "text_generation_inference": "tgi",
    "text-generation-launcher": "tgi",
    "sglang": "sglang",
}

# The engine's concurrency (batch) ceiling and its token-budget ceiling, by engine.
CONCURRENCY_PARAM = {
    "vllm": "max_num_seqs",
    "tgi": "max_concurrent_requests",
    "sglang": "max_running_requests",
}
BATCHED_TOKENS_PARAM = {"vllm": "max_num_batched_tokens", "tgi": "max_batch_total_tokens"}

VLLM_DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs`` for the OpenAI server: 256 in V0, and in V1 on GPUs under
70 GiB and on A100; 1024 on larger GPUs (H100, H200, MI300x) in recent releases. 256 is used
when the real value is unknown because halving it gives the lower, safer ceiling. Source:
``EngineArgs.get_batch_defaults`` in
https://github.com/vllm-project/vllm/blob/main/vllm/engine/arg_utils.py"""

TGI_DEFAULT_MAX_CONCURRENT_REQUESTS = 128
"""TGI launcher default for ``MAX_CONCURRENT_REQUESTS``. Source:
https://huggingface.co/docs/text-generation-inference/reference/launcher"""

SGLANG_ASSUMED_MAX_RUNNING_REQUESTS = 256
"""SGLang derives ``max_running_requests`` from its KV pool when unset, so it has no fixed
default; 256 is an assumption, stated as such in the basis. Source:
https://github.com/sgl-project/sglang/blob/main/docs/backend/server_arguments.md"""

DEFAULT_CONCURRENCY = {
    "vllm": VLLM_DEFAULT_MAX_NUM_SEQS,
    "tgi": TGI_DEFAULT_MAX_CONCURRENT_REQUESTS,
    "sglang": SGLANG_ASSUMED_MAX_RUNNING_REQUESTS,
}
_DEFAULT_SOURCE = {
    "vllm": "vLLM's default (256 in V0 and on GPUs under 70 GiB or A100; 1024 on larger GPUs "
    "in recent releases; vllm/engine/arg_utils.py get_batch_defaults)",
    "tgi": "TGI's launcher default (huggingface.co/docs/text-generation-inference/reference/"
    "launcher)",
    "sglang": "an assumed value (SGLang derives it from its KV pool when unset)",
    "unknown": "an assumed value (engine unknown; vLLM's default 256 used)",
}

BLOCK_TOKENS = 16
"""vLLM's default KV-cache block size on CUDA (``--block-size``): the cache is allocated in whole
blocks, so a computed capacity is rounded down to it. Source:
https://docs.vllm.ai/en/latest/configuration/engine_args.html"""

DEFAULT_ACTIVATION_RESERVE_BYTES = 4 * GIB
"""Memory per GPU kept outside weights and KV cache: the activation peak of a forward pass at the
batched-token budget, non-torch memory (NCCL, cuBLAS workspaces) and CUDA graphs. 4 GiB covers
the figures vLLM's memory profiler logs in the public examples at hand - activation peak
2.53 GiB + non-torch 0.39 GiB (https://github.com/vllm-project/vllm/issues/11251), 0.23 +
0.16 GiB (shared corpus lookalikes/019) - with room left for CUDA graphs, and gives the module's
worked example its 13 sequences. ``detector ceilings --engine-log`` uses the logged figures
instead when the profiler line is there; ``--activation-reserve`` overrides it."""

VLLM_BATCHED_TOKENS_LARGE_GPU = 8192
VLLM_BATCHED_TOKENS_OTHER_GPU = 2048
"""vLLM's default ``max_num_batched_tokens`` for the OpenAI server: 8192 on GPUs of 70 GiB or
more (except A100, which gets 2048), else 2048. Source: ``EngineArgs.get_batch_defaults`` in
https://github.com/vllm-project/vllm/blob/main/vllm/engine/arg_utils.py"""

# Attr names that carry the KV-cache capacity in tokens, and the per-request maximum length.
_KV_TOKENS_KEYS = ("kv_cache_tokens", "max_total_num_tokens")
_SEQ_LEN_KEYS = ("max_model_len", "max_total_tokens", "context_length", "context_len")


def kv_heads_per_gpu(kv_heads: int, tensor_parallel: int = 1) -> int:
    """Return the KV heads one tensor-parallel rank holds: kv_heads / N, at least 1.

    With fewer KV heads than ranks each head is replicated, so every rank still holds one.
    Source: vLLM ``ModelConfig.get_num_kv_heads``
    (https://github.com/vllm-project/vllm/blob/main/vllm/config/model.py). Raises ValueError
    when an input is not positive or the heads do not split evenly over the ranks.
    """
    if kv_heads <= 0 or tensor_parallel <= 0:
        raise ValueError("kv_heads and tensor_parallel must be positive")
    bigger, smaller = max(kv_heads, tensor_parallel), min(kv_heads, tensor_parallel)
    if bigger % smaller:
        raise ValueError(
            f"{kv_heads} KV heads do not split evenly over tensor parallel {tensor_parallel}"
        )
    return max(1, kv_heads // tensor_parallel)


def tensor_parallel_sizes(attention_heads: int | None, kv_heads: int) -> list[int]:
    """Return the tensor-parallel sizes a model's attention can be split over, smallest first.

    A size must divide the attention heads (vLLM ``ModelConfig.verify_with_parallel_config``:
    "Total number of attention heads must be divisible by tensor parallel size") and either
    divide the KV heads or be a multiple of them (each KV head then replicated,
    ``kv_heads_per_gpu``). Without the attention heads, the KV heads rule alone, up to
    ``max(kv_heads, 64)``.
    """
    limit = attention_heads if attention_heads else max(kv_heads, 64)
    return [
        n
        for n in range(1, limit + 1)
        if (attention_heads is None or attention_heads % n == 0)
        and (kv_heads % n == 0 or n % kv_heads == 0)
    ]


def check_tensor_parallel(attention_heads: int | None, kv_heads: int, tensor_parallel: int) -> None:
    """Raise ValueError naming the sizes that work when ``tensor_parallel`` cannot split the model.

    Rules: ``tensor_parallel_sizes``.
    """
    if tensor_parallel <= 0:
        raise ValueError(f"tensor parallel must be positive, got {tensor_parallel}")
    sizes = tensor_parallel_sizes(attention_heads, kv_heads)
    if tensor_parallel in sizes:
        return
    heads = f"{attention_heads} attention heads and " if attention_heads else ""
    raise ValueError(
        f"{heads}{kv_heads} KV heads do not split evenly over tensor parallel {tensor_parallel}"
        f" (it must divide the attention heads and divide or be a multiple of the KV heads);"
        f" sizes that work: {', '.join(map(str, sizes[:12]))}"
    )


def kv_bytes_per_token(
    layers: int, kv_heads: int, head_dim: int, bytes_per_element: int, *, tensor_parallel: int = 1
) -> int:
    """Return the KV-cache bytes per token: 2 (K and V) x layers x KV heads x head dim x bytes.

    Inputs come from the model's config.json (num_hidden_layers, num_key_value_heads,
    head_dim or hidden_size / num_attention_heads) and the KV-cache dtype (bf16/fp16: 2, fp8: 1).
    With ``tensor_parallel`` N the KV heads are those of one rank (``kv_heads_per_gpu``), so the
    result is per GPU. Source: https://arxiv.org/abs/2309.06180 (section 2.3). Raises
    ValueError when an input is not positive.
    """
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("bytes_per_element", bytes_per_element),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    return 2 * layers * kv_heads_per_gpu(kv_heads, tensor_parallel) * head_dim * bytes_per_element


def usable_bytes(
    gpu_bytes: int, utilization: float, weights_bytes: int, activation_reserve_bytes: int
) -> int:
    """Return the bytes left for the KV cache: GPU bytes x utilization - weights - reserve.

    ``utilization`` is the engine's memory fraction (vLLM ``--gpu-memory-utilization``,
    SGLang ``--mem-fraction-static``), in (0, 1]; the activation reserve is the peak memory of
    a forward pass at the maximum batched tokens plus CUDA graphs and non-torch allocations.
    Never negative. Source:
    https://docs.vllm.ai/en/latest/configuration/engine_args.html (--gpu-memory-utilization).
    Raises ValueError when utilization is outside (0, 1] or a size is negative.
    """
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    if min(gpu_bytes, weights_bytes, activation_reserve_bytes) < 0:
        raise ValueError("sizes must not be negative")
    return max(0, int(gpu_bytes * utilization) - weights_bytes - activation_reserve_bytes)


def max_concurrent_sequences(usable: int, bytes_per_token: int, seq_len: int) -> int:
    """Return how many sequences of ``seq_len`` tokens fit: usable / (bytes per token x seq_len).

    Rounded down. Raises ValueError when bytes_per_token or seq_len is not positive.
    """
    if bytes_per_token <= 0 or seq_len <= 0:
        raise ValueError("bytes_per_token and seq_len must be positive")
    return max(0, usable) // (bytes_per_token * seq_len)


def normalize_engine(name: Any) -> str:
    """Return ``vllm``, ``tgi`` or ``sglang`` for a known engine name, else ``unknown``."""
    if not isinstance(name, str):
        return "unknown"
    return _ENGINE_ALIASES.get(name.strip().lower(), "unknown")


def _gib(size: float) -> str:
    return f"{size / GIB:.2f} GiB"


@dataclass(frozen=True, slots=True)
class KvCapacity:
    """How many tokens one replica's KV cache holds, and where that figure came from.

    ``tokens`` is per replica (every tensor-parallel rank holds the same tokens);
    ``budget_bytes`` is one GPU's KV-cache memory when known; ``from_log`` is True when the
    figure is the engine's own startup line, False for the memory formula (module docstring).
    """

    tokens: int
    budget_bytes: int | None
    basis: str
    from_log: bool


def kv_capacity_from_memory(
    *,
    gpu_bytes: int,
    utilization: float,
    weights_bytes: int,
    activation_reserve_bytes: int,
    bytes_per_token: int,
) -> KvCapacity:
    """Return the KV capacity of one GPU's memory: usable bytes / bytes per token.

    Sizes are bytes of one GPU (weights and bytes per token already divided by tensor
    parallel); tokens are rounded down to whole ``BLOCK_TOKENS`` blocks. Raises ValueError as
    ``usable_bytes`` does, or when bytes_per_token is not positive.
    """
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be positive")
    budget = usable_bytes(gpu_bytes, utilization, weights_bytes, activation_reserve_bytes)
    tokens = budget // bytes_per_token // BLOCK_TOKENS * BLOCK_TOKENS
    basis = (
        f"{_gib(gpu_bytes)} x {utilization:g} - weights {_gib(weights_bytes)} - reserve "
        f"{_gib(activation_reserve_bytes)} = {_gib(budget)} for the KV cache / "
        f"{bytes_per_token:,} bytes per token = {tokens:,} tokens"
    )
    return KvCapacity(tokens, budget, basis, from_log=False)


def kv_capacity_from_evidence(
    config: Mapping[str, Any], *, bytes_per_token: int | None = None
) -> KvCapacity | None:
    """Return the KV capacity the engine logged at start (engine_config attrs), or None.

    Tried in order: KV-cache tokens (vLLM "GPU KV cache size: N tokens", SGLang
    max_total_num_tokens, and for TGI max_batch_total_tokens, its KV budget); KV-cache bytes
    (vLLM "Available KV cache memory: X GiB") / ``bytes_per_token`` of one GPU when given; vLLM
    "# GPU blocks: N" x block_size (default ``BLOCK_TOKENS``); vLLM "Maximum concurrency for L
    tokens per request: Xx" x L. Line formats: detector/events/engine_lines.py.
    """
    keys: tuple[str, ...] = _KV_TOKENS_KEYS
    if infer_engine(config) == "tgi":
        keys = (*keys, "max_batch_total_tokens")
    logged_bytes = _first_int(config, ("kv_cache_bytes",))
    budget = logged_bytes[1] if logged_bytes is not None else None
    if (kv := _first_int(config, keys)) is not None:
        return KvCapacity(kv[1], budget, f"KV cache {kv[0]} {kv[1]:,} tokens", True)
    if budget is not None and bytes_per_token:
        tokens = budget // bytes_per_token // BLOCK_TOKENS * BLOCK_TOKENS
        basis = f"KV cache {_gib(budget)} / {bytes_per_token:,} bytes per token = {tokens:,} tokens"
        return KvCapacity(tokens, budget, basis, True)
    if (blocks := _first_int(config, ("gpu_blocks",))) is not None:
        size = _first_int(config, ("block_size",)) or ("block_size", BLOCK_TOKENS)
        tokens = blocks[1] * size[1]
        basis = f"KV cache {blocks[1]:,} GPU blocks x {size[1]} tokens = {tokens:,} tokens"
        return KvCapacity(tokens, budget, basis, True)
    seq = _first_int(config, _SEQ_LEN_KEYS)
    concurrency = coerce_float(config.get("max_concurrency"))
    if seq is not None and concurrency is not None and concurrency >= 0:
        tokens = math.floor(concurrency * seq[1] + 1e-6)
        basis = (
            f"engine reports maximum concurrency {concurrency:g}x for requests of "
            f"{seq[1]:,} tokens = {tokens:,} tokens"
        )
        return KvCapacity(tokens, budget, basis, True)
    return None


@dataclass(frozen=True, slots=True)
class SafeCeilings:
    """Ceilings that keep every admitted sequence inside one replica's KV cache.

    ``max_num_seqs`` sequences of ``max_model_len`` tokens fit ``kv_cache_tokens`` (0: not
    even one does); ``max_num_batched_tokens`` is the token budget of one scheduler step.
    ``settings(engine)`` gives them under each engine's own names.
    """

    kv_cache_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    basis: str

    @property
    def sequences(self) -> float:
        """Return how many max_model_len sequences the KV cache holds, unrounded."""
        return self.kv_cache_tokens / self.max_model_len

    def settings(self, engine: str) -> dict[str, int]:
        """Return the ceilings under ``engine``'s names (vllm, tgi, sglang); KeyError otherwise.

        vLLM max_num_seqs, max_num_batched_tokens, max_model_len
        (https://docs.vllm.ai/en/latest/configuration/engine_args.html). TGI
        max_concurrent_requests, max_batch_total_tokens (its KV budget), max_input_tokens
        (max_total_tokens - 1, the most TGI accepts), max_total_tokens
        (https://huggingface.co/docs/text-generation-inference/reference/launcher). SGLang
        max_running_requests, max_total_tokens (its KV pool), chunked_prefill_size,
        context_length (https://github.com/sgl-project/sglang/blob/main/docs/backend/server_arguments.md).
        """
        seqs, length, batched = self.max_num_seqs, self.max_model_len, self.max_num_batched_tokens
        return {
            "vllm": {
                "max_num_seqs": seqs,
                "max_num_batched_tokens": batched,
                "max_model_len": length,
            },
            "tgi": {
                "max_concurrent_requests": seqs,
                "max_batch_total_tokens": self.kv_cache_tokens,
                "max_input_tokens": length - 1,
                "max_total_tokens": length,
            },
            "sglang": {
                "max_running_requests": seqs,
                "max_total_tokens": self.kv_cache_tokens,
                "chunked_prefill_size": batched,
                "context_length": length,
            },
        }[engine]


def safe_ceilings(
    capacity: KvCapacity,
    max_model_len: int,
    *,
    batched_tokens: int = VLLM_BATCHED_TOKENS_LARGE_GPU,
) -> SafeCeilings:
    """Return the ceilings that fit ``capacity`` with requests of up to ``max_model_len`` tokens.

    max_num_seqs = tokens // max_model_len (rounded down).
    max_num_batched_tokens = min(batched_tokens, tokens), at least max_num_seqs (vLLM requires
    it); chunked prefill (vLLM V1 always, SGLang chunked_prefill_size) lets a longer prompt
    take several steps. Raises ValueError when max_model_len or batched_tokens is not positive.
    """
    if max_model_len <= 0 or batched_tokens <= 0:
        raise ValueError("max_model_len and batched_tokens must be positive")
    seqs = max_concurrent_sequences(capacity.tokens, 1, max_model_len)
    batched = max(min(batched_tokens, capacity.tokens), seqs)
    basis = (
        f"{capacity.basis} / {max_model_len:,} tokens per request = {seqs} sequences; "
        f"batched tokens = min({batched_tokens:,}, KV cache) = {batched:,}"
    )
    return SafeCeilings(capacity.tokens, max_model_len, seqs, batched, basis)


def connection_limit(
    serving: int, per_replica: int, *, param: str, floor: int = 1
) -> tuple[int, str]:
    """Return the gateway's concurrent-connection limit for the capacity left, and its basis.

    limit = max(floor, max(serving, 1) x per-replica ceiling ``param``): with every replica
    down it is sized for the first one back: a limit comes from the healthy capacity left.
    """
    replicas = max(serving, 1)
    limit = max(floor, replicas * per_replica)
    basis = (
        f"limit-connections = max(floor {floor}, serving {replicas} x {param} {per_replica}) "
        f"= {limit}"
    )
    return limit, basis


@dataclass(frozen=True, slots=True)
class CeilingProposal:
    """A proposed batch ceiling for one engine, with the numbers behind it.

    ``param`` is the engine's concurrency ceiling (vLLM max_num_seqs, TGI
    max_concurrent_requests, SGLang max_running_requests); ``current`` is what its startup lines
    said (None: unknown, ``assumed_current`` is then a documented default); ``kv_fit`` is how
    many full-length sequences fit the KV cache; ``batched_tokens_*`` is the token budget (vLLM
    max_num_batched_tokens, TGI max_batch_total_tokens; None for SGLang or when unknown);
    ``max_model_len`` is the current per-request maximum, kept as is. ``basis`` explains it all.
    """

    engine: str
    param: str
    current: int | None
    assumed_current: int
    proposed: int
    kv_fit: int | None
    batched_tokens_param: str | None
    batched_tokens_current: int | None
    batched_tokens_proposed: int | None
    max_model_len: int | None
    basis: str

    @property
    def current_is_default(self) -> bool:
        """Return True when the current ceiling was not seen and a default was assumed."""
        return self.current is None


def infer_engine(config: Mapping[str, Any]) -> str:
    """Return the engine named in an engine_config mapping, or guessed from its keys."""
    engine = normalize_engine(config.get("engine"))
    if engine != "unknown":
        return engine
    for name, param in CONCURRENCY_PARAM.items():
        if coerce_int(config.get(param)) is not None:
            return name
    return "unknown"


def _first_int(config: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, int] | None:
    for key in keys:
        value = coerce_int(config.get(key))
        if value is not None and value > 0:
            return key, value
    return None


def kv_fit_from_evidence(
    config: Mapping[str, Any], capacity: KvCapacity | None = None
) -> tuple[int | None, str]:
    """Return (full-length sequences the KV cache holds, explanation) from engine_config attrs.

    The capacity is ``capacity`` when given (``detector ceilings`` computes it from the model),
    else ``kv_capacity_from_evidence``; it goes through ``safe_ceilings`` at the per-request
    maximum length. With vLLM's "Maximum concurrency ... Xx" but no length, floor(X).
    (None, "") when neither is known.
    """
    capacity = capacity if capacity is not None else kv_capacity_from_evidence(config)
    seq = _first_int(config, _SEQ_LEN_KEYS)
    if capacity is not None and seq is not None:
        fit = safe_ceilings(capacity, seq[1]).max_num_seqs
        return fit, f"{capacity.basis} / {seq[0]} {seq[1]:,} = {fit} sequences"
    concurrency = coerce_float(config.get("max_concurrency"))
    if concurrency is not None and concurrency >= 0:
        fit = math.floor(concurrency)
        return fit, f"engine reports maximum concurrency {concurrency:g}x = {fit} sequences"
    return None, ""


def _batched_tokens(
    config: Mapping[str, Any], engine: str, proposed: int, floor_tokens: int
) -> tuple[str | None, int | None, int | None, str]:
    param = BATCHED_TOKENS_PARAM.get(engine)
    current = coerce_int(config.get(param)) if param else None
    if param is None or current is None or current <= 0:
        return param, None, None, ""
    lowest = max(floor_tokens, proposed)
    seq = _first_int(config, _SEQ_LEN_KEYS)
    must_hold_request = engine == "tgi" or config.get("enable_chunked_prefill") is False
    if seq is not None and must_hold_request:
        lowest = max(lowest, seq[1])  # one full request must still fit one batch
    new = min(current, max(lowest, current // 2))
    return param, current, new, f"; {param} {current:,} -> {new:,} (halved, floor {lowest:,})"


def _current_basis(engine: str, param: str, current: int | None, assumed: int) -> str:
    if current is not None:
        seen = "seen in the engine's startup lines"
        return f"{engine} {param} {current:,} ({seen}); at most half of it: {current // 2:,}"
    source = _DEFAULT_SOURCE.get(engine, _DEFAULT_SOURCE["unknown"])
    return (
        f"{engine} {param} not in the engine's startup lines: assumed {assumed:,}, {source} - "
        f"a default, not an observation; at most half of it: {assumed // 2:,}"
    )


def _binding(half: int, kv_fit: int | None, floor: int) -> str:
    """Return which constraint set the proposed ceiling, in words."""
    target = half if kv_fit is None else min(half, kv_fit)
    if floor > target:
        return f"set by the floor {floor}"
    if kv_fit is not None and kv_fit < half:
        return "set by the KV-cache fit"
    return "set by halving the current ceiling"


def ceiling_from_evidence(
    config: Mapping[str, Any],
    *,
    floor: int = 1,
    batched_tokens_floor: int = 512,
    capacity: KvCapacity | None = None,
) -> CeilingProposal:
    """Propose a lower batch ceiling from the latest engine_config attrs of the workload.

    new = max(floor, min(current // 2, kv_fit)), never above ``current``; ``kv_fit`` is the
    number of full-length sequences the KV cache holds (``kv_fit_from_evidence``: the logged
    capacity, or ``capacity`` when given, through ``safe_ceilings``), left out when unknown.
    When the current ceiling was not logged, the engine's documented default
    (VLLM_DEFAULT_MAX_NUM_SEQS, TGI_DEFAULT_MAX_CONCURRENT_REQUESTS) is halved instead and the
    basis says it is a default. The token budget (vLLM max_num_batched_tokens, TGI
    max_batch_total_tokens) is halved too when known, never under ``batched_tokens_floor``, the
    new ceiling, or (TGI, or vLLM without chunked prefill) one full-length request.
    """
    engine = infer_engine(config)
    param = CONCURRENCY_PARAM.get(engine, "max_num_seqs")
    current = coerce_int(config.get(param))
    current = current if current is not None and current > 0 else None
    assumed = current if current is not None else DEFAULT_CONCURRENCY.get(engine, 256)
    kv_fit, kv_basis = kv_fit_from_evidence(config, capacity)
    target = assumed // 2 if kv_fit is None else min(assumed // 2, kv_fit)
    raw = max(floor, target)
    proposed = raw if current is None else min(current, raw)
    basis = _current_basis(engine, param, current, assumed)
    if kv_basis:
        basis += f"; {kv_basis}"
    half = assumed // 2
    inner = f"half {half:,}" if kv_fit is None else f"min(half {half:,}, KV fit {kv_fit:,})"
    basis += (
        f"; proposed {param} = max(floor {floor}, {inner}) = {raw:,}, "
        f"{_binding(half, kv_fit, floor)}"
    )
    if proposed != raw:
        basis += f", kept at the current {proposed:,} (a lowering step never raises a ceiling)"
    tokens_param, tokens_current, tokens_new, tokens_basis = _batched_tokens(
        config, engine, proposed, batched_tokens_floor
    )
    seq = _first_int(config, _SEQ_LEN_KEYS)
    return CeilingProposal(
        engine=engine,
        param=param,
        current=current,
        assumed_current=assumed,
        proposed=proposed,
        kv_fit=kv_fit,
        batched_tokens_param=tokens_param,
        batched_tokens_current=tokens_current,
        batched_tokens_proposed=tokens_new,
        max_model_len=seq[1] if seq is not None else None,
        basis=basis + tokens_basis,
    )
