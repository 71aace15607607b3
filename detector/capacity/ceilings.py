"""Safe batch ceilings for a model on a GPU: the calculation behind ``detector ceilings``. Pure.

The model's shape comes from its config.json (``detector.capacity.model_config``). ``compute``
picks each figure from the command line, the engine's startup log or the estimate, in that
order, and runs the one calculation the lower-batch-ceiling runbook step uses too
(detector.capacity.sizing: ``kv_capacity_from_memory`` or ``kv_capacity_from_evidence``, then
``safe_ceilings`` and ``ceiling_from_evidence``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from detector.capacity.model_config import ModelShape, dtype_bytes, estimate_parameters
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
MIN_MAX_LEN = BLOCK_TOKENS  # a shorter --max-len is no request length (one KV-cache block)
_SOURCED = {  # the *_source key -> the figure it explains
    "utilization_source": "utilization",
    "weights_source": "weights_bytes",
    "activation_reserve_source": "activation_reserve_bytes",
    "kv_cache_source": "kv_cache_tokens",
    "max_model_len_source": "max_model_len",
}


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
