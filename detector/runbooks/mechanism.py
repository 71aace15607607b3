"""Tell how the pods die from the evidence, so containment answers that mechanism. Pure.

Three mechanisms call for different steps (the runbook's ``when`` per step):

- ``oversized_requests``: a class of requests far larger than the traffic's typical one was in
  flight at every death. One such request, or a few at once, needs memory the engine never
  reserved (vLLM's ``prompt_logprobs`` over a long prompt, vllm#5907; the activation peak of
  concurrent long contexts, vllm#13100/#13582; batch x length on a server without paged
  attention). A client retries the 500 it gets, so the same request kills the next pod
  within seconds; refusing that class at the gateway with a status clients do not retry
  (413) stops it, and costs only that class.
- ``unpaged_batch``: no such class, on a server that does not page its KV cache (an engine
  other than vLLM, SGLang or TGI): the batch ceiling bounds the memory.
- ``load``: no such class, on a paged engine: the survivors die of the traffic moved onto
  them; only less load per pod helps.

``undetermined`` while no request a victim held is known (its gateway lines come just after
the death, or the gateway does not log sizes); ``evidence_until`` says how long a step that
answers one mechanism waits for them; after that only the steps for any mechanism act.

The evidence is the gateway's request sizes (``detector.correlate.requests``: ``$request_length``
grows with the prompt, about 4 bytes per token). The class's bound is ``CLASS_MARGIN`` of the
smallest of the largest requests held at each death (the class was at every death); it is a
class only when that bound is at least ``OUTLIER_FACTOR`` times the median request served
before the first death and refuses at most ``MAX_REFUSED_SHARE`` of those requests.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from dataclasses import dataclass
from enum import StrEnum

from detector.capacity.sizing import normalize_engine
from detector.correlate.context import IncidentContext
from detector.incidents.questions import engine_config

OUTLIER_FACTOR = 4.0
MAX_REFUSED_SHARE = 0.2
CLASS_MARGIN = 0.9
MIN_BASELINE = 20  # requests served before the first death for a median to mean something
EVIDENCE_WAIT_S = 10.0
PAGED_ENGINES = frozenset({"vllm", "sglang", "tgi"})


class Mechanism(StrEnum):
    """How the pods die (module docstring)."""

    OVERSIZED = "oversized_requests"
    UNPAGED = "unpaged_batch"
    LOAD = "load"
    UNDETERMINED = "undetermined"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The mechanism, the evidence for it in one sentence, and the quarantine's bound.

    ``max_body_bytes``: the largest request the gateway should admit (``oversized_requests``
    only); ``refused_share``: the share of the requests served before the first death that
    bound would have refused; ``evidence_until``: until when (Unix s) an ``undetermined``
    diagnosis waits for the victims' requests.
    """

    mechanism: Mechanism
    evidence: str
    max_body_bytes: int | None = None
    refused_share: float | None = None
    evidence_until: float | None = None
    class_victims: tuple[str, ...] = ()


def diagnose(ctx: IncidentContext) -> Diagnosis:
    """Return the incident's mechanism from its evidence (module docstring)."""
    engine = normalize_engine(engine_config(ctx.signals).values.get("engine"))
    req = ctx.requests
    missing = [at for _, at, _, settled in req.at_deaths if not settled]
    until = max(missing) + EVIDENCE_WAIT_S if missing else None
    # the deaths whose requests are all in; before any is, what came of the first victim's
    # (a retried request is a second away: the first plan cannot wait for them all)
    held = [(p, at, sizes) for p, at, sizes, settled in req.at_deaths if sizes and settled]
    held = held or [(pod, at, sizes) for pod, at, sizes, _ in req.at_deaths[:1] if sizes]
    if not held:
        if not ctx.victims:
            return Diagnosis(Mechanism.UNDETERMINED, "no pod has died of GPU OOM yet")
        first = min((at for _, at, _, _ in req.at_deaths), default=ctx.opened_at)
        why = "no request a victim held is known (the gateway logs no $request_length, or not yet)"
        return Diagnosis(Mechanism.UNDETERMINED, why, evidence_until=first + EVIDENCE_WAIT_S)
    bound = int(CLASS_MARGIN * min(sizes[0] for _, _, sizes in held))
    deaths = "; ".join(
        f"{pod} held {len(sizes)} failed request(s), the largest {_kib(sizes[0])}"
        for pod, _, sizes in held
    )
    if len(req.baseline) < MIN_BASELINE:
        few = f"{deaths}; too few requests served before ({len(req.baseline)}) to compare"
        return _no_class(engine, few, until)
    median = statistics.median(req.baseline)
    refused = 1 - bisect_left(req.baseline, bound) / len(req.baseline)
    seen = (
        f"{deaths}; the {len(req.baseline)} requests served in the 2 min before had a median "
        f"of {_kib(median)}, {refused:.1%} of them at or over {_kib(bound)}"
    )
    if bound >= OUTLIER_FACTOR * median and refused <= MAX_REFUSED_SHARE:
        return Diagnosis(
            Mechanism.OVERSIZED,
            f"a request class far larger than the rest was in flight at every death: {seen}",
            max_body_bytes=bound,
            refused_share=round(refused, 4),
            evidence_until=until,
            class_victims=tuple(
                pod for pod, _, sizes, settled in req.at_deaths if settled and sizes
            ),
        )
    return _no_class(engine, f"no request class stands out: {seen}", until)


def _no_class(engine: str, seen: str, until: float | None) -> Diagnosis:
    if engine in PAGED_ENGINES:
        why = f"{seen}; {engine} pages its KV cache: the load per pod kills them"
        return Diagnosis(Mechanism.LOAD, why, evidence_until=until)
    return Diagnosis(
        Mechanism.UNPAGED,
        f"{seen}; the engine ({engine}) is not one known to page its KV cache: the batch "
        "x its lengths is the memory",
        evidence_until=until,
    )


def _kib(size: float) -> str:
    return f"{size / 1024:.1f} KiB"
