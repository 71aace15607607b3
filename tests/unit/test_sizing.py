"""Safe-value math (detector.capacity.sizing) and the batch ceiling proposed from evidence."""

from __future__ import annotations

from typing import Any

import pytest

from detector.capacity.numbers import coerce_float, coerce_int
from detector.capacity.sizing import (
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    GIB,
    TGI_DEFAULT_MAX_CONCURRENT_REQUESTS,
    VLLM_DEFAULT_MAX_NUM_SEQS,
    KvCapacity,
    ceiling_from_evidence,
    check_tensor_parallel,
    connection_limit,
    infer_engine,
    kv_bytes_per_token,
    kv_capacity_from_evidence,
    kv_capacity_from_memory,
    kv_heads_per_gpu,
    max_concurrent_sequences,
    normalize_engine,
    safe_ceilings,
    tensor_parallel_sizes,
    usable_bytes,
)

# Llama-3.1-8B: https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
LLAMA_31_8B = {"layers": 32, "kv_heads": 8, "head_dim": 128, "bytes_per_element": 2}
LLAMA_31_8B_PARAMS = 8_030_261_248
SEQ_32K = 32_768


def test_llama_31_8b_bf16_is_128_kib_per_token_and_4_gib_per_32k_sequence() -> None:
    per_token = kv_bytes_per_token(**LLAMA_31_8B)
    assert per_token == 128 * 1024
    assert per_token * SEQ_32K == 4 * GIB


def test_design_example_about_13_sequences_on_80_gb_at_090() -> None:
    # The worked example of detector.capacity.sizing: about 13 32k-token sequences fit.
    # Assumed: 80 GiB device, bf16 weights of 8.03 B parameters (16.06 GB = 14.96 GiB),
    # 4 GiB activation reserve -> 53.04 GiB usable -> 13.26 -> 13.
    weights = LLAMA_31_8B_PARAMS * 2
    usable = usable_bytes(80 * GIB, 0.90, weights, 4 * GIB)
    assert usable / GIB == pytest.approx(53.04, abs=0.01)
    per_token = kv_bytes_per_token(**LLAMA_31_8B)
    assert max_concurrent_sequences(usable, per_token, SEQ_32K) == 13


@pytest.mark.parametrize(
    ("reserve_gib", "expected"),
    [(0, 14), (1, 14), (1.5, 13), (4, 13), (5, 13), (6, 12)],
)
def test_activation_reserve_decides_13_versus_14(reserve_gib: float, expected: int) -> None:
    usable = usable_bytes(80 * GIB, 0.90, LLAMA_31_8B_PARAMS * 2, int(reserve_gib * GIB))
    assert max_concurrent_sequences(usable, 128 * 1024, SEQ_32K) == expected


def test_usable_bytes_never_negative() -> None:
    assert usable_bytes(16 * GIB, 0.5, 16 * GIB, 0) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"layers": 0, "kv_heads": 8, "head_dim": 128, "bytes_per_element": 2},
        {"layers": 32, "kv_heads": -1, "head_dim": 128, "bytes_per_element": 2},
        {"layers": 32, "kv_heads": 8, "head_dim": 128, "bytes_per_element": 0},
    ],
)
def test_kv_bytes_per_token_rejects_non_positive(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        kv_bytes_per_token(**kwargs)


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.01])
def test_usable_bytes_rejects_bad_utilization(utilization: float) -> None:
    with pytest.raises(ValueError):
        usable_bytes(80 * GIB, utilization, 0, 0)


def test_max_concurrent_sequences_rejects_zero_length() -> None:
    with pytest.raises(ValueError):
        max_concurrent_sequences(GIB, 1, 0)


@pytest.mark.parametrize(
    ("value", "as_int", "as_float"),
    [
        (12, 12, 12.0),
        ("12", 12, 12.0),
        (12.0, 12, 12.0),
        (12.5, None, 12.5),
        ("0.9", None, 0.9),
        (True, None, None),
        (None, None, None),
        ("n/a", None, None),
        ("nan", None, None),
    ],
)
def test_coercion(value: Any, as_int: int | None, as_float: float | None) -> None:
    assert coerce_int(value) == as_int
    assert coerce_float(value) == as_float


@pytest.mark.parametrize(
    ("name", "engine"),
    [
        ("vLLM", "vllm"),
        ("text-generation-inference", "tgi"),
        ("TGI", "tgi"),
        (" sglang ", "sglang"),
        ("triton", "unknown"),
        (None, "unknown"),
    ],
)
def test_normalize_engine(name: Any, engine: str) -> None:
    assert normalize_engine(name) == engine


CEILING_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "vllm: KV cache tokens over max_model_len beat halving",
        {
            "engine": "vllm",
            "max_num_seqs": 256,
            "kv_cache_tokens": 434_560,
            "max_model_len": SEQ_32K,
        },
        {"param": "max_num_seqs", "current": 256, "kv_fit": 13, "proposed": 13},
    ),
    (
        "vllm: halving beats a large KV fit",
        {"engine": "vllm", "max_num_seqs": 64, "kv_cache_tokens": 1_000_000, "max_model_len": 4096},
        {"current": 64, "kv_fit": 244, "proposed": 32},
    ),
    (
        "vllm: the 'Maximum concurrency' line when no token count",
        {"engine": "vllm", "max_num_seqs": 128, "max_concurrency": 9.7, "max_model_len": 8192},
        {"kv_fit": 9, "proposed": 9},
    ),
    (
        "vllm: KV fit of zero is floored",
        {"engine": "vllm", "max_num_seqs": 16, "kv_cache_tokens": 1000, "max_model_len": 4096},
        {"kv_fit": 0, "proposed": 1},
    ),
    (
        "vllm: nothing known halves the documented default",
        {},
        {"engine": "unknown", "current": None, "proposed": VLLM_DEFAULT_MAX_NUM_SEQS // 2},
    ),
    (
        "vllm named but no ceiling logged",
        {"engine": "vllm", "max_model_len": 8192},
        {"current": None, "assumed_current": 256, "proposed": 128, "max_model_len": 8192},
    ),
    (
        "engine guessed from the keys (TGI)",
        {"max_concurrent_requests": "40"},
        {"engine": "tgi", "param": "max_concurrent_requests", "current": 40, "proposed": 20},
    ),
    (
        "tgi: max_batch_total_tokens is the KV budget",
        {
            "engine": "text-generation-inference",
            "max_concurrent_requests": 128,
            "max_batch_total_tokens": 100_000,
            "max_total_tokens": 8192,
        },
        {
            "engine": "tgi",
            "kv_fit": 12,
            "proposed": 12,
            "batched_tokens_param": "max_batch_total_tokens",
            "batched_tokens_proposed": 50_000,
        },
    ),
    (
        "tgi: nothing logged halves TGI's default",
        {"engine": "tgi"},
        {"current": None, "proposed": TGI_DEFAULT_MAX_CONCURRENT_REQUESTS // 2},
    ),
    (
        "sglang: KV pool over context length",
        {
            "engine": "sglang",
            "max_running_requests": 48,
            "max_total_num_tokens": 200_000,
            "context_length": 16_384,
        },
        {
            "param": "max_running_requests",
            "kv_fit": 12,
            "proposed": 12,
            "batched_tokens_param": None,
        },
    ),
    (
        "a ceiling of 1 stays 1",
        {"engine": "vllm", "max_num_seqs": 1},
        {"current": 1, "proposed": 1},
    ),
]


@pytest.mark.parametrize(
    ("config", "expected"), [c[1:] for c in CEILING_CASES], ids=[c[0] for c in CEILING_CASES]
)
def test_ceiling_from_evidence(config: dict[str, Any], expected: dict[str, Any]) -> None:
    proposal = ceiling_from_evidence(config)
    for key, value in expected.items():
        assert getattr(proposal, key) == value, key
    assert proposal.basis


def test_ceiling_never_above_current_even_with_a_higher_floor() -> None:
    proposal = ceiling_from_evidence({"engine": "vllm", "max_num_seqs": 2}, floor=4)
    assert proposal.proposed == 2
    assert "never raises" in proposal.basis


def test_ceiling_floor_applies() -> None:
    proposal = ceiling_from_evidence(
        {"engine": "vllm", "max_num_seqs": 256, "max_concurrency": 0.4}, floor=2
    )
    assert proposal.proposed == 2


def test_default_basis_says_it_is_a_default_and_cites_the_source() -> None:
    proposal = ceiling_from_evidence({"engine": "vllm"})
    assert proposal.current_is_default
    assert "a default, not an observation" in proposal.basis
    assert "arg_utils.py" in proposal.basis
    assert "1024" in proposal.basis


def test_observed_basis_gives_the_numbers() -> None:
    proposal = ceiling_from_evidence(
        {
            "engine": "vllm",
            "max_num_seqs": 256,
            "kv_cache_tokens": 434_560,
            "max_model_len": SEQ_32K,
        }
    )
    assert not proposal.current_is_default
    assert "256" in proposal.basis
    assert "434,560" in proposal.basis
    assert "= 13" in proposal.basis


@pytest.mark.parametrize(
    ("config", "batched"),
    [
        ({"engine": "vllm", "max_num_seqs": 256, "max_num_batched_tokens": 8192}, 4096),
        ({"engine": "vllm", "max_num_seqs": 256, "max_num_batched_tokens": 600}, 512),
        ({"engine": "vllm", "max_num_seqs": 256, "max_num_batched_tokens": 300}, 300),
        (
            {
                "engine": "vllm",
                "max_num_seqs": 256,
                "max_num_batched_tokens": 32_768,
                "max_model_len": 32_768,
                "enable_chunked_prefill": False,
            },
            32_768,
        ),
        (
            {
                "engine": "vllm",
                "max_num_seqs": 256,
                "max_num_batched_tokens": 32_768,
                "max_model_len": 32_768,
                "enable_chunked_prefill": True,
            },
            16_384,
        ),
        ({"engine": "vllm", "max_num_seqs": 256}, None),
    ],
)
def test_batched_tokens_proposal(config: dict[str, Any], batched: int | None) -> None:
    assert ceiling_from_evidence(config).batched_tokens_proposed == batched


def test_infer_engine_prefers_the_named_engine() -> None:
    assert infer_engine({"engine": "sglang", "max_num_seqs": 4}) == "sglang"
    assert infer_engine({"max_running_requests": 4}) == "sglang"
    assert infer_engine({}) == "unknown"


# --- KV capacity -> safe ceilings: the one path of `detector ceilings` and the runbook step ---


@pytest.mark.parametrize(
    ("kv_heads", "tensor_parallel", "per_gpu"),
    [(8, 1, 8), (8, 4, 2), (8, 8, 1), (8, 16, 1), (2, 8, 1), (64, 4, 16)],
)
def test_kv_heads_per_gpu(kv_heads: int, tensor_parallel: int, per_gpu: int) -> None:
    assert kv_heads_per_gpu(kv_heads, tensor_parallel) == per_gpu


@pytest.mark.parametrize(("kv_heads", "tensor_parallel"), [(8, 3), (6, 4), (0, 1), (8, 0)])
def test_kv_heads_that_do_not_split_are_rejected(kv_heads: int, tensor_parallel: int) -> None:
    with pytest.raises(ValueError):
        kv_heads_per_gpu(kv_heads, tensor_parallel)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "sizes"),
    [
        (32, 8, [1, 2, 4, 8, 16, 32]),  # Llama-3.1-8B: KV heads replicated from 16 ranks up
        (64, 8, [1, 2, 4, 8, 16, 32, 64]),  # Qwen2.5-72B
        (40, 8, [1, 2, 4, 8, 40]),  # 40 heads: 5, 10, 20 cannot split 8 KV heads
        (28, 4, [1, 2, 4, 28]),  # 7 or 14 ranks would split 4 KV heads unevenly
    ],
)
def test_tensor_parallel_sizes(heads: int, kv_heads: int, sizes: list[int]) -> None:
    assert tensor_parallel_sizes(heads, kv_heads) == sizes
    check_tensor_parallel(heads, kv_heads, sizes[-1])
    with pytest.raises(ValueError, match=f"sizes that work: {', '.join(map(str, sizes))}$"):
        check_tensor_parallel(heads, kv_heads, 2 * heads)


def test_tensor_parallel_divides_the_kv_heads_of_one_gpu() -> None:
    # Qwen2.5-72B: 80 layers, 8 KV heads, head dim 128, bf16; TP 4 -> 2 heads per GPU:
    # 2 x 80 x 2 x 128 x 2 = 81,920 bytes per token per GPU (327,680 for the whole model).
    assert kv_bytes_per_token(80, 8, 128, 2) == 327_680
    assert kv_bytes_per_token(80, 8, 128, 2, tensor_parallel=4) == 81_920


def test_capacity_from_memory_is_the_design_example() -> None:
    # 77,309,411,328 - 16,060,522,496 (weights) - 4,294,967,296 (reserve) = 56,953,921,536
    # bytes; / 131,072 = 434,523.9 -> 434,523 -> whole 16-token blocks: 434,512 tokens.
    capacity = kv_capacity_from_memory(
        gpu_bytes=80 * GIB,
        utilization=0.90,
        weights_bytes=LLAMA_31_8B_PARAMS * 2,
        activation_reserve_bytes=DEFAULT_ACTIVATION_RESERVE_BYTES,
        bytes_per_token=128 * 1024,
    )
    assert (capacity.tokens, capacity.budget_bytes) == (434_512, 56_953_921_536)
    assert not capacity.from_log
    assert "53.04 GiB" in capacity.basis
    assert safe_ceilings(capacity, SEQ_32K).max_num_seqs == 13  # 434,512 / 32,768 = 13.26


def test_capacity_from_memory_rejects_a_zero_token_size() -> None:
    with pytest.raises(ValueError):
        kv_capacity_from_memory(
            gpu_bytes=GIB,
            utilization=0.9,
            weights_bytes=0,
            activation_reserve_bytes=0,
            bytes_per_token=0,
        )


EVIDENCE_CASES: list[tuple[str, dict[str, Any], int | None, int | None]] = [
    (
        "vLLM 'GPU KV cache size' tokens",
        {"engine": "vllm", "kv_cache_tokens": 443_024},
        None,
        443_024,
    ),
    ("SGLang pool", {"engine": "sglang", "max_total_num_tokens": 298_447}, None, 298_447),
    (
        "TGI warmup total tokens",
        {"engine": "tgi", "max_batch_total_tokens": 100_000},
        None,
        100_000,
    ),
    (
        "max_batch_total_tokens is no KV size for vLLM",
        {"engine": "vllm", "max_batch_total_tokens": 100_000},
        None,
        None,
    ),
    # 54.08 GiB = 58,067,957,842 bytes / 131,072 = 443,023.7 -> 443,023 -> 443,008 (blocks)
    (
        "'Available KV cache memory' over bytes per token",
        {"kv_cache_bytes": 58_067_957_842},
        131_072,
        443_008,
    ),
    (
        "KV bytes without bytes per token say nothing",
        {"kv_cache_bytes": 58_067_957_842},
        None,
        None,
    ),
    ("V0 '# GPU blocks' x 16", {"gpu_blocks": 1381}, None, 22_096),
    ("GPU blocks x a logged block size", {"gpu_blocks": 1381, "block_size": 32}, None, 44_192),
    # 13.52 x 32,768 = 443,023.36 -> 443,023
    (
        "maximum concurrency x its length",
        {"max_concurrency": 13.52, "max_model_len": SEQ_32K},
        None,
        443_023,
    ),
    ("concurrency without a length", {"max_concurrency": 13.52}, None, None),
    ("nothing", {"engine": "vllm", "max_num_seqs": 256}, None, None),
]


@pytest.mark.parametrize(
    ("config", "per_token", "tokens"),
    [c[1:] for c in EVIDENCE_CASES],
    ids=[c[0] for c in EVIDENCE_CASES],
)
def test_capacity_from_evidence(
    config: dict[str, Any], per_token: int | None, tokens: int | None
) -> None:
    capacity = kv_capacity_from_evidence(config, bytes_per_token=per_token)
    assert (capacity.tokens if capacity else None) == tokens
    if capacity is not None:
        assert capacity.from_log and capacity.basis


def _capacity(tokens: int) -> KvCapacity:
    return KvCapacity(tokens, None, f"{tokens} tokens", from_log=False)


def test_safe_ceilings_name_each_engines_parameters() -> None:
    safe = safe_ceilings(_capacity(434_512), SEQ_32K)
    assert (safe.max_num_seqs, safe.max_num_batched_tokens) == (13, 8192)
    assert safe.sequences == pytest.approx(13.26, abs=0.005)
    assert safe.settings("vllm") == {
        "max_num_seqs": 13,
        "max_num_batched_tokens": 8192,
        "max_model_len": SEQ_32K,
    }
    assert safe.settings("tgi") == {
        "max_concurrent_requests": 13,
        "max_batch_total_tokens": 434_512,
        "max_input_tokens": SEQ_32K - 1,
        "max_total_tokens": SEQ_32K,
    }
    assert safe.settings("sglang") == {
        "max_running_requests": 13,
        "max_total_tokens": 434_512,
        "chunked_prefill_size": 8192,
        "context_length": SEQ_32K,
    }
    with pytest.raises(KeyError):
        safe.settings("triton")


@pytest.mark.parametrize(
    ("tokens", "length", "budget", "seqs", "batched"),
    [
        (434_512, SEQ_32K, 8192, 13, 8192),
        (5000, 4096, 8192, 1, 5000),  # never more tokens per step than the cache holds
        (40_000, 100, 16, 400, 400),  # vLLM needs at least max_num_seqs batched tokens
        (1000, 4096, 8192, 0, 1000),  # not even one request fits
    ],
)
def test_safe_ceilings_bounds(
    tokens: int, length: int, budget: int, seqs: int, batched: int
) -> None:
    safe = safe_ceilings(_capacity(tokens), length, batched_tokens=budget)
    assert (safe.max_num_seqs, safe.max_num_batched_tokens) == (seqs, batched)


def test_safe_ceilings_reject_a_zero_length() -> None:
    with pytest.raises(ValueError):
        safe_ceilings(_capacity(1000), 0)


@pytest.mark.parametrize(
    ("serving", "per_replica", "floor", "limit"),
    [(2, 13, 1, 26), (0, 13, 1, 13), (3, 0, 4, 4)],
)
def test_connection_limit(serving: int, per_replica: int, floor: int, limit: int) -> None:
    got, basis = connection_limit(serving, per_replica, param="max_num_seqs", floor=floor)
    assert got == limit
    assert basis.endswith(f"= {limit}")


def test_the_runbook_step_takes_a_computed_capacity() -> None:
    # detector ceilings passes the capacity it computed from the model: min(256 // 2, 13) = 13.
    proposal = ceiling_from_evidence(
        {"engine": "vllm", "max_num_seqs": 256, "max_model_len": SEQ_32K},
        capacity=_capacity(434_512),
    )
    assert (proposal.kv_fit, proposal.proposed) == (13, 13)
    assert "434512 tokens / max_model_len 32,768 = 13 sequences" in proposal.basis


def test_the_runbook_step_reads_gpu_blocks() -> None:
    # V0 "# GPU blocks: 1381" at 16 tokens = 22,096 tokens / 2,048 = 10 sequences.
    proposal = ceiling_from_evidence(
        {"engine": "vllm", "max_num_seqs": 256, "gpu_blocks": 1381, "max_model_len": 2048}
    )
    assert (proposal.kv_fit, proposal.proposed) == (10, 10)
