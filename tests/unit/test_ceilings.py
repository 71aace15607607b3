"""`detector ceilings` math: config.json shapes, weights, and the ceilings of three public models.

Fixtures: tests/unit/fixtures/model_configs/ (sources in SOURCES.md). Every expected number is
hand-computed in a comment from the config values, with 80 GiB x 0.90 = 77,309,411,328 bytes
and the default 4 GiB (4,294,967,296 bytes) activation reserve.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from detector.capacity.ceilings import EngineLog, Request, compute
from detector.capacity.model_config import (
    ModelShape,
    dtype_bytes,
    estimate_parameters,
    parse_model_config,
)
from detector.capacity.sizing import GIB
from detector.cli.ceilings import (
    load_model_config,
    parse_count_arg,
    parse_size_arg,
    read_engine_log,
)
from detector.errors import ConfigError

CONFIGS = Path(__file__).parent / "fixtures" / "model_configs"
LLAMA = "llama-3.1-8b.json"
QWEN = "qwen2.5-72b-instruct.json"
MIXTRAL = "mixtral-8x7b-instruct-v0.1.json"


def shape(name: str) -> ModelShape:
    return load_model_config(CONFIGS / name)


def raw(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CONFIGS / name).read_text())
    return doc


def request(name: str, **changes: Any) -> Request:
    base = Request(
        shape=shape(name),
        gpu_bytes=80 * GIB,
        utilization=0.9,
        tensor_parallel=1,
        max_len=32_768,
        engine=None,
        weights_bytes=None,
        params=None,
        reserve_bytes=None,
        dtype=None,
        kv_cache_dtype="auto",
        replicas_left=None,
        log=None,
    )
    return replace(base, **changes)


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "head_dim", "experts", "qkv_bias"),
    [
        (LLAMA, 32, 8, 128, 0, False),  # head_dim = 4096 / 32
        (QWEN, 80, 8, 128, 0, True),  # head_dim = 8192 / 64; Qwen2 has q/k/v biases
        (MIXTRAL, 32, 8, 128, 8, False),
    ],
)
def test_shapes_of_the_fixtures(
    name: str, layers: int, kv_heads: int, head_dim: int, experts: int, qkv_bias: bool
) -> None:
    got = shape(name)
    assert (got.layers, got.kv_heads, got.head_dim) == (layers, kv_heads, head_dim)
    assert (got.experts, got.qkv_bias, got.dtype) == (experts, qkv_bias, "bfloat16")


@pytest.mark.parametrize(
    ("name", "params"),
    [
        # 2 x 128,256 x 4,096 embeddings + 32 x (41,943,040 attention + 176,160,768 MLP +
        # 8,192 norms) + 4,096 = 8,030,261,248 (Llama-3.1-8B's published count)
        (LLAMA, 8_030_261_248),
        # 2 x 152,064 x 8,192 + 80 x (150,994,944 + 10,240 biases + 726,663,168 + 16,384)
        # + 8,192 = 72,706,203,648 (the Hub: 72.7 B)
        (QWEN, 72_706_203_648),
        # 2 x 32,000 x 4,096 + 32 x (41,943,040 + 8 x 176,160,768 experts + 32,768 router
        # + 8,192) + 4,096 = 46,702,792,704 (the Hub: 46.7 B)
        (MIXTRAL, 46_702_792_704),
    ],
)
def test_parameter_estimate_matches_the_published_counts(name: str, params: int) -> None:
    assert estimate_parameters(shape(name)) == params


def test_moe_with_shared_experts_and_leading_dense_layers() -> None:
    # A DeepSeek-MoE-style shape, small enough to count by hand:
    # embeddings 10 x 8 = 80 (tied); per layer attention 2 x 8 x 8 (q, o) + 2 x 8 x 4 (k, v)
    # = 192 and norms 16 -> 3 x 208 = 624; 1 dense layer 3 x 8 x 16 = 384; 2 MoE layers of
    # 4 experts x 3 x 8 x 4 = 384 + router 8 x 4 = 32 + 2 shared x 3 x 8 x 4 = 192 -> 608
    # each = 1,216; final norm 8: 80 + 624 + 384 + 1,216 + 8 = 2,312.
    doc = {
        "num_hidden_layers": 3,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "vocab_size": 10,
        "intermediate_size": 16,
        "moe_intermediate_size": 4,
        "n_routed_experts": 4,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    assert estimate_parameters(parse_model_config(doc)) == 2312


def test_a_quantized_checkpoint_says_the_estimate_is_high() -> None:
    config = {**raw(LLAMA), "quantization_config": {"quant_method": "fp8"}}
    req = request(LLAMA, shape=parse_model_config(config))
    assert "quantized (fp8)" in compute(req)["weights_source"]


def test_multimodal_text_config_is_read_first() -> None:
    doc = {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "text_config": {**raw(LLAMA), "torch_dtype": None},
        "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24},
    }
    got = parse_model_config(doc)
    assert (got.name, got.layers, got.kv_heads, got.dtype) == (
        "Mistral3ForConditionalGeneration",
        32,
        8,
        "bfloat16",
    )


def test_fallbacks_for_kv_heads_and_head_dim() -> None:
    doc = raw(LLAMA)
    del doc["num_key_value_heads"]
    got = parse_model_config({**doc, "head_dim": 96})
    assert (got.kv_heads, got.head_dim) == (32, 96)  # no GQA: every head has K and V


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("num_hidden_layers", "num_hidden_layers missing"),
        ("num_attention_heads", "head_dim (and hidden_size/num_attention_heads) missing"),
    ],
)
def test_missing_fields_are_named(drop: str, message: str) -> None:
    doc = raw(QWEN)
    del doc[drop]
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_model_config(doc, "qwen.json")


def test_missing_kv_heads_and_attention_heads_are_named() -> None:
    doc = {"num_hidden_layers": 4, "head_dim": 64}
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        parse_model_config(doc)


def test_latent_attention_is_refused_with_a_reason() -> None:
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        parse_model_config({**raw(LLAMA), "kv_lora_rank": 512})


def test_not_an_object() -> None:
    with pytest.raises(ConfigError, match="not a JSON object"):
        parse_model_config([1, 2])


def test_weights_estimate_names_what_it_lacks() -> None:
    doc = raw(LLAMA)
    del doc["vocab_size"]
    with pytest.raises(ConfigError, match="no vocab_size; pass --weights-bytes or --params"):
        estimate_parameters(parse_model_config(doc))


@pytest.mark.parametrize(
    ("name", "size"), [("bfloat16", 2), ("torch.float16", 2), ("float32", 4), ("fp8", 1)]
)
def test_dtype_bytes(name: str, size: int) -> None:
    assert dtype_bytes(name, "x") == size


@pytest.mark.parametrize("name", [None, "int3"])
def test_dtype_bytes_rejects(name: str | None) -> None:
    with pytest.raises(ConfigError):
        dtype_bytes(name, "weights")


MODEL_CASES = [
    # Llama-3.1-8B bf16: 128 KiB per token; weights 8,030,261,248 x 2 = 16,060,522,496;
    # 77,309,411,328 - 16,060,522,496 - 4,294,967,296 = 56,953,921,536 (53.04 GiB);
    # / 131,072 = 434,523 -> 434,512 tokens (16-token blocks); / 32,768 = 13.26 -> 13.
    (LLAMA, 1, 131_072, 131_072, 16_060_522_496, 56_953_921_536, 434_512, 13),
    # TP 4: 2 KV heads per GPU -> 2 x 80 x 2 x 128 x 2 = 81,920 bytes per token per GPU;
    # weights 145,412,407,296 / 4 = 36,353,101,824 per GPU; 77,309,411,328 - that - 4 GiB =
    # 36,661,342,208 (34.14 GiB); / 81,920 = 447,526 -> 447,520; / 32,768 = 13.66 -> 13.
    (QWEN, 4, 327_680, 81_920, 36_353_101_824, 36_661_342_208, 447_520, 13),
    # TP 2: 4 KV heads per GPU -> 65,536 bytes; weights 93,405,585,408 / 2 = 46,702,792,704;
    # 77,309,411,328 - that - 4 GiB = 26,311,651,328 (24.50 GiB); / 65,536 = 401,483 ->
    # 401,472; / 32,768 = 12.25 -> 12.
    (MIXTRAL, 2, 131_072, 65_536, 46_702_792_704, 26_311_651_328, 401_472, 12),
]


@pytest.mark.parametrize(
    ("name", "tp", "per_token", "per_gpu", "weights_gpu", "budget", "tokens", "seqs"),
    MODEL_CASES,
    ids=[case[0] for case in MODEL_CASES],
)
def test_three_public_models(
    name: str,
    tp: int,
    per_token: int,
    per_gpu: int,
    weights_gpu: int,
    budget: int,
    tokens: int,
    seqs: int,
) -> None:
    doc = compute(request(name, tensor_parallel=tp))
    assert doc["kv_bytes_per_token"] == per_token
    assert doc["kv_bytes_per_token_per_gpu"] == per_gpu
    assert doc["weights_bytes_per_gpu"] == weights_gpu
    assert doc["weights_estimated"] is True
    assert "estimate" in doc["weights_source"]
    assert doc["kv_budget_bytes"] == budget
    assert doc["kv_cache_tokens"] == tokens
    assert doc["max_num_seqs"] == seqs
    assert doc["max_num_batched_tokens"] == 8192  # vLLM's default on a GPU of 70 GiB or more
    assert doc["engines"]["tgi"]["max_concurrent_requests"] == seqs
    assert doc["engines"]["tgi"]["max_batch_total_tokens"] == tokens
    assert doc["engines"]["sglang"]["max_running_requests"] == seqs
    assert doc["fits"] is True
    assert doc["from_engine_log"] == []


def test_mixtral_on_one_gpu_does_not_fit() -> None:
    # 93,405,585,408 bytes of weights (86.99 GiB) > 72 GiB: nothing left for the KV cache.
    doc = compute(request(MIXTRAL))
    assert (doc["kv_budget_bytes"], doc["max_num_seqs"], doc["fits"]) == (0, 0, False)


def test_given_weights_params_reserve_and_fp8_kv_cache() -> None:
    # --params 8.03B x 2 = 16,060,000,000 bytes; fp8 KV: 65,536 bytes per token;
    # 77,309,411,328 - 16,060,000,000 - 2 GiB (2,147,483,648) = 59,101,927,680 / 65,536
    # = 901,823 -> 901,808 tokens; / 32,768 = 27.52 -> 27.
    doc = compute(request(LLAMA, params=8_030_000_000, reserve_bytes=2 * GIB, kv_cache_dtype="fp8"))
    assert doc["weights_bytes"] == 16_060_000_000 and not doc["weights_estimated"]
    assert doc["kv_bytes_per_token"] == 65_536
    assert (doc["kv_cache_tokens"], doc["max_num_seqs"]) == (901_808, 27)
    assert compute(request(LLAMA, weights_bytes=15 * GIB))["weights_source"] == "--weights-bytes"


def test_max_len_defaults_to_the_models_context() -> None:
    # Llama-3.1-8B: 131,072 positions -> 434,512 / 131,072 = 3 requests
    doc = compute(request(LLAMA, max_len=None))
    assert (doc["max_model_len"], doc["max_num_seqs"]) == (131_072, 3)
    assert doc["max_model_len_source"] == "config.json max_position_embeddings"


def test_engine_and_gateway() -> None:
    doc = compute(request(LLAMA, engine="tgi", replicas_left=2))
    assert list(doc["engines"]) == ["tgi"]
    assert doc["engines"]["tgi"]["cuda_memory_fraction"] == 0.9
    assert doc["gateway"]["limit_connections"] == 26  # 2 replicas x 13


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tensor_parallel": 3}, "do not split evenly"),
        ({"utilization": 1.5}, "utilization must be in"),
        ({"kv_cache_dtype": "int3"}, "^--kv-cache-dtype: unknown dtype 'int3'; accepted: auto, "),
        # 32 attention heads: a rank cannot hold half a head (vLLM refuses it too)
        (
            {"tensor_parallel": 64},
            "--tensor-parallel 64: 32 attention heads .* 1, 2, 4, 8, 16, 32$",
        ),
        ({"dtype": "int4"}, r"^--dtype: unknown dtype 'int4'; accepted: .* \(quantized weights"),
        ({"max_len": 1}, "^--max-len 1: a request length is at least 16 tokens"),
        ({"max_len": 131_073}, "^--max-len 131073: over the model's context of 131,072 tokens"),
    ],
)
def test_bad_requests(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compute(request(LLAMA, **changes))


def test_a_dtype_the_config_gives_is_named_as_the_configs() -> None:
    bad = replace(shape(LLAMA), dtype="int4")
    with pytest.raises(ConfigError, match=r"^config\.json torch_dtype: unknown dtype 'int4'"):
        compute(replace(request(LLAMA), shape=bad))
    doc = compute(replace(request(LLAMA, kv_cache_dtype="fp8", weights_bytes=GIB), shape=bad))
    assert doc["kv_bytes_per_token"] == 65_536  # the KV cache's own dtype is enough


@pytest.mark.parametrize(
    ("rope", "context"),
    [
        (None, 32_768),
        ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32_768}, 131_072),
        ({"rope_type": "linear", "factor": 2.0}, 65_536),
        ({"rope_type": "llama3", "factor": 8.0}, 32_768),  # positions already scaled
    ],
)
def test_the_longest_request_follows_rope_scaling(rope: Any, context: int) -> None:
    # vLLM _get_and_verify_max_len: max_position_embeddings x factor, but for llama3/su/longrope
    doc = {**raw(QWEN), "max_position_embeddings": 32_768, "rope_scaling": rope}
    assert parse_model_config(doc).context_tokens == context


# vLLM V1 start-up lines in their real wordings (sources: detector/events/engine_lines.py);
# the figures are illustrative values for Llama-3.1-8B on an 80 GiB GPU, not an observation.
VLLM_V1_LOG = """\
INFO 08-12 10:00:03 [utils.py:326] non-default args: {'model': 'meta-llama/Llama-3.1-8B', \
'max_model_len': 32768, 'max_num_seqs': 256, 'gpu_memory_utilization': 0.9}
INFO 08-12 10:00:22 [gpu_model_runner.py:2007] Model loading took 14.9889 GiB and 4.61 seconds
INFO 08-12 10:00:35 [gpu_worker.py:276] Available KV cache memory: 54.08 GiB
INFO 08-12 10:00:36 [kv_cache_utils.py:849] GPU KV cache size: 443,024 tokens
INFO 08-12 10:00:36 [kv_cache_utils.py:853] Maximum concurrency for 32,768 tokens per request: \
13.52x
"""


def test_the_engines_own_figures_replace_the_estimates(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_text(VLLM_V1_LOG)
    log = read_engine_log(path)
    # 14.9889 GiB = 16,094,208,826 bytes
    assert log.weights_bytes_per_gpu == 16_094_208_826
    doc = compute(request(LLAMA, utilization=None, max_len=None, log=log))
    assert doc["from_engine_log"] == [
        "utilization",
        "weights_bytes",
        "kv_cache_tokens",
        "max_model_len",
    ]
    assert (doc["kv_cache_tokens"], doc["max_num_seqs"]) == (443_024, 13)  # 13.52 -> 13
    assert doc["weights_bytes_per_gpu"] == 16_094_208_826 and not doc["weights_estimated"]
    assert doc["runbook_step"]["current"] == 256
    assert doc["runbook_step"]["proposed"] == 13  # min(256 // 2, 13)
    # At 0.85 instead of the logged 0.90: 80 GiB x 0.05 = 4 GiB less = 32,768 tokens less:
    # 443,024 - 32,768 = 410,256 tokens / 32,768 = 12.52 -> 12.
    lower = compute(request(LLAMA, utilization=0.85, max_len=None, log=log))
    assert (lower["kv_cache_tokens"], lower["max_num_seqs"]) == (410_256, 12)
    assert lower["runbook_step"]["proposed"] == 12


def test_real_profiler_lines_give_weights_reserve_and_kv_memory(tmp_path: Path) -> None:
    # The shared corpus lookalikes/019 (vLLM 0.7, generative-computing/mellea#416).
    path = tmp_path / "vllm.log"
    path.write_text(
        "INFO 02-11 10:17:54 [worker.py:294] the current vLLM instance can use total_gpu_memory "
        "(79.19GiB) x gpu_memory_utilization (0.80) = 63.35GiB\n"
        "INFO 02-11 10:17:54 [worker.py:294] model weights take 1.12GiB; non_torch_memory takes "
        "0.16GiB; PyTorch activation peak memory takes 0.23GiB; the rest of the memory reserved "
        "for KV Cache is 61.84GiB.\n"
        "INFO 02-11 10:17:54 [executor_base.py:113] # cuda blocks: 36184, # CPU blocks: 2340\n"
    )
    log = read_engine_log(path)
    assert log.weights_bytes_per_gpu == 1_202_590_843  # 1.12 GiB
    assert log.reserve_bytes == 418_759_312  # 0.16 + 0.23 GiB
    assert log.evidence["gpu_memory_utilization"] == 0.8
    assert log.evidence["kv_cache_bytes"] == 66_400_194_396  # 61.84 GiB
    assert log.evidence["gpu_blocks"] == 36_184


def test_sglang_weights_line(tmp_path: Path) -> None:
    # Wording of sgl-project/sglang's model loader ("Load weight end. ... mem usage=X GB").
    path = tmp_path / "sglang.log"
    path.write_text(
        "[2025-12-29 18:33:03 TP0] Load weight end. type=Qwen3ForCausalLM, "
        "dtype=torch.bfloat16, avail mem=16.00 GB, mem usage=7.08 GB.\n"
    )
    assert read_engine_log(path) == EngineLog({}, 7_602_092_114, None)  # 7.08 GiB


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read --engine-log"):
        read_engine_log(tmp_path / "missing.log")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_model_config(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("text", "size"),
    [("80GiB", 80 * GIB), ("80GB", 80 * GIB), ("80 G", 80 * GIB), ("1024", 1024)],
)
def test_size_arguments(text: str, size: int) -> None:
    assert parse_size_arg(text, "--gpu-memory") == size


@pytest.mark.parametrize(("text", "count"), [("8.03B", 8_030_000_000), ("560M", 560_000_000)])
def test_count_arguments(text: str, count: int) -> None:
    assert parse_count_arg(text, "--params") == count


@pytest.mark.parametrize("text", ["eighty", "80 parsecs", "-1GiB"])
def test_bad_size_arguments(text: str) -> None:
    with pytest.raises(ConfigError, match="not a size"):
        parse_size_arg(text, "--gpu-memory")
