"""One vLLM replica: continuous batching, KV-cache growth and the GPU memory of each step.

The memory model (one GPU per replica, bytes):

- weights: the model's weights as vLLM logs them (Llama-3.1-8B: 14.99 GiB);
- KV cache: each running sequence holds ``kv_bytes_per_token`` (``detector.capacity.sizing``:
  2 x layers x KV heads x head dim x bytes; 128 KiB for Llama-3.1-8B in bf16) for every prompt
  token prefilled so far and every token generated (https://arxiv.org/abs/2309.06180 s2.3);
- activation peak of the step: ``activation_bytes_per_token`` x the step's batched tokens
  (decodes plus the prefill chunk, at most ``max_num_batched_tokens``) plus the fp32 logits
  of the running sequences (vocab x 4 bytes each); a ``prompt_logprobs`` request in prefill
  adds ``logprobs_copies`` fp32-sized ``[prompt tokens so far, vocab]`` tensors (logits,
  log-softmax, the top-k sort's values and int64 indices: 5), as the prompt-logprobs path
  materialized them before it was chunked (vllm-project/vllm#5907, #14239);
- non-torch memory: CUDA context, NCCL and cuBLAS workspaces.

When their sum passes the GPU's capacity the step's allocation fails: ``torch.OutOfMemoryError``
and the engine dies. The simplification, stated: the simulated scheduler admits sequences by
``max_num_seqs`` and the step's token budget only, and KV blocks are allocated as tokens come
(past the pool vLLM profiles at start) - the unbounded dynamic batch of the failure this project
exists for. With ``max_num_seqs`` at the ceiling ``detector ceilings`` computes (sequences of
``max_model_len`` that fit the pool) the KV cache never passes the pool and the replica
survives. ``kv_cache_usage_perc`` is the KV held over the pool, at most 1.

Speeds: every running sequence past its prefill gains ``decode_tokens_per_s``; the replica
prefills ``prefill_tokens_per_s`` prompt tokens a second, first come first served, each step's
chunk bounded by ``max_num_batched_tokens`` less the decodes of the step (chunked prefill,
https://docs.vllm.ai/en/latest/configuration/optimization.html#chunked-prefill).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from detector.capacity import sizing
from detector.sim.scenario import Scenario

GIB = 1024**3
FP32 = 4


@dataclass(frozen=True, slots=True)
class Physics:
    """The memory constants of one replica, in bytes (module docstring)."""

    kv_bytes_per_token: int
    weights_bytes: int
    non_torch_bytes: int
    capacity_bytes: int
    reserved_bytes: int  # what vLLM holds from start: utilization x capacity
    kv_pool_tokens: int
    kv_pool_bytes: int
    vocab: int
    activation_bytes_per_token: int
    logprobs_copies: int
    decode_tokens_per_s: float
    prefill_tokens_per_s: float


def physics(scenario: Scenario, args: dict[str, int]) -> Physics:
    """Return a replica's constants; the KV pool is vLLM's profile, sized by ``capacity.sizing``.

    Pool = capacity x utilization - weights - (activation peak at the token budget +
    non-torch memory), as vLLM's profiler reserves it (its log: "Available KV cache memory").
    """
    model, gpu, engine = scenario.model, scenario.gpu, scenario.engine
    kvb = sizing.kv_bytes_per_token(model.layers, model.kv_heads, model.head_dim, model.dtype_bytes)
    capacity = round(gpu.capacity_gib * GIB)
    weights = round(model.weights_gib * GIB)
    non_torch = round(engine.non_torch_gib * GIB)
    peak = engine.activation_bytes_per_token * args["max-num-batched-tokens"] + non_torch
    pool = sizing.kv_capacity_from_memory(
        gpu_bytes=capacity,
        utilization=engine.gpu_memory_utilization,
        weights_bytes=weights,
        activation_reserve_bytes=peak,
        bytes_per_token=kvb,
    )
    return Physics(
        kv_bytes_per_token=kvb,
        weights_bytes=weights,
        non_torch_bytes=non_torch,
        capacity_bytes=capacity,
        reserved_bytes=round(capacity * engine.gpu_memory_utilization),
        kv_pool_tokens=pool.tokens,
        kv_pool_bytes=pool.budget_bytes or pool.tokens * kvb,
        vocab=model.vocab,
        activation_bytes_per_token=engine.activation_bytes_per_token,
        logprobs_copies=engine.logprobs_copies,
        decode_tokens_per_s=engine.decode_tokens_per_s,
        prefill_tokens_per_s=engine.prefill_tokens_per_s,
    )


@dataclass(slots=True)
class Sequence:
    """One request inside an engine: tokens prefilled and generated so far."""

    rid: int
    prompt: int
    output: int
    logprobs: bool = False
    prefilled: int = 0
    generated: float = 0.0

    @property
    def tokens(self) -> float:
        """Return the tokens whose KV the sequence holds."""
        return self.prefilled + self.generated


@dataclass(frozen=True, slots=True)
class Oom:
    """A failed allocation: what was tried and the memory around it, in bytes."""

    tried: int
    in_use: int
    capacity: int


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step did: finished sequences with their fraction of the step, or the OOM."""

    finished: list[tuple[Sequence, float]]
    oom: Oom | None
    in_use_bytes: int


@dataclass(slots=True)
class Engine:
    """The scheduler and memory of one running vLLM engine (module docstring)."""

    phys: Physics
    max_num_seqs: int
    max_num_batched_tokens: int
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    prompt_tokens: float = 0.0  # counters for the stats line
    generation_tokens: float = 0.0
    in_use_bytes: int = 0

    @property
    def load(self) -> int:
        """Return the requests in the engine (running and waiting): its connections."""
        return len(self.running) + len(self.waiting)

    def kv_bytes(self) -> float:
        """Return the KV-cache bytes the running sequences hold."""
        return sum(s.tokens for s in self.running) * self.phys.kv_bytes_per_token

    def kv_usage(self) -> float:
        """Return vLLM's ``kv_cache_usage_perc``: KV held over the pool, 0-1."""
        return min(1.0, self.kv_bytes() / max(1, self.phys.kv_pool_bytes))

    def remove(self, rid: int) -> bool:
        """Abort a request (client gone, upstream timeout); True if it was here."""
        for queue in (self.running, self.waiting):
            for seq in queue:
                if seq.rid == rid:
                    queue.remove(seq)
                    return True
        return False

    def step(self, dt: float) -> StepResult:
        """Advance ``dt`` seconds: admit, prefill, decode, then check the step's memory."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.popleft())
        phys = self.phys
        decoding = [s for s in self.running if s.prefilled >= s.prompt]
        prefilling = [s for s in self.running if s.prefilled < s.prompt]
        room = max(0, self.max_num_batched_tokens - len(decoding))
        steps = phys.decode_tokens_per_s * dt
        budget = int(min(phys.prefill_tokens_per_s * dt, steps * room))
        pending = sum(s.prompt - s.prefilled for s in prefilling)
        batched = min(self.max_num_batched_tokens, len(decoding) + pending)
        logits = len(self.running) * phys.vocab * FP32
        for seq in prefilling:
            take = min(budget, seq.prompt - seq.prefilled)
            seq.prefilled += take
            budget -= take
            self.prompt_tokens += take
            if seq.logprobs and take:
                logits += seq.prefilled * phys.vocab * FP32 * phys.logprobs_copies
        finished: list[tuple[Sequence, float]] = []
        gain = phys.decode_tokens_per_s * dt
        for seq in decoding:
            left = seq.output - seq.generated
            seq.generated += min(gain, left)
            self.generation_tokens += min(gain, left)
            if left <= gain:
                finished.append((seq, left / gain if gain else 1.0))
        activation = phys.activation_bytes_per_token * batched + logits
        held = phys.weights_bytes + phys.non_torch_bytes + round(self.kv_bytes())
        self.in_use_bytes = held + activation
        if self.in_use_bytes > phys.capacity_bytes:
            return StepResult([], Oom(activation, held, phys.capacity_bytes), self.in_use_bytes)
        for seq, _ in finished:
            self.running.remove(seq)
        return StepResult(finished, None, self.in_use_bytes)
