"""What sizes a model, read from its Hugging Face config.json: the KV cache and the weights. Pure.

``parse_model_config`` reads a ``ModelShape`` (a multimodal config's ``text_config`` first, then
the top level) and names a missing field in a ConfigError; ``estimate_parameters`` counts the
weights of a dense or mixture-of-experts decoder; ``dtype_bytes`` sizes one element of a dtype.
Config fields: https://huggingface.co/docs/transformers/main_classes/configuration
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from detector.capacity.numbers import coerce_float, coerce_int
from detector.errors import ConfigError

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
_NO_LENGTH_FACTOR = frozenset({"su", "longrope", "llama3"})  # RoPE types whose context is as is
_NESTED = ("text_config", "llm_config", "language_config")  # a multimodal model's language part
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})  # q/k/v biases
_EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")


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
