"""Safe values for batch ceilings, computed from the model and the engine's own numbers.

DESIGN.md section 5: KV-cache bytes per token = 2 x layers x KV heads x head dim x bytes per
element; usable memory = GPU memory x utilization - weights - activation reserve; concurrent
sequences at length L = usable / (bytes per token x L). ``ceiling_from_evidence`` applies the
same idea to what the engine logged at start (its KV-cache size in tokens or its "maximum
concurrency"), and falls back to halving a documented default when nothing was logged.

Worked example (tests/unit/test_sizing.py): Llama-3.1-8B in bf16 has 32 layers, 8 KV heads and
head dim 128 (https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json), so
2 x 32 x 8 x 128 x 2 = 131,072 bytes (128 KiB) per token and 4 GiB per 32,768-token sequence.
The DESIGN's "about 13 sequences on an 80 GB GPU at 0.90" holds with: 80 GiB x 0.90 = 72 GiB,
minus 16.06 GB of weights (8,030,261,248 parameters x 2 bytes = 14.96 GiB), minus a 4 GiB
activation reserve = 53.04 GiB, / 4 GiB = 13.26 -> 13. Without a reserve it would be 14; any
reserve between about 1 and 5 GiB gives 13.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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

# Attr names that carry the KV-cache capacity in tokens, and the per-request maximum length.
_KV_TOKENS_KEYS = ("kv_cache_tokens", "max_total_num_tokens")
_SEQ_LEN_KEYS = ("max_model_len", "max_total_tokens", "context_length", "context_len")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """Return the KV-cache bytes per token: 2 (K and V) x layers x KV heads x head dim x bytes.

    Inputs come from the model's config.json (num_hidden_layers, num_key_value_heads,
    head_dim or hidden_size / num_attention_heads) and the KV-cache dtype (bf16/fp16: 2, fp8: 1).
    Source: DESIGN.md section 5; https://arxiv.org/abs/2309.06180 (section 2.3).
    Raises ValueError when an input is not positive.
    """
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("bytes_per_element", bytes_per_element),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def usable_bytes(
    gpu_bytes: int, utilization: float, weights_bytes: int, activation_reserve_bytes: int
) -> int:
    """Return the bytes left for the KV cache: GPU bytes x utilization - weights - reserve.

    ``utilization`` is the engine's memory fraction (vLLM ``--gpu-memory-utilization``,
    SGLang ``--mem-fraction-static``), in (0, 1]; the activation reserve is the peak memory of
    a forward pass at the maximum batched tokens plus CUDA graphs and non-torch allocations.
    Never negative. Source: DESIGN.md section 5;
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

    Rounded down. Source: DESIGN.md section 5. Raises ValueError when bytes_per_token or
    seq_len is not positive.
    """
    if bytes_per_token <= 0 or seq_len <= 0:
        raise ValueError("bytes_per_token and seq_len must be positive")
    return max(0, usable) // (bytes_per_token * seq_len)


def normalize_engine(name: Any) -> str:
    """Return ``vllm``, ``tgi`` or ``sglang`` for a known engine name, else ``unknown``."""
    if not isinstance(name, str):
        return "unknown"
    return _ENGINE_ALIASES.get(name.strip().lower(), "unknown")


def coerce_int(value: Any) -> int | None:
    """Return ``value`` as an int (from int, integral float or digit string), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    number = coerce_float(value)
    return int(number) if number is not None and number.is_integer() else None


def coerce_float(value: Any) -> float | None:
    """Return ``value`` as a finite float (from a number or numeric string), else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


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


def kv_fit_from_evidence(config: Mapping[str, Any], engine: str) -> tuple[int | None, str]:
    """Return (full-length sequences the KV cache holds, explanation) from engine_config attrs.

    Uses the KV-cache size in tokens (vLLM "GPU KV cache size: N tokens", SGLang
    max_total_num_tokens, TGI max_batch_total_tokens) over the per-request maximum length, or
    else vLLM's "Maximum concurrency for N tokens per request: Xx" line. (None, "") if neither.
    """
    kv_keys = (*_KV_TOKENS_KEYS, "max_batch_total_tokens") if engine == "tgi" else _KV_TOKENS_KEYS
    kv = _first_int(config, kv_keys)
    seq = _first_int(config, _SEQ_LEN_KEYS)
    if kv is not None and seq is not None:
        fit = kv[1] // seq[1]
        return fit, f"KV cache {kv[0]} {kv[1]:,} tokens / {seq[0]} {seq[1]:,} = {fit} sequences"
    concurrency = coerce_float(config.get("max_concurrency"))
    if concurrency is not None and concurrency >= 0:
        fit = math.floor(concurrency)
        per = f" of {seq[1]:,} tokens" if seq is not None else ""
        return fit, f"engine reports maximum concurrency {concurrency:g}x for requests{per}"
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
        return f"{engine} {param} {current:,} ({seen}), halved to {current // 2:,}"
    source = _DEFAULT_SOURCE.get(engine, _DEFAULT_SOURCE["unknown"])
    return (
        f"{engine} {param} not in the engine's startup lines: assumed {assumed:,}, {source} - "
        f"a default, not an observation; halved to {assumed // 2:,}"
    )


def ceiling_from_evidence(
    config: Mapping[str, Any], *, floor: int = 1, batched_tokens_floor: int = 512
) -> CeilingProposal:
    """Propose a lower batch ceiling from the latest engine_config attrs of the workload.

    new = max(floor, min(current // 2, kv_fit)), never above ``current``; ``kv_fit`` is the
    number of full-length sequences the KV cache holds (see kv_fit_from_evidence), left out
    when unknown. When the current ceiling was not logged, the engine's documented default
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
    kv_fit, kv_basis = kv_fit_from_evidence(config, engine)
    target = assumed // 2 if kv_fit is None else min(assumed // 2, kv_fit)
    raw = max(floor, target)
    proposed = raw if current is None else min(current, raw)
    basis = _current_basis(engine, param, current, assumed)
    if kv_basis:
        basis += f"; {kv_basis}"
    basis += f"; proposed {param} = max(floor {floor}, {target:,}) = {raw:,}"
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
