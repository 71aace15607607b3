"""The failure mechanism from the gateway's request sizes: a poison class, load, an unpaged
server (``detector.runbooks.mechanism``), and the correlator's record of what each victim held
(``detector.correlate.requests``). Sizes are ``$request_length`` bytes (about 4 per token)."""

from __future__ import annotations

from typing import Any

import pytest

from detector.config import CorrelateSettings
from detector.correlate.context import IncidentContext
from detector.correlate.correlator import Correlator
from detector.correlate.requests import RequestEvidence, RequestSizes
from detector.correlate.state import EvidenceAdded
from detector.events.model import Signal, SignalKind, SourcePos
from detector.runbooks.mechanism import EVIDENCE_WAIT_S, Mechanism, diagnose

T0 = 1_741_943_000.0
CHAT = [700 + 4 * n for n in range(200, 2200, 20)]  # 100 chat requests, 1.5-9.5 KiB
VLLM = Signal(SignalKind.ENGINE_CONFIG, T0 - 600, SourcePos("c", 1), "llm", "a",
              attrs={"engine": "vllm"})  # fmt: skip
UNPAGED = Signal(SignalKind.ENGINE_CONFIG, T0 - 600, SourcePos("c", 1), "llm", "a",
                 attrs={"engine": "transformers"})  # fmt: skip


def ctx(
    at_deaths: list[tuple[str, float, list[int], bool]],
    baseline: list[int] = CHAT,
    config: Signal = VLLM,
) -> IncidentContext:
    deaths = tuple((p, T0 + at, tuple(sorted(s, reverse=True)), ok) for p, at, s, ok in at_deaths)
    return IncidentContext(
        key="llm/m@1",
        namespace="llm",
        workload="m",
        workload_kind="Deployment",
        stage="suspected",
        opened_at=T0,
        victims=tuple(p for p, *_ in at_deaths),
        signals=(config,),
        requests=RequestEvidence(tuple(sorted(baseline)), deaths),
    )


POISON = 700 + 4 * 12_000  # a 12k-token prompt_logprobs request (poison-request)


@pytest.mark.parametrize(
    ("deaths", "config", "mechanism", "bound"),
    [
        # one 12k-token request among chat at the first death: the class, bound 90% of it
        ([("a", 0, [POISON, 3000, 2000], False)], VLLM, Mechanism.OVERSIZED, int(0.9 * POISON)),
        # the retry killed the next pod too: still the class, from both deaths
        (
            [("a", 0, [POISON, 3000], True), ("b", 1, [POISON], True)],
            VLLM,
            Mechanism.OVERSIZED,
            int(0.9 * POISON),
        ),
        # a second death that held chat only: no class explains every death
        (
            [("a", 0, [POISON, 3000], True), ("b", 1, [4000, 3000], True)],
            VLLM,
            Mechanism.LOAD,
            None,
        ),
        # the largest held is an ordinary request: load on a paged engine...
        ([("a", 0, [9000, 4000, 3000], True)], VLLM, Mechanism.LOAD, None),
        # ...and batch x length on a server that does not page its KV cache
        ([("a", 0, [9000, 4000, 3000], True)], UNPAGED, Mechanism.UNPAGED, None),
        # no size known yet: undetermined, the steps wait for the evidence
        ([("a", 0, [], False)], VLLM, Mechanism.UNDETERMINED, None),
    ],
    ids=["first-death", "retried", "not-at-every-death", "load", "unpaged", "no-sizes"],
)
def test_diagnose(
    deaths: list[tuple[str, float, list[int], bool]],
    config: Signal,
    mechanism: Mechanism,
    bound: int | None,
) -> None:
    found = diagnose(ctx(deaths, config=config))
    assert found.mechanism is mechanism, found.evidence
    assert found.max_body_bytes == bound
    assert found.evidence


def test_a_class_that_would_refuse_much_of_the_traffic_is_load() -> None:
    # a quarter of the requests served before were as large: refusing them is shedding load
    baseline = CHAT + [POISON] * 40
    found = diagnose(ctx([("a", 0, [POISON, 3000], True)], baseline=baseline))
    assert found.mechanism is Mechanism.LOAD
    assert "28.6% of them" in found.evidence


def test_partial_evidence_of_a_later_victim_neither_refutes_the_class_nor_passes_verdict() -> None:
    # b's first failed line is a chat request; its long ones are still being logged
    found = diagnose(ctx([("a", 0, [POISON, 3000], True), ("b", 1, [2000], False)]))
    assert found.mechanism is Mechanism.OVERSIZED
    assert found.class_victims == ("a",)  # b is not judged before its requests are all in
    assert found.evidence_until == T0 + 1 + EVIDENCE_WAIT_S


def test_too_few_requests_before_to_compare() -> None:
    found = diagnose(ctx([("a", 0, [POISON], True)], baseline=CHAT[:5]))
    assert found.mechanism is Mechanism.LOAD and "too few" in found.evidence


def lb(t: float, status: int, size: int, addr: str = "10.0.0.7:8000") -> Signal:
    attrs: dict[str, Any] = {
        "status": status,
        "request_bytes": size,
        "upstream": "llm-vllm-m-8000",
        "upstream_addr": addr,
        "upstream_status": status,
        "count": 1,
    }
    return Signal(SignalKind.LB_RESPONSE, T0 + t, SourcePos("lb", int(t * 1000)), "ingress",
                  "ingress-nginx-controller-x", attrs=attrs)  # fmt: skip


def test_request_sizes_count_what_each_victim_held_and_settle() -> None:
    sizes = RequestSizes()
    for i in range(50):
        sizes.served(T0 - 60 + i, 3000)
    sizes.served(T0 - 500, 99_999)  # before the baseline window: not in it
    sizes.died("a", T0, "10.0.0.7")
    assert sizes.failed(lb(0.01, 500, 2000), 2000, "10.0.0.7") is not None  # the largest so far
    assert sizes.failed(lb(0.02, 500, 1500), 1500, "10.0.0.7") is None  # not the largest
    assert sizes.failed(lb(0.02, 500, 9000), 9000, "10.0.0.9") is None  # another pod's
    sizes.settle(T0 + 0.1)
    assert sizes.evidence().at_deaths == (("a", T0, (2000, 1500), False),)
    sizes.settle(T0 + 0.3)  # a line past the death by SETTLE_S: all of them are in
    evidence = sizes.evidence()
    assert evidence.at_deaths == (("a", T0, (2000, 1500), True),)
    assert evidence.baseline == (3000,) * 50


def test_the_correlator_attaches_the_largest_request_each_victim_held() -> None:
    corr = Correlator(CorrelateSettings())
    pod = "vllm-m-7d9f8b6c5d-x2k4p"
    chat = [lb(-100 + i, 200, 3000) for i in range(60)]
    oom = Signal(SignalKind.GPU_OOM, T0, SourcePos("c", 9), "llm", pod, "vllm",
                 attrs={"framework": "pytorch"})  # fmt: skip
    failed = [lb(0.01, 500, 2000), lb(0.02, 500, POISON), lb(0.03, 500, 2500)]
    out = corr.observe_all([*chat, oom, *failed, lb(0.5, 200, 3000)])
    held = [d for d in out if isinstance(d, EvidenceAdded) and d.kind == "request_held"]
    assert [d.signal.attrs["request_bytes"] for d in held] == [2000, POISON]
    key = next(iter(corr._open))
    context = corr.context(key)
    assert context is not None
    assert context.requests.at_deaths[0][2] == (POISON, 2500, 2000)
    assert diagnose(context).mechanism is Mechanism.OVERSIZED
