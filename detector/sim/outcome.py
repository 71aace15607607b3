"""What a run did: to the endpoint and its pods (``Outcome``), and to each client request
(``ClientOutcome``, the figures people feel: failed in the end, shed, goodput, latency)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from detector.sim.traffic import Client

REFUSALS = frozenset({413, 429})  # the gateway's own answers: its body-size rule, its limit


@dataclass(frozen=True)
class Answered:
    """The answers the load balancer logged (one access line each) from ``start`` to before
    ``end`` (Unix seconds, whole seconds): ``responses``, ``answers_5xx`` (500-599) and
    ``shed`` (the gateway's refusals: 429 from its limit, 413 from its body-size rule)."""

    start: float
    end: float
    responses: int
    answers_5xx: int
    shed: int


@dataclass
class Outcome:
    """What the run did to the endpoint (attempts) and its pods; ``clients`` has the people.

    ``victims``: the first pod that died of GPU OOM in each replica slot, in order of death
    (a slot counts once however often its pods die again); ``pods_lost`` is their number;
    ``oom_causes``: what each GPU OOM tried to allocate for. ``attempts`` counts every attempt
    (a retry is one more; one still in flight or queued at the end has no answer yet);
    ``attempts_5xx``, ``attempts_429`` and ``attempts_413`` their answers. ``answers``: every
    answer by the whole Unix second it was logged in: [responses, 5xx, shed (413 and 429)], so
    that any span of whole seconds (a postmortem's buckets) can be counted (``answered``).
    ``all_serving_at``: the offset from which every replica is Ready again after the first OOM,
    to the end (None if never). ``deaths``: every GPU OOM death, repeats included;
    ``non_oom_deaths``: the other crashes (faults, liveness kills, failed starts);
    ``preemptions``: vLLM's preemptions and SGLang's retractions over every engine of the run.
    """

    pods_total: int
    pods_lost: int = 0
    victims: list[str] = field(default_factory=list)
    oom_causes: list[str] = field(default_factory=list)
    attempts: int = 0
    attempts_5xx: int = 0
    attempts_429: int = 0
    attempts_413: int = 0
    preemptions: int = 0
    first_oom_at: float | None = None
    all_serving_at: float | None = None
    deaths: int = 0
    non_oom_deaths: int = 0
    victim_slots: set[int] = field(default_factory=set, repr=False)
    answers: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def answer(self, time: float, status: int) -> None:
        """Count one answer with HTTP ``status`` logged at ``time`` (Unix seconds)."""
        if status == 429:
            self.attempts_429 += 1
        elif status == 413:
            self.attempts_413 += 1
        elif status >= 500:
            self.attempts_5xx += 1
        bucket = self.answers.setdefault(math.floor(time), [0, 0, 0])
        bucket[0] += 1
        bucket[1] += 500 <= status <= 599
        bucket[2] += status in REFUSALS

    def answered(self, start: float, end: float) -> Answered:
        """Return the answers logged from ``start`` to before ``end`` (Unix seconds, whole
        ones: a postmortem's span is whole buckets of seconds)."""
        first, last = math.floor(start), math.ceil(end)
        rows = [v for k, v in self.answers.items() if first <= k < last]
        return Answered(start, end, *(sum(r[i] for r in rows) for i in range(3)))


@dataclass(frozen=True)
class ClientOutcome:
    """What the clients felt, one client request each (its retries included).

    ``client_failed``: requests whose last attempt failed, shed ones included;
    ``shed_requests``: those whose last attempt the gateway refused itself (429; 413/400 from
    an admission rule); a 400 from the engine is a failure, not shed;
    ``client_unfinished``: still in flight or waiting to retry at the end (in neither);
    ``goodput_tokens_per_s``: output tokens of the successful requests over the run;
    latencies: first attempt to the successful answer, seconds (None: no success).
    """

    client_requests: int
    client_failed: int
    shed_requests: int
    client_unfinished: int
    goodput_tokens_per_s: float
    latency_p50_s: float | None
    latency_p99_s: float | None


def client_outcome(clients: list[Client], duration_s: float) -> ClientOutcome:
    """Return the per-request outcome of ``clients`` over a run of ``duration_s`` seconds."""
    done = [c for c in clients if c.final is not None]
    ok = [c for c in done if c.final == 200]
    shed = [c for c in done if c.shed]
    waits = sorted(c.done_at - c.first_at for c in ok if c.done_at is not None)

    def quantile(q: float) -> float | None:
        return round(waits[min(len(waits) - 1, int(q * len(waits)))], 2) if waits else None

    return ClientOutcome(
        client_requests=len(clients),
        client_failed=len(done) - len(ok),
        shed_requests=len(shed),
        client_unfinished=len(clients) - len(done),
        goodput_tokens_per_s=round(sum(c.output for c in ok) / duration_s, 1),
        latency_p50_s=quantile(0.5),
        latency_p99_s=quantile(0.99),
    )
