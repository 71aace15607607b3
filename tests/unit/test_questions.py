"""The three on-call questions (detector.incidents.questions), answered from the signals."""

from __future__ import annotations

from typing import Any

import pytest

from detector.correlate.context import IncidentContext
from detector.events.model import Signal, SignalKind, SourcePos
from detector.incidents.questions import (
    QUESTIONS,
    Answer,
    answer_batch_and_seq_len,
    answer_batching_ceilings,
    answer_paged_attention,
    answer_questions,
    detect_engine,
    engine_config,
)

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
K = SignalKind


def sig(
    kind: SignalKind, dt: float, pod: str | None = "llm-a", line: int = 0, **attrs: Any
) -> Signal:
    return Signal(
        kind=kind,
        time=T0 + dt,
        source=SourcePos("ml.log", line or int(dt) + 1000),
        pod=pod,
        attrs=attrs,
    )


def incident(*signals: Signal, victims: tuple[str, ...] = ("llm-a",)) -> IncidentContext:
    return IncidentContext(
        key="k",
        namespace="ml",
        workload="llm",
        workload_kind="Deployment",
        stage="suspected",
        opened_at=T0,
        victims=victims,
        pods_seen=("llm-a", "llm-b"),
        signals=tuple(sorted(signals, key=lambda s: s.time)),
    )


OOM_A = sig(K.GPU_OOM, 0, "llm-a", line=1)
VLLM = sig(
    K.ENGINE_CONFIG,
    -900,
    line=2,
    engine="vllm",
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=32_768,
    kv_cache_tokens=434_560,
)
PRESSURE = sig(
    K.ENGINE_PRESSURE, -5, line=3, requests_running=187, requests_waiting=42, kv_cache_usage=0.991
)


def by_key(answers: list[Answer]) -> dict[str, Answer]:
    return {a.qkey: a for a in answers}


def test_three_questions_in_order_with_the_design_wording() -> None:
    answers = answer_questions(incident(OOM_A))
    assert [a.qkey for a in answers] == [
        "batch_and_seq_len",
        "batching_ceilings",
        "paged_attention",
    ]
    assert [a.question for a in answers] == list(QUESTIONS.values())
    assert answers[0].question == (
        "What were the batch size and maximum sequence length just before the OOM?"
    )


def test_vllm_with_full_evidence_answers_everything() -> None:
    answers = by_key(answer_questions(incident(VLLM, PRESSURE, OOM_A)))
    first = answers["batch_and_seq_len"]
    assert first.answer == (
        "Before llm-a's OOM at 2024-05-01T12:00:00Z: llm-a was running 187 requests with 42 "
        "waiting, KV cache 99% used at 2024-05-01T11:59:55Z; maximum sequence length "
        "(max_model_len) 32,768 tokens, batch ceiling max_num_seqs 256."
    )
    assert first.evidence == PRESSURE.source
    assert first.to_check == ""
    second = answers["batching_ceilings"]
    assert second.answer is not None
    assert "hard ceilings max_num_seqs 256, max_num_batched_tokens 8,192" in second.answer
    assert "unbounded by default" in second.answer
    assert "https://github.com/vllm-project/vllm/issues/18826" in second.answer
    assert second.evidence == VLLM.source
    assert "proxy-read-timeout" in second.to_check
    third = answers["paged_attention"]
    assert third.answer is not None
    assert third.answer.startswith("Yes: vLLM always keeps the KV cache in PagedAttention blocks")
    assert "https://arxiv.org/abs/2309.06180" in third.answer
    assert "434,560 tokens" in third.answer
    assert third.evidence == VLLM.source


def test_signals_after_the_first_oom_do_not_answer_question_one() -> None:
    late_pressure = sig(K.ENGINE_PRESSURE, 5, requests_running=3)
    late_config = sig(K.ENGINE_CONFIG, 60, engine="vllm", max_model_len=4096)
    answer = answer_batch_and_seq_len(incident(OOM_A, late_pressure, late_config))
    assert answer.answer is None
    assert answer.evidence is None
    assert "kubectl logs llm-a -n ml --previous" in answer.to_check
    assert "Running:" in answer.to_check
    assert "non-default args" in answer.to_check


def test_the_victims_own_pressure_wins_over_a_later_one_from_another_pod() -> None:
    own = sig(K.ENGINE_PRESSURE, -20, "llm-a", requests_running=100)
    other = sig(K.ENGINE_PRESSURE, -1, "llm-b", requests_running=7)
    answer = answer_batch_and_seq_len(incident(OOM_A, own, other, VLLM))
    assert answer.answer is not None
    assert "llm-a was running 100 requests" in answer.answer
    assert answer.evidence == own.source


def test_partial_answer_says_what_is_missing() -> None:
    answer = answer_batch_and_seq_len(incident(OOM_A, VLLM))
    assert answer.answer is not None
    assert "32,768 tokens" in answer.answer
    assert answer.evidence == VLLM.source
    assert answer.to_check.startswith("running batch just before llm-a's OOM")


@pytest.mark.parametrize(
    ("config", "batch", "queue"),
    [
        (
            {"engine": "text-generation-inference", "max_concurrent_requests": 128},
            "hard ceilings max_concurrent_requests 128",
            "MAX_CONCURRENT_REQUESTS bounds queued plus running requests",
        ),
        (
            {"engine": "sglang", "max_running_requests": 48},
            "hard ceilings max_running_requests 48",
            "no ceiling in SGLang's startup arguments",
        ),
        (
            {"engine": "vllm", "max_num_seqs": "64", "max_num_queued_reqs": 200},
            "hard ceilings max_num_seqs 64",
            "Queue: max_num_queued_reqs 200.",
        ),
        (
            {"engine": "vllm"},
            "vLLM always caps it with max_num_seqs, but the value is not in the logs",
            "unbounded by default",
        ),
    ],
)
def test_batching_ceilings_by_engine(config: dict[str, Any], batch: str, queue: str) -> None:
    answer = answer_batching_ceilings(incident(OOM_A, sig(K.ENGINE_CONFIG, -100, **config)))
    assert answer.answer is not None
    assert batch in answer.answer
    assert queue in answer.answer


def test_batching_ceilings_unknown_engine_is_unanswered() -> None:
    answer = answer_batching_ceilings(incident(OOM_A))
    assert answer.answer is None
    assert answer.evidence is None
    assert "kubectl logs deploy/llm -n ml --previous" in answer.to_check
    assert "proxy-read-timeout" in answer.to_check


@pytest.mark.parametrize(
    ("signals", "start", "to_check"),
    [
        ((sig(K.ENGINE_CONFIG, -9, engine="vllm"),), "Yes: vLLM always", ""),
        (
            (sig(K.ENGINE_CONFIG, -9, engine="tgi"),),
            "Yes for models on TGI's flash-attention path",
            "kubectl logs llm-a -n ml --previous",
        ),
        ((sig(K.ENGINE_CONFIG, -9, engine="sglang"),), "Yes: SGLang keeps the KV cache", ""),
        ((sig(K.GPU_OOM, -1, framework="vllm"),), "Yes: vLLM always", ""),
        (
            (sig(K.ENGINE_CONFIG, -9, engine="vllm", paged_attention=False),),
            "No: the engine reports paged attention off",
            "",
        ),
        ((sig(K.ENGINE_CONFIG, -9, engine="custom", paged_attention="on"),), "Yes: the engine", ""),
        ((sig(K.ENGINE_CONFIG, -9, engine="tgi", paged_attention=True),), "Yes: the engine", ""),
        (
            (sig(K.ENGINE_CONFIG, -9, engine="vllm", paged_attention=True),),
            "Yes: vLLM always",
            "",
        ),
        ((sig(K.ENGINE_PRESSURE, -9, engine="sglang", requests_running=3),), "Yes: SGLang", ""),
    ],
)
def test_paged_attention(signals: tuple[Signal, ...], start: str, to_check: str) -> None:
    answer = answer_paged_attention(incident(OOM_A, *signals))
    assert answer.answer is not None
    assert answer.answer.startswith(start)
    assert answer.evidence == signals[0].source
    if to_check:
        assert to_check in answer.to_check
    else:
        assert answer.to_check == ""


def test_paged_attention_unknown_engine_is_unanswered() -> None:
    answer = answer_paged_attention(incident(OOM_A, sig(K.GPU_OOM, 1, framework="pytorch")))
    assert answer.answer is None
    assert answer.evidence is None
    assert "kubectl get deploy/llm -n ml -o jsonpath" in answer.to_check


def test_every_unanswered_question_says_what_to_check() -> None:
    for answer in answer_questions(incident()):
        assert answer.answer is None
        assert answer.to_check


def test_engine_config_merges_latest_per_key_and_prefers_the_pod() -> None:
    a = sig(K.ENGINE_CONFIG, -50, "llm-a", max_num_seqs=64, max_model_len=8192)
    b = sig(K.ENGINE_CONFIG, -10, "llm-b", max_num_seqs=32)
    merged = engine_config((a, b))
    assert merged.values == {"max_num_seqs": 32, "max_model_len": 8192}
    assert merged.sources["max_num_seqs"] is b
    assert engine_config((a, b), pod="llm-a").get("max_num_seqs") == 64
    assert engine_config((a, b), until=T0 - 20).get("max_num_seqs") == 64


def test_detect_engine() -> None:
    assert detect_engine(incident(VLLM)) == ("vllm", VLLM)
    assert detect_engine(incident()) == ("unknown", None)
