"""Safe batch ceilings for a model on a GPU: the calculation behind ``detector ceilings``. Pure.

``parse_model_config`` reads what sizes a model from its Hugging Face config.json (a multimodal
config's ``text_config`` first, then the top level) and names a missing field in a ConfigError;
``estimate_parameters`` counts the weights of a dense or mixture-of-experts decoder. ``compute``
picks each figure from the command line, the engine's startup log or the estimate, in that
order, and runs the one calculation the lower-batch-ceiling runbook step uses too
(detector.capacity.sizing: ``kv_capacity_from_memory`` or ``kv_capacity_from_evidence``, then
``safe_ceilings`` and ``ceiling_from_evidence``). Config fields:
https://huggingface.co/docs/transformers/main_classes/configuration
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from detector.capacity.sizing import (
    BLOCK_TOKENS,
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    GIB,
    KNOWN_ENGINES,
    VLLM_BATCHED_TOKENS_LARGE_GPU,
    VLLM_BATCHED_TOKENS_OTHER_GPU,
    KvCapacity,
    SafeCeilings,
    ceiling_from_evidence,
    check_tensor_parallel,
    coerce_float,
    coerce_int,
    connection_limit,
    infer_engine,
    kv_bytes_per_token,
    kv_capacity_from_evidence,
    kv_capacity_from_memory,
    kv_heads_per_gpu,
    safe_ceilings,
)
from detector.errors import ConfigError

DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (docs: engine_args)
UTILIZATION_PARAM = {
    "vllm": "gpu_memory_utilization",
    "tgi": "cuda_memory_fraction",
    "sglang": "mem_fraction_static",
}
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
MIN_MAX_LEN = BLOCK_TOKENS  # a shorter --max-len is no request length (one KV-cache block)
_NO_LENGTH_FACTOR = frozenset({"su", "longrope", "llama3"})  # RoPE types whose context is as is
_NESTED = ("text_config", "llm_config", "language_config")  # a multimodal model's language part
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})  # q/k/v biases
_EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")
_SOURCED = {  # the *_source key -> the figure it explains
    "utilization_source": "utilization",
    "weights_source": "weights_bytes",
    "activation_reserve_source": "activation_reserve_bytes",
    "kv_cache_source": "kv_cache_tokens",
    "max_model_len_source": "max_model_len",
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What a Hugging Face config.json says about the KV cache and the weights of a model."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str | None
    hidden_size: int | None
    attention_heads: int | None
    vocab_size: int | None
    intermediate_size: int | None
    max_position_embeddings: int | None
    tied_embeddings: bool
    qkv_bias: bool
    experts: int
    expert_intermediate_size: int | None
    shared_intermediate_size: int
    dense_layers: int
    quantization: str | None  # quantization_config.quant_method (the weights are smaller)
    context_tokens: int | None = None  # the longest request the engine accepts (_context)


def parse_model_config(doc: Any, source: str = "config.json") -> ModelShape:
    """Read a ModelShape from a parsed config.json; ConfigError naming what is missing.

    num_key_value_heads falls back to num_attention_heads (no GQA), head_dim to hidden_size /
    num_attention_heads, the dtype is torch_dtype or dtype. Field names:
    https://huggingface.co/docs/transformers/main_classes/configuration
    """
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: not a JSON object")
    nested = next((doc[k] for k in _NESTED if isinstance(doc.get(k), Mapping)), None)
    scopes: list[Mapping[str, Any]] = [nested, doc] if nested is not None else [doc]
    where = "text_config and the top level" if nested is not None else "the top level"

    def get(key: str) -> Any:
        return next((s[key] for s in scopes if s.get(key) is not None), None)

    def count(key: str) -> int | None:
        value = coerce_int(get(key))
        return value if value is not None and value > 0 else None

    def need(value: int | None, what: str) -> int:
        if value is None:
            raise ConfigError(f"{source}: {what} missing or not a positive integer (in {where})")
        return value

    if get("kv_lora_rank") is not None:
        raise ConfigError(
            f"{source}: multi-head latent attention (kv_lora_rank) caches one compressed latent, "
            "not K and V per head; the per-head formula does not apply to this model"
        )
    heads, hidden = count("num_attention_heads"), count("hidden_size")
    derived = hidden // heads if hidden and heads else None
    head_dim = need(count("head_dim") or derived, "head_dim (and hidden_size/num_attention_heads)")
    dtype = get("torch_dtype") or get("dtype")
    experts = next((n for k in _EXPERT_KEYS if (n := count(k))), 0)
    expert_ffn = count("moe_intermediate_size") or count("intermediate_size")
    shared = count("shared_expert_intermediate_size") or (
        (count("n_shared_experts") or 0) * (count("moe_intermediate_size") or 0)
    )
    model_type = str(get("model_type") or "")
    quant = get("quantization_config")
    architectures = doc.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else model_type
    return ModelShape(
        name=str(name or "unknown"),
        layers=need(count("num_hidden_layers"), "num_hidden_layers"),
        kv_heads=need(
            count("num_key_value_heads") or heads, "num_key_value_heads (and num_attention_heads)"
        ),
        head_dim=head_dim,
        dtype=str(dtype).removeprefix("torch.") if dtype else None,
        hidden_size=hidden,
        attention_heads=heads,
        vocab_size=count("vocab_size"),
        intermediate_size=count("intermediate_size"),
        max_position_embeddings=count("max_position_embeddings"),
        tied_embeddings=get("tie_word_embeddings") is True,
        qkv_bias=get("attention_bias") is True or model_type in _QKV_BIAS_TYPES,
        experts=experts,
        expert_intermediate_size=expert_ffn if experts else None,
        shared_intermediate_size=shared if experts else 0,
        dense_layers=(coerce_int(get("first_k_dense_replace")) or 0) if experts else 0,
        quantization=str(quant.get("quant_method", "yes")) if isinstance(quant, Mapping) else None,
        context_tokens=_context(count("max_position_embeddings"), get("rope_scaling")),
    )


def _context(positions: int | None, rope: Any) -> int | None:
    """Return the longest request length the engine derives from config.json, None: unknown.

    max_position_embeddings, times the RoPE scaling factor unless the type is su, longrope or
    llama3 (YaRN scales original_max_position_embeddings): vLLM ``_get_and_verify_max_len``
    (https://github.com/vllm-project/vllm/blob/main/vllm/config/model.py).
    """
    if positions is None or not isinstance(rope, Mapping):
        return positions
    kind = rope.get("rope_type") or rope.get("type")
    factor = coerce_float(rope.get("factor"))
    if kind in _NO_LENGTH_FACTOR or factor is None or factor < 1:
        return positions
    if kind == "yarn":
        positions = coerce_int(rope.get("original_max_position_embeddings")) or positions
    return int(positions * factor)


def estimate_parameters(shape: ModelShape) -> int:
    """Return the parameter count of a decoder-only transformer with a gated (SwiGLU) MLP.

    vocab x hidden for the embeddings (twice unless tie_word_embeddings); per layer q and o
    (hidden x heads x head_dim each), k and v (hidden x KV heads x head_dim each; Qwen2 adds
    q/k/v biases), the MLP 3 x hidden x intermediate or, in MoE layers, experts x 3 x hidden x
    expert intermediate + router hidden x experts + shared experts, and two RMSNorms; a final
    norm. Layer layouts: transformers' modeling_llama.py, modeling_qwen2.py and
    modeling_mixtral.py (https://github.com/huggingface/transformers). Exact for Llama-3.1-8B
    (8,030,261,248) and Mixtral-8x7B (46,702,792,704); vision towers are not counted. Raises
    ConfigError naming the fields it lacks.
    """
    s = shape
    missing = [
        key
        for key, value in (
            ("hidden_size", s.hidden_size),
            ("num_attention_heads", s.attention_heads),
            ("vocab_size", s.vocab_size),
            ("intermediate_size", s.intermediate_size or s.expert_intermediate_size),
        )
        if not value
    ]
    if missing or not s.hidden_size or not s.attention_heads or not s.vocab_size:
        raise ConfigError(
            f"cannot estimate the weights: config.json has no {', '.join(missing)}; "
            "pass --weights-bytes or --params"
        )
    hidden, q_width, kv_width = (
        s.hidden_size,
        s.attention_heads * s.head_dim,
        s.kv_heads * s.head_dim,
    )
    attention = 2 * hidden * q_width + 2 * hidden * kv_width
    attention += q_width + 2 * kv_width if s.qkv_bias else 0
    dense_mlp = 3 * hidden * (s.intermediate_size or 0)
    moe_layers = max(0, s.layers - s.dense_layers) if s.experts else 0
    expert_mlp = 3 * hidden * (s.expert_intermediate_size or 0)
    moe_mlp = s.experts * expert_mlp + hidden * s.experts + 3 * hidden * s.shared_intermediate_size
    mlp = (s.layers - moe_layers) * dense_mlp + moe_layers * moe_mlp
    embeddings = s.vocab_size * hidden * (1 if s.tied_embeddings else 2)
    return embeddings + s.layers * (attention + 2 * hidden) + mlp + hidden


def dtype_bytes(name: str | None, what: str, *, also: str = "", hint: str = "") -> int:
    """Return the bytes of one element of dtype ``name``; ConfigError when unknown or absent.

    ``what`` names the setting the dtype came from (``--dtype``, ``--kv-cache-dtype`` ...);
    ``also`` is an accepted value besides the dtypes (``auto``), ``hint`` ends the message.
    """
    if name is None:
        raise ConfigError(f"{what}: config.json has no torch_dtype or dtype; pass --dtype")
    size = DTYPE_BYTES.get(name.lower().removeprefix("torch."))
    if size is None:
        accepted = ", ".join([also, *DTYPE_BYTES] if also else DTYPE_BYTES)
        raise ConfigError(f"{what}: unknown dtype {name!r}; accepted: {accepted}{hint}")
    return size


def _dtypes(req: Request) -> tuple[str | None, str | None, int]:
    """Return (weights dtype, KV-cache dtype, KV bytes per element), each checked at its source.

    A wrong value is reported under the option or config field it came from: ``--dtype``,
    ``--kv-cache-dtype``, or config.json's torch_dtype (the KV cache's with ``auto``).
    """
    if req.dtype is not None:
        dtype_bytes(req.dtype, "--dtype", hint=" (quantized weights: give --weights-bytes)")
    dtype = req.dtype or req.shape.dtype
    if req.kv_cache_dtype != "auto":
        element = dtype_bytes(req.kv_cache_dtype, "--kv-cache-dtype", also="auto")
        return dtype, req.kv_cache_dtype, element
    hint = " (--kv-cache-dtype auto takes it; give --kv-cache-dtype)"
    return dtype, dtype, dtype_bytes(dtype, "config.json torch_dtype", hint=hint)


def _check_request(req: Request) -> None:
    """Raise ConfigError naming the option when a value is out of range for the model."""
    shape, tp = req.shape, req.tensor_parallel
    try:
        check_tensor_parallel(shape.attention_heads, shape.kv_heads, tp)
    except ValueError as exc:
        raise ConfigError(f"--tensor-parallel {tp}: {exc}") from exc
    if req.max_len is None:
        return
    if req.max_len < MIN_MAX_LEN:
        raise ConfigError(
            f"--max-len {req.max_len}: a request length is at least {MIN_MAX_LEN} tokens "
            "(one KV-cache block), e.g. 32768"
        )
    if shape.context_tokens is not None and req.max_len > shape.context_tokens:
        raise ConfigError(
            f"--max-len {req.max_len}: over the model's context of {shape.context_tokens:,} "
            "tokens (config.json max_position_embeddings, RoPE scaling); engines refuse it"
        )


@dataclass(frozen=True, slots=True)
class EngineLog:
    """What an engine's startup log says: merged engine_config attrs and memory figures."""

    evidence: dict[str, Any]
    weights_bytes_per_gpu: int | None
    reserve_bytes: int | None


@dataclass(frozen=True, slots=True)
class Request:
    """The parsed inputs of one ``detector ceilings`` run; sizes in bytes, None: not given."""

    shape: ModelShape
    gpu_bytes: int
    utilization: float | None
    tensor_parallel: int
    max_len: int | None
    engine: str | None
    weights_bytes: int | None
    params: int | None
    reserve_bytes: int | None
    dtype: str | None
    kv_cache_dtype: str
    replicas_left: int | None
    log: EngineLog | None


def compute(req: Request) -> dict[str, Any]:
    """Return the ceilings document for ``req`` (the --json output); ConfigError on bad input.

    Keys: the model (model, dtype, kv_cache_dtype, layers, kv_heads, head_dim,
    tensor_parallel, kv_heads_per_gpu); sizes in bytes (gpu_memory_bytes, kv_bytes_per_token
    for the whole model and kv_bytes_per_token_per_gpu, weights_bytes and
    weights_bytes_per_gpu, activation_reserve_bytes and kv_budget_bytes of one GPU);
    utilization (0-1); kv_cache_tokens of one replica; max_model_len, max_num_seqs,
    max_num_batched_tokens and sequences_at_max_model_len; fits; engines ({engine: {its
    parameter: value}}); a ``*_source`` for each chosen figure, from_engine_log (the figures
    the log gave), weights_estimated, basis; gateway with ``replicas_left``; runbook_step (what
    the lower-batch-ceiling step would propose) with a log.
    """
    log = req.log or EngineLog({}, None, None)
    shape, tp = req.shape, req.tensor_parallel
    _check_request(req)
    utilization, utilization_source = _utilization(req, log.evidence)
    dtype, kv_dtype, element = _dtypes(req)
    try:
        per_gpu = kv_bytes_per_token(
            shape.layers, shape.kv_heads, shape.head_dim, element, tensor_parallel=tp
        )
    except ValueError as exc:
        raise ConfigError(f"--tensor-parallel {tp}: {exc}") from exc
    weights, weights_per_gpu, weights_source, estimated = _weights(req, log, dtype)
    reserve, reserve_source = _reserve(req, log)
    capacity = _capacity(req, log.evidence, utilization, weights_per_gpu, reserve, per_gpu)
    max_len, max_len_source = _max_len(req, log.evidence)
    safe = safe_ceilings(capacity, max_len, batched_tokens=_batched(req, log.evidence))
    doc: dict[str, Any] = {
        **_describe_model(req, dtype, kv_dtype, element),
        "gpu_memory_bytes": req.gpu_bytes,
        "utilization": utilization,
        "utilization_source": utilization_source,
        "kv_bytes_per_token_per_gpu": per_gpu,
        "weights_bytes": weights,
        "weights_bytes_per_gpu": weights_per_gpu,
        "weights_estimated": estimated,
        "weights_source": weights_source,
        "activation_reserve_bytes": reserve,
        "activation_reserve_source": reserve_source,
        "kv_budget_bytes": capacity.budget_bytes
        if capacity.budget_bytes is not None
        else capacity.tokens * per_gpu,
        "kv_cache_tokens": capacity.tokens,
        "kv_cache_source": "engine log" if capacity.from_log else "computed",
        "max_model_len": max_len,
        "max_model_len_source": max_len_source,
        "sequences_at_max_model_len": round(safe.sequences, 2),
        "max_num_seqs": safe.max_num_seqs,
        "max_num_batched_tokens": safe.max_num_batched_tokens,
        "fits": safe.max_num_seqs > 0,
        "engines": _engines(req, log.evidence, safe, utilization),
        "basis": safe.basis,
    }
    logged = [key for src, key in _SOURCED.items() if doc[src].startswith("engine log")]
    doc["from_engine_log"] = logged
    if capacity.from_log:
        for key in ("weights", "activation_reserve"):
            doc[f"{key}_source"] += "; not used: the KV budget is the engine's own figure"
    if req.replicas_left is not None:
        limit, basis = connection_limit(req.replicas_left, safe.max_num_seqs, param="max_num_seqs")
        doc["gateway"] = {"replicas_left": req.replicas_left, "limit_connections": limit}
        doc["gateway"]["basis"] = basis
    if req.log is not None:
        doc["runbook_step"] = _runbook_step(req, log.evidence, capacity, max_len)
    return doc


def _describe_model(
    req: Request, dtype: str | None, kv_dtype: str | None, element: int
) -> dict[str, Any]:
    shape, tp = req.shape, req.tensor_parallel
    return {
        "model": shape.name,
        "dtype": dtype,
        "kv_cache_dtype": kv_dtype,
        "layers": shape.layers,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "tensor_parallel": tp,
        "kv_heads_per_gpu": kv_heads_per_gpu(shape.kv_heads, tp),
        "kv_bytes_per_token": kv_bytes_per_token(
            shape.layers, shape.kv_heads, shape.head_dim, element
        ),
    }


def _utilization(req: Request, evidence: Mapping[str, Any]) -> tuple[float, str]:
    logged = _logged_utilization(evidence)
    if req.utilization is not None:
        value, source = req.utilization, "--utilization"
    elif logged is not None:
        value, source = logged, "engine log"
    else:
        value, source = DEFAULT_UTILIZATION, "default, as vLLM's --gpu-memory-utilization"
    if not 0 < value <= 1:
        raise ConfigError(f"utilization must be in (0, 1], got {value:g}")
    return value, source


def _logged_utilization(evidence: Mapping[str, Any]) -> float | None:
    values = (coerce_float(evidence.get(key)) for key in UTILIZATION_PARAM.values())
    return next((v for v in values if v is not None and 0 < v <= 1), None)


def _weights(req: Request, log: EngineLog, dtype: str | None) -> tuple[int, int, str, bool]:
    """Return (whole-model bytes, one GPU's bytes, where they came from, is an estimate)."""
    tp = req.tensor_parallel
    if req.weights_bytes is not None:
        return req.weights_bytes, -(-req.weights_bytes // tp), "--weights-bytes", False
    if log.weights_bytes_per_gpu is not None:
        per_gpu = log.weights_bytes_per_gpu
        return per_gpu * tp, per_gpu, "engine log (one GPU's weights as loaded)", False
    size = dtype_bytes(dtype, "--dtype" if req.dtype else "config.json torch_dtype (weights)")
    if req.params is not None:
        total = req.params * size
        return total, -(-total // tp), f"--params {req.params:,} x {size} bytes ({dtype})", False
    params = estimate_parameters(req.shape)
    source = f"estimate from the architecture: {params:,} parameters x {size} bytes ({dtype})"
    if req.shape.quantization:
        source += f"; the checkpoint is quantized ({req.shape.quantization}), so this is high"
    source += "; pass --weights-bytes, --params or --engine-log for the real figure"
    return params * size, -(-params * size // tp), source, True


def _reserve(req: Request, log: EngineLog) -> tuple[int, str]:
    if req.reserve_bytes is not None:
        return req.reserve_bytes, "--activation-reserve"
    if log.reserve_bytes is not None:
        return log.reserve_bytes, "engine log (profiled non-torch memory + activation peak)"
    source = (
        f"default {DEFAULT_ACTIVATION_RESERVE_BYTES / GIB:g} GiB for activation peak, non-torch "
        "memory and CUDA graphs: detector.capacity.sizing.DEFAULT_ACTIVATION_RESERVE_BYTES"
    )
    return DEFAULT_ACTIVATION_RESERVE_BYTES, source


def _capacity(
    req: Request,
    evidence: Mapping[str, Any],
    utilization: float,
    weights_per_gpu: int,
    reserve: int,
    per_token: int,
) -> KvCapacity:
    """Return the logged KV capacity (shifted to --utilization), else the computed one."""
    logged = kv_capacity_from_evidence(evidence, bytes_per_token=per_token)
    logged_utilization = _logged_utilization(evidence)
    if logged is None:
        return kv_capacity_from_memory(
            gpu_bytes=req.gpu_bytes,
            utilization=utilization,
            weights_bytes=weights_per_gpu,
            activation_reserve_bytes=reserve,
            bytes_per_token=per_token,
        )
    if logged_utilization is None or math.isclose(logged_utilization, utilization):
        return logged
    delta = int(req.gpu_bytes * utilization) - int(req.gpu_bytes * logged_utilization)
    tokens = max(0, logged.tokens + delta // per_token) // BLOCK_TOKENS * BLOCK_TOKENS
    budget = None if logged.budget_bytes is None else max(0, logged.budget_bytes + delta)
    basis = (
        f"{logged.basis} at the logged utilization {logged_utilization:g}, "
        f"{delta / GIB:+.2f} GiB at {utilization:g} = {tokens:,} tokens"
    )
    return KvCapacity(tokens, budget, basis, True)


def _max_len(req: Request, evidence: Mapping[str, Any]) -> tuple[int, str]:
    if req.max_len is not None:
        return req.max_len, "--max-len"
    for key in ("max_model_len", "max_total_tokens"):
        logged = coerce_int(evidence.get(key))
        if logged is not None and logged > 0:
            return logged, f"engine log ({key})"
    if req.shape.max_position_embeddings is not None:
        return req.shape.max_position_embeddings, "config.json max_position_embeddings"
    raise ConfigError("no --max-len, and config.json has no max_position_embeddings")


def _batched(req: Request, evidence: Mapping[str, Any]) -> int:
    for key in ("max_num_batched_tokens", "chunked_prefill_size"):
        logged = coerce_int(evidence.get(key))
        if logged is not None and logged > 0:
            return logged
    large = req.gpu_bytes >= 70 * GIB
    return VLLM_BATCHED_TOKENS_LARGE_GPU if large else VLLM_BATCHED_TOKENS_OTHER_GPU


def _engines(
    req: Request, evidence: Mapping[str, Any], safe: SafeCeilings, utilization: float
) -> dict[str, dict[str, float]]:
    logged = infer_engine(evidence)
    chosen = req.engine or (logged if logged in KNOWN_ENGINES else None)
    names = [chosen] if chosen else list(KNOWN_ENGINES)
    return {e: {**safe.settings(e), UTILIZATION_PARAM[e]: utilization} for e in names}


def _runbook_step(
    req: Request, evidence: Mapping[str, Any], capacity: KvCapacity, max_len: int
) -> dict[str, Any]:
    """Return what the lower-batch-ceiling step would propose from the same log and capacity."""
    config = {**evidence, "max_model_len": max_len}
    if req.engine:
        config["engine"] = req.engine
    step = ceiling_from_evidence(config, capacity=capacity)
    return {
        "param": step.param,
        "current": step.current,
        "proposed": step.proposed,
        "batched_tokens_param": step.batched_tokens_param,
        "batched_tokens_proposed": step.batched_tokens_proposed,
        "basis": step.basis,
    }
