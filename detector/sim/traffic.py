"""Requests into the endpoint: arrivals, clients that retry, the gateway limit, the balancer.

Arrivals are Poisson (``recorder.arrivals``) at the scenario's steady rate (linear between its
knots) plus its bursts, with prompt lengths from a heavy-tailed mix (lognormal per class,
https://arxiv.org/abs/2309.06180 fig. 11 shows the long tails of real prompt lengths), plus
one-off requests. A client whose request fails (5xx or 429) retries after
``backoff_s x 2^k x U(0.5, 1)`` up to ``max_attempts`` in all, as the OpenAI and httpx retry
clients do; each retry is a new request. The gateway limit is nginx's aggregate ``limit_req``
and ``limit_conn`` (``Gateway``), answering 429 above either. The balancer picks a
Ready endpoint round robin (ingress-nginx's default) or by fewest requests in flight.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from detector.lab import recorder as r
from detector.lab import recorder_traffic as tr
from detector.sim.scenario import Burst, PromptClass, Scenario


@dataclass(slots=True)
class Client:
    """One client request and its retries: who sends it, its tokens, attempts made."""

    who: tuple[str, str]
    prompt: int
    output: int
    logprobs: bool
    max_attempts: int
    attempt: int = 0


@dataclass(slots=True)
class Arrivals:
    """The arrivals of a scenario, drawn from their own seeded generator."""

    scenario: Scenario
    rng: random.Random
    retries: list[tuple[float, int, Client]] = field(default_factory=list)
    _seq: int = 0

    def between(self, t0: float, t1: float) -> list[tuple[float, Client]]:
        """Return the requests (new and retried) arriving in ``[t0, t1)``, in time order."""
        sc, rng = self.scenario, self.rng
        knots = sc.traffic.rps
        out = [
            (t, self._client(rng.choices(sc.traffic.mix, [c.weight for c in sc.traffic.mix])[0]))
            for t in r.arrivals(rng, t0, t1, lambda t: r.interp(knots, t))
            if r.interp(knots, t) > 0.01
        ]
        for burst in sc.traffic.bursts:
            lo, hi = max(t0, burst.start_s), min(t1, burst.end_s)
            if lo >= hi:
                continue
            for t in r.arrivals(rng, lo, hi, _rate(burst)):
                prompt = rng.randint(*burst.prompt_tokens)
                out.append((t, self._new(prompt, rng.randint(*burst.output_tokens), False, None)))
        for one in sc.traffic.requests:
            if t0 <= one.at_s < t1:
                client = self._new(
                    one.prompt_tokens, one.output_tokens, one.prompt_logprobs, one.attempts
                )
                out.append((one.at_s, client))
        while self.retries and self.retries[0][0] < t1:
            t, _, client = heapq.heappop(self.retries)
            out.append((t, client))
        out.sort(key=lambda item: item[0])
        return out

    def _client(self, mix: PromptClass) -> Client:
        rng = self.rng
        prompt = mix.prompt_median * math.exp(mix.prompt_sigma * rng.gauss(0.0, 1.0))
        output = rng.expovariate(1.0 / mix.output_mean)
        return self._new(
            int(min(mix.prompt_max, max(16, prompt))),
            int(min(mix.output_max, max(1, output))),
            False,
            None,
        )

    def _new(self, prompt: int, output: int, logprobs: bool, attempts: int | None) -> Client:
        rng = self.rng
        who = (f"203.0.113.{rng.randrange(2, 250)}", rng.choice(tr.AGENTS))
        most = attempts if attempts is not None else self.scenario.clients.max_attempts
        return Client(who, prompt, output, logprobs, most)

    def failed(self, t: float, client: Client) -> None:
        """Schedule the client's retry after a failure at ``t``, if it has attempts left."""
        if client.attempt >= client.max_attempts:
            return
        wait = self.scenario.clients.backoff_s * 2 ** (client.attempt - 1)
        self._seq += 1
        heapq.heappush(self.retries, (t + wait * self.rng.uniform(0.5, 1.0), self._seq, client))


@dataclass(frozen=True, slots=True)
class GatewayLimit:
    """An aggregate gateway limit as nginx enforces it: ``limit_req`` at ``rps`` with ``burst``
    requests above the rate served at once (``nodelay``), and ``limit_conn`` at
    ``connections`` requests in progress (None: no concurrency limit); 429 beyond either."""

    rps: float
    burst: int = 0
    connections: int | None = None


@dataclass(slots=True)
class Gateway:
    """nginx's leaky bucket over all arrivals, one key (the aggregate), and its in-progress cap.

    ``limit_req ... nodelay``: a request passes while the bucket's excess, drained at ``rps``,
    stays within ``burst`` (the first request of the key is free), so a tight burst of N over
    D seconds gets at most 1 + burst + floor(rps x D) through
    (https://nginx.org/en/docs/http/ngx_http_limit_req_module.html). ``limit_conn``: a request
    passes while fewer than ``connections`` are in progress
    (https://nginx.org/en/docs/http/ngx_http_limit_conn_module.html).
    """

    limit: GatewayLimit | None = None
    excess: float = 0.0
    last: float | None = None  # None: the key has no state yet (its first request is free)

    def set(self, limit: GatewayLimit | None, t: float) -> None:
        """Set (or lift, with None) the limit at ``t``; the key starts with no state."""
        self.limit, self.excess, self.last = limit, 0.0, None

    def allow(self, t: float, in_progress: int = 0) -> bool:
        """Return whether a request at ``t`` passes, False for a 429 (a 429 changes nothing).

        nginx's ``ngx_http_limit_req_lookup``: excess = previous excess - rate x elapsed + 1,
        at least 0; over ``burst`` is rejected.
        """
        limit = self.limit
        if limit is None:
            return True
        if limit.connections is not None and in_progress >= limit.connections:
            return False
        if self.last is not None:
            excess = max(0.0, self.excess - (t - self.last) * limit.rps + 1.0)
            if excess > limit.burst + 1e-9:
                return False
            self.excess = excess
        self.last = t
        return True


T = TypeVar("T")


def _rate(burst: Burst) -> Callable[[float], float]:
    """Return a burst's rate function: constant, or linear from ``rps`` to ``rps_end``."""
    end = burst.rps if burst.rps_end is None else burst.rps_end
    knots = [(burst.start_s, burst.rps), (burst.end_s, end)]
    return lambda t: r.interp(knots, t)


@dataclass(slots=True)
class Balancer:
    """Pick an endpoint: ``round_robin`` in endpoint order, or ``least_connections``."""

    policy: str = "round_robin"
    turn: int = 0

    def pick(self, endpoints: Sequence[T], load: Sequence[int]) -> T:
        """Return the next endpoint; ``load[i]`` is endpoint i's requests in flight."""
        self.turn += 1
        if self.policy == "least_connections":
            fewest = min(load)
            tied = [e for e, n in zip(endpoints, load, strict=True) if n == fewest]
            return tied[self.turn % len(tied)]
        return endpoints[self.turn % len(endpoints)]
