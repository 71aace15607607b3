"""Safe-value math of DESIGN.md section 5 and the batch ceiling proposed from evidence."""

from __future__ import annotations

from typing import Any

import pytest

from detector.runbooks.sizing import (
    GIB,
    TGI_DEFAULT_MAX_CONCURRENT_REQUESTS,
    VLLM_DEFAULT_MAX_NUM_SEQS,
    ceiling_from_evidence,
    coerce_float,
    coerce_int,
    infer_engine,
    kv_bytes_per_token,
    max_concurrent_sequences,
    normalize_engine,
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
    # DESIGN.md: "on an 80 GB GPU at 0.90 that leaves room for about 13 such sequences".
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
