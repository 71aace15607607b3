"""Requests into the endpoint: arrivals, clients that retry as SDKs do, the gateway, the balancer.

Arrivals are Poisson (``recorder.arrivals``) at the scenario's steady rate (linear between its
knots) plus its bursts, with prompt lengths from a heavy-tailed mix (lognormal per class,
https://arxiv.org/abs/2309.06180 fig. 11 shows the long tails of real prompt lengths), plus
one-off requests. They are drawn from their own seeded generator that nothing else touches, so
every containment mode of one seed sees the same clients at the same moments.

A client is one request as a person or program sends it, with the OpenAI Python SDK's retries
(``ClientSpec``): 408, 409, 429 and 5xx are retried after ``min(0.5 x 2^n, 8) s x U(0.75, 1)``
up to ``max_retries`` times; 400 and 413 are final; a stream cut after its 200 is final. The
retry jitter has its own generator. The gateway is nginx's ``limit_req`` and ``limit_conn``
(``Gateway``), one per gateway replica; the balancer picks a Ready endpoint round robin
(ingress-nginx's default) or by fewest requests in flight.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from detector.lab import recorder as r
from detector.lab import recorder_traffic as tr
from detector.sim.scenario import Burst, OneOff, PromptClass, Scenario

GATEWAY_REFUSALS = frozenset({400, 413, 429})  # answered by the gateway itself: shed
CUT = 599  # the final "status" of a stream that broke after its 200


def retryable(status: int) -> bool:
    """Return whether the OpenAI SDK retries an answer (``_should_retry``): 408, 409, 429, 5xx,
    and 499, which stands here for the client's own timeout (retried as ``APITimeoutError``)."""
    return status in (408, 409, 429, 499) or status >= 500


@dataclass(slots=True)
class Client:
    """One client request and its attempts: who sends it, its tokens and options, its end.

    ``max_tokens``: what it asks for at most (its class's ``output_max``); ``first_at``: when
    its first attempt arrived; ``final``: the status of its last attempt
    once it has one (None while it is in flight or waits to retry; ``CUT`` for a stream that
    broke after its 200); ``done_at``: when it got that answer; ``shed``: the gateway refused
    it (429/413/400 with no upstream tried).
    """

    cid: int
    who: tuple[str, str]
    prompt: int
    output: int
    max_tokens: int = 0
    logprobs: bool = False
    prompt_logprobs: bool = False
    stream: bool = False
    max_retries: int = 2
    first_at: float = 0.0
    attempt: int = 0
    final: int | None = None
    done_at: float | None = None
    shed: bool = False
    via: int = 0  # the gateway replica of its current attempt


@dataclass(slots=True)
class Arrivals:
    """The arrivals of a scenario (module docstring); ``rng`` draws them, ``retry_rng`` jitter."""

    scenario: Scenario
    rng: random.Random
    retry_rng: random.Random
    retries: list[tuple[float, int, Client]] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def between(self, t0: float, t1: float) -> list[tuple[float, Client]]:
        """Return the attempts (new and retried) arriving in ``[t0, t1)``, in time order."""
        sc, rng = self.scenario, self.rng
        knots = sc.traffic.rps
        mix = sc.traffic.mix
        out = [
            (t, self._client(t, rng.choices(mix, [c.weight for c in mix])[0]))
            for t in r.arrivals(rng, t0, t1, lambda t: r.interp(knots, t))
            if r.interp(knots, t) > 0.01
        ]
        for burst in sc.traffic.bursts:
            lo, hi = max(t0, burst.start_s), min(t1, burst.end_s)
            if lo < hi:
                for t in r.arrivals(rng, lo, hi, _rate(burst)):
                    prompt = rng.randint(*burst.prompt_tokens)
                    output = rng.randint(*burst.output_tokens)
                    out.append((t, self._new(t, prompt, output, burst.output_tokens[1])))
        for one in sc.traffic.requests:
            for t in _times(one, t0, t1):
                client = self._new(t, one.prompt_tokens, one.output_tokens, one.output_tokens)
                client.prompt_logprobs = one.prompt_logprobs
                out.append((t, client))
        while self.retries and self.retries[0][0] < t1:
            t, _, client = heapq.heappop(self.retries)
            out.append((t, client))
        out.sort(key=lambda item: item[0])
        return out

    def _client(self, t: float, mix: PromptClass) -> Client:
        rng = self.rng
        prompt = mix.prompt_median * math.exp(mix.prompt_sigma * rng.gauss(0.0, 1.0))
        output = rng.expovariate(1.0 / mix.output_mean)
        client = self._new(
            t,
            int(min(mix.prompt_max, max(16, prompt))),
            int(min(mix.output_max, max(1, output))),
            mix.output_max,
        )
        client.logprobs = rng.random() < mix.logprobs_share
        return client

    def _new(self, t: float, prompt: int, output: int, max_tokens: int) -> Client:
        rng, spec = self.rng, self.scenario.clients
        who = (f"203.0.113.{rng.randrange(2, 250)}", rng.choice(tr.AGENTS))
        client = Client(
            next(self._ids),
            who,
            prompt,
            output,
            max_tokens=max_tokens,
            stream=rng.random() < spec.stream_share,
            max_retries=spec.max_retries,
            first_at=t,
        )
        self.clients.append(client)
        return client

    def answered(
        self, t: float, client: Client, status: int, *, cut: bool = False, gateway: bool = False
    ) -> None:
        """Take the answer to the client's attempt at ``t``: retry it, or make it final.

        ``cut``: a stream that broke after its 200 (failed, and never retried); ``gateway``:
        the gateway answered it itself (no upstream tried).
        """
        if not cut and status != 200 and retryable(status) and client.attempt <= client.max_retries:
            spec = self.scenario.clients
            delay = min(spec.initial_retry_delay_s * 2 ** (client.attempt - 1),
                        spec.max_retry_delay_s)  # fmt: skip
            wait = delay * (1 - 0.25 * self.retry_rng.random())
            heapq.heappush(self.retries, (t + wait, client.cid, client))
            return
        client.final = CUT if cut else status
        client.done_at = t
        client.shed = gateway and status in GATEWAY_REFUSALS


def _times(one: OneOff, t0: float, t1: float) -> list[float]:
    """Return the moments of a one-off request (and its repeats) in ``[t0, t1)``."""
    if one.every_s is None:
        return [one.at_s] if t0 <= one.at_s < t1 else []
    until = one.until_s if one.until_s is not None else math.inf
    k = max(0, math.ceil((t0 - one.at_s) / one.every_s - 1e-9))
    out: list[float] = []
    while (t := one.at_s + k * one.every_s) < min(t1, until):
        out.append(t)
        k += 1
    return out


def request_bytes(client: Client) -> int:
    """Return an attempt's ``$request_length`` in bytes: request line, headers and JSON body.

    About 4 bytes of prompt text per token (OpenAI's rule of thumb for English: "one token
    generally corresponds to ~4 characters", https://platform.openai.com/tokenizer) plus
    ``REQUEST_OVERHEAD_BYTES`` of request line, headers and the body's other fields.
    """
    return BYTES_PER_TOKEN * client.prompt + REQUEST_OVERHEAD_BYTES


BYTES_PER_TOKEN = 4
REQUEST_OVERHEAD_BYTES = 700


@dataclass(frozen=True, slots=True)
class GatewayLimit:
    """What the gateway's include files put in force, as nginx enforces it: ``limit_req`` at
    ``rps`` with ``burst`` requests above the rate served at once (``nodelay``), and
    ``limit_conn`` at ``connections`` requests in progress (None: no such limit), 429 beyond
    either; ``client_max_body_size`` at ``max_body_bytes`` (None: none), 413 beyond it.
    Without ``nodelay`` the requests over the rate wait in the burst, served at the rate."""

    rps: float | None = None
    burst: int = 0
    connections: int | None = None
    max_body_bytes: int | None = None
    nodelay: bool = True  # False: the burst is a queue, its requests wait for the rate


@dataclass(slots=True)
class Gateway:
    """nginx's leaky bucket over all arrivals, one key (the aggregate), and its in-progress cap.

    ``limit_req ... nodelay``: a request passes while the bucket's excess, drained at ``rps``,
    stays within ``burst`` (the first request of the key is free), so a tight burst of N over
    D seconds gets at most 1 + burst + floor(rps x D) through
    (https://nginx.org/en/docs/http/ngx_http_limit_req_module.html). ``limit_conn``: a request
    passes while fewer than ``connections`` are in progress
    (https://nginx.org/en/docs/http/ngx_http_limit_conn_module.html). One ``Gateway`` is one
    nginx: its zone is its own.
    """

    limit: GatewayLimit | None = None
    excess: float = 0.0
    last: float | None = None  # None: the key has no state yet (its first request is free)
    in_progress: int = 0

    def set(self, limit: GatewayLimit | None, t: float) -> None:
        """Set (or lift, with None) the limit at ``t``; the key starts with no state."""
        self.limit, self.excess, self.last = limit, 0.0, None

    def admits(self, length: int) -> bool:
        """Return whether a request of ``length`` bytes passes ``client_max_body_size``.

        nginx compares the Content-Length with it while it finds the location, before the
        ``limit_req`` phase, and answers 413 at once
        (https://nginx.org/en/docs/http/ngx_http_core_module.html#client_max_body_size).
        """
        limit = self.limit
        return limit is None or limit.max_body_bytes is None or length <= limit.max_body_bytes

    def admit(self, t: float) -> float | None:
        """Return how long a request at ``t`` waits before it is passed on (0: at once), or
        None for a 429 (a 429 changes nothing).

        nginx's ``ngx_http_limit_req_lookup``: excess = previous excess - rate x elapsed + 1,
        at least 0; over ``burst`` is rejected; without ``nodelay`` the request is delayed by
        excess / rate (``ngx_http_limit_req_handler``), so the burst is a queue.
        """
        limit = self.limit
        if limit is None or limit.rps is None:
            return 0.0
        if limit.connections is not None and self.in_progress >= limit.connections:
            return None
        excess = 0.0
        if self.last is not None:
            excess = max(0.0, self.excess - (t - self.last) * limit.rps + 1.0)
            if excess > limit.burst + 1e-9:
                return None
            self.excess = excess
        self.last = t
        return 0.0 if limit.nodelay else excess / limit.rps


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
