"""One serving engine's scheduler, speed and GPU memory, each from the engine's own rules.

**vLLM V1** (``kind: vllm``), after ``vllm/v1/core/sched/scheduler.py`` (v0.11.0,
https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/v1/core/sched/scheduler.py) and
``vllm/v1/worker/gpu_worker.py``:

- the KV pool is fixed at start: ``total x gpu_memory_utilization - (weights + profiled
  activation peak + non-torch memory)`` ("Available KV cache memory"), in blocks of
  ``block_size`` tokens; CUDA graphs are captured after it is sized and are not in it;
- each step the RUNNING requests are scheduled first, oldest first: a request's new tokens
  need KV blocks (``allocate_slots``); when a block is missing the newest running request is
  preempted (FCFS: ``self.running.pop()``): its blocks are freed, ``num_computed_tokens = 0``
  (recompute: prompt and generated tokens are prefilled again) and it goes to the FRONT of the
  waiting queue; counted in ``vllm:num_preemptions_total``, never logged by V1;
- WAITING requests are admitted only in a step without preemption, in order, while a running
  slot is free (``max_num_seqs``), the token budget (``max_num_batched_tokens``) lasts and
  ``allocate_slots`` succeeds for the chunk; the first that does not fit stops admission;
- so the KV cache never causes an OOM. What does is memory the start-up profile never measured
  (``profile_run`` runs ``max_num_batched_tokens`` tokens and samples ``min(max_num_seqs,
  max_num_batched_tokens)`` rows with ``max_num_logprobs=None``): a ``prompt_logprobs``
  request's ``[scheduled tokens, vocab]`` logits and their fp32 ``log_softmax``
  (``_get_prompt_logprobs_dict``; vllm#5907, PR #52054: "~7.5 GiB" at 8192 tokens and a 152k
  vocabulary); the sampler's fp32 ``log_softmax`` over ``[running, vocab]`` when any running
  request asks for ``logprobs`` (``Sampler.compute_logprobs``); and an activation peak that
  grows with the context the batch holds (vllm#13100 at utilization 0.99, #13582 at 0.97:
  crashes with concurrent long-context requests, none with one; neither report names the
  buffer, so ``long_context_bytes_per_token`` is a stand-in fitted to #13100: several ~10.5k-token
  requests pass the ~0.8 GiB an A100 80GB keeps at 0.99, one does not). They must
  fit in what the reservation leaves: ``total x (1 - utilization)`` less CUDA graphs and any
  other process on the GPU. More is ``torch.OutOfMemoryError`` and the engine dies.

**SGLang** (``kind: sglang``), after ``python/sglang/srt/model_executor/model_runner.py`` and
``managers/schedule_batch.py``/``schedule_policy.py``
(https://github.com/sgl-project/sglang/tree/main/python/sglang/srt): the token pool is
``total x mem_fraction_static - weights - non-torch`` ("KV Cache is allocated. #tokens: N");
nothing is profiled, so every activation, the logits and CUDA graphs live in ``total x (1 -
mem_fraction_static)``; a waiting request is admitted when its prompt plus
``new_token_ratio`` x its output fits what the running requests' expected output leaves
(``PrefillAdder``); the ratio starts at 0.7 and decays over 600 iterations to 0.098; when
decode runs out of tokens it retracts the running request with the fewest output tokens (ties:
the longest prompt) to the BACK of the queue, recomputed later, and re-estimates the ratio as
(tokens decoded + 20 x requests) / their ``max_new_tokens`` ("Decode out of memory happened.
#retracted_reqs: N, #new_token_ratio: a -> b", sgl-project/sglang#4184).

**Without paged attention** (``kind: unpaged``: a plain PyTorch/transformers server, Triton
dynamic batching): nothing reserves a pool; up to ``max_num_seqs`` requests run at once, each
holding KV for every token it has, and batch x length is the memory: when weights, KV and the
step's activations pass the GPU the allocation fails (the design card's many 32k prompts).

Speed (both kinds): one engine iteration takes ``iteration_base_s + iteration_per_seq_s x
running + prefill tokens / prefill_tokens_per_s``; each running request past its prefill gains
one token per iteration, so decode slows as the batch grows and long prefills slow everyone
(chunked prefill mixes both in one batch of at most ``max_num_batched_tokens``:
https://docs.vllm.ai/en/latest/configuration/optimization.html#chunked-prefill).

This module imports nothing of the product: its memory is the engine's, not the detector's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from detector.sim.scenario import Scenario

GIB = 1024**3
FP32 = 4


@dataclass(frozen=True, slots=True)
class Physics:
    """The constants of one engine, bytes and seconds (module docstring)."""

    kind: str  # "vllm" | "sglang" | "unpaged"
    block_size: int
    kv_bytes_per_token: int
    weights_bytes: int
    non_torch_bytes: int
    capacity_bytes: int
    kv_pool_tokens: int  # 0 without paged attention
    kv_pool_bytes: int
    headroom_bytes: int  # what the reservation leaves for allocations the profile missed
    vocab: int
    activation_bytes_per_token: int
    logprobs_bytes_per_entry: int
    long_context_bytes_per_token: float  # unprofiled bytes per token of context in the batch
    iteration_base_s: float
    iteration_per_seq_s: float
    prefill_tokens_per_s: float

    @property
    def paged(self) -> bool:
        """Return whether a KV pool is reserved (vLLM, SGLang)."""
        return self.kind != "unpaged"


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Return the KV cache of one token: K and V per layer, ``2 x layers x heads x dim x bytes``.

    The attention cache of a decoder-only transformer (https://arxiv.org/abs/2309.06180 s2.3).
    """
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def physics(scenario: Scenario, args: dict[str, int]) -> Physics:
    """Return an engine's constants for its args (``max-num-batched-tokens``, ``max-num-seqs``).

    vLLM's profile (``determine_available_memory``): requested = capacity x utilization; the
    pool is requested - weights - non-torch - the activation peak of ``max_num_batched_tokens``
    tokens - the sampler's fp32 logits of ``min(max_num_seqs, max_num_batched_tokens)`` rows.
    """
    model, gpu, engine = scenario.model, scenario.gpu, scenario.engine
    kvb = kv_bytes_per_token(model.layers, model.kv_heads, model.head_dim, model.dtype_bytes)
    capacity = round(gpu.capacity_gib * GIB)
    weights = round(model.weights_gib * GIB)
    non_torch = round(engine.non_torch_gib * GIB)
    batched, seqs = args["max-num-batched-tokens"], args["max-num-seqs"]
    peak = engine.activation_bytes_per_token * batched + min(seqs, batched) * model.vocab * FP32
    fraction = engine.gpu_memory_utilization
    if engine.kind == "sglang":  # nothing profiled: the transients come out of the rest
        fraction, peak = engine.mem_fraction_static, 0
    requested = capacity * fraction
    block = 1 if engine.kind == "sglang" else engine.block_size  # SGLang's page size 1
    pool_bytes = max(0, int(requested - weights - non_torch - peak))
    pool_tokens = pool_bytes // kvb // block * block
    headroom = capacity - requested - (engine.cuda_graph_gib + engine.co_tenant_gib) * GIB
    paged = engine.kind != "unpaged"
    return Physics(
        kind=engine.kind,
        block_size=block,
        kv_bytes_per_token=kvb,
        weights_bytes=weights,
        non_torch_bytes=non_torch,
        capacity_bytes=capacity,
        kv_pool_tokens=pool_tokens if paged else 0,
        kv_pool_bytes=pool_tokens * kvb if paged else 0,
        headroom_bytes=int(headroom),
        vocab=model.vocab,
        activation_bytes_per_token=engine.activation_bytes_per_token,
        logprobs_bytes_per_entry=engine.logprobs_bytes_per_entry,
        long_context_bytes_per_token=engine.long_context_bytes_per_token,
        iteration_base_s=engine.iteration_base_s,
        iteration_per_seq_s=engine.iteration_per_seq_s,
        prefill_tokens_per_s=engine.prefill_tokens_per_s,
    )


@dataclass(slots=True)
class Sequence:
    """One request inside an engine: its tokens, what it asks for, and its progress.

    ``computed``: tokens whose KV is in the cache; the request is prefilling while ``computed <
    prompt + generated`` (after a preemption it prefills its generated tokens again).
    """

    rid: int
    prompt: int
    output: int
    logprobs: bool = False
    prompt_logprobs: bool = False
    generated: float = 0.0
    computed: float = 0.0
    blocks: int = 0
    preempted: int = 0

    @property
    def target(self) -> float:
        """Return the tokens to prefill before the next decode: prompt and generated."""
        return self.prompt + self.generated

    @property
    def prefilling(self) -> bool:
        """Return whether the request still has prompt (or recomputed) tokens to prefill."""
        return self.computed < self.target - 1e-9


SG_INIT_RATIO, SG_MIN_RATIO, SG_DECAY_STEPS, SG_RETRACT_STEPS = 0.7, 0.098, 600, 20


@dataclass(frozen=True, slots=True)
class Oom:
    """A failed allocation: the bytes tried, the bytes in use, the capacity, and what it was."""

    tried: int
    in_use: int
    capacity: int
    cause: str  # "prompt_logprobs" | "sampler_logprobs" | "long_context" | "kv_cache"


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step did: finished requests with the fraction of the step, or the OOM."""

    finished: list[tuple[Sequence, float]]
    oom: Oom | None
    first_tokens: list[Sequence] = field(default_factory=list)


@dataclass(slots=True)
class Engine:
    """The scheduler and memory of one running engine (module docstring)."""

    phys: Physics
    max_num_seqs: int
    max_num_batched_tokens: int
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    prompt_tokens: float = 0.0  # counters for the stats line, reset by it
    generation_tokens: float = 0.0
    preemptions: int = 0  # vllm:num_preemptions_total
    in_use_bytes: int = 0
    dead: bool = False  # a zombie: the core is gone, the API server still queues requests
    new_token_ratio: float = SG_INIT_RATIO  # SGLang's admission estimate
    retractions: list[tuple[int, float, float]] = field(default_factory=list)  # (n, old, new)

    @property
    def load(self) -> int:
        """Return the requests in the engine (running and waiting): its connections."""
        return len(self.running) + len(self.waiting)

    @property
    def free_blocks(self) -> int:
        """Return the KV blocks no running request holds."""
        return self.phys.kv_pool_tokens // self.phys.block_size - self._held_blocks()

    def _held_blocks(self) -> int:
        return sum(s.blocks for s in self.running)

    def kv_usage(self) -> float:
        """Return vLLM's ``kv_cache_usage_perc``: blocks held over the pool, 0-1.

        Without a pool (unpaged), the KV held over what the GPU leaves after the weights.
        """
        phys = self.phys
        if phys.paged:
            return min(1.0, self._held_blocks() * phys.block_size / max(1, phys.kv_pool_tokens))
        room = phys.capacity_bytes - phys.weights_bytes - phys.non_torch_bytes
        return min(1.0, self._kv_bytes() / max(1, room))

    def _kv_bytes(self) -> float:
        return sum(s.computed for s in self.running) * self.phys.kv_bytes_per_token

    def remove(self, rid: int) -> bool:
        """Abort a request (client gone, upstream timeout), freeing its blocks; True if here."""
        for queue in (self.running, self.waiting):
            for seq in queue:
                if seq.rid == rid:
                    queue.remove(seq)
                    return True
        return False

    def _blocks_for(self, tokens: float) -> int:
        size = self.phys.block_size
        return int(-(-int(tokens + 0.999) // size))

    # --- one step --------------------------------------------------------------------------

    def step(self, dt: float) -> StepResult:
        """Advance ``dt`` seconds of engine iterations: schedule, check memory, progress."""
        if self.dead:
            self.waiting.extend(self.running)
            self.running.clear()
            return StepResult([], None)
        phys = self.phys
        decoding = sum(1 for s in self.running if not s.prefilling)
        prefill_room = max(0, self.max_num_batched_tokens - decoding)
        iterations, prefill_cap = self._iterations(dt, decoding, prefill_room)
        if phys.kind == "sglang":
            self._schedule_sglang(iterations, prefill_cap)
        elif phys.paged:
            preempted = self._schedule_running(iterations, prefill_cap)
            if not preempted:
                self._admit(prefill_cap)
        else:
            while self.waiting and len(self.running) < self.max_num_seqs:
                self.running.append(self.waiting.popleft())
        chunks = self._prefill_chunks(prefill_cap)
        oom = self._memory(chunks, iterations, prefill_room)
        if oom is not None:
            return StepResult([], oom)
        return self._progress(chunks, iterations)

    def _iterations(self, dt: float, decoding: int, room: int) -> tuple[float, float]:
        """Return (engine iterations in ``dt``, prompt tokens they can prefill)."""
        phys = self.phys
        running = len(self.running) + min(len(self.waiting), self.max_num_seqs)
        decode_s = phys.iteration_base_s + phys.iteration_per_seq_s * running
        demand = sum(s.target - s.computed for s in self.running)
        demand += sum(s.target for s in self.waiting)
        if demand <= 0 or room <= 0:
            return dt / decode_s, 0.0
        full = dt / (decode_s + room / phys.prefill_tokens_per_s)  # every iteration chunked full
        if full * room < demand:
            return full, full * room
        spare = dt - demand / phys.prefill_tokens_per_s
        return max(full, spare / decode_s), demand

    def _schedule_running(self, iterations: float, prefill_cap: float) -> bool:
        """Give running requests the blocks of their new tokens, preempting the newest."""
        budget, preempted, k = prefill_cap, False, 0
        while k < len(self.running):
            seq = self.running[k]
            if seq.prefilling:
                take = min(budget, seq.target - seq.computed)
                budget -= take
                grow = take
            else:
                grow = min(iterations, seq.output - seq.generated)
            need = self._blocks_for(seq.computed + grow) - seq.blocks
            while need > self.free_blocks:
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    return True
            seq.blocks += max(0, need)
            k += 1
        return preempted

    def _preempt(self, seq: Sequence) -> None:
        seq.blocks, seq.computed = 0, 0.0
        seq.preempted += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def _admit(self, prefill_cap: float) -> None:
        """Admit waiting requests in order while slots, budget and blocks last."""
        budget = prefill_cap - sum(s.target - s.computed for s in self.running if s.prefilling)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            chunk = min(budget, seq.target)
            need = self._blocks_for(chunk)
            if need > self.free_blocks:
                break
            self.waiting.popleft()
            seq.blocks = need
            self.running.append(seq)
            budget -= chunk

    def _schedule_sglang(self, iterations: float, prefill_cap: float) -> None:
        """SGLang: grow the running requests, retracting on a shortage; admit by the reserve."""
        budget, retracted = prefill_cap, 0
        for seq in list(self.running):
            if seq not in self.running:
                continue  # retracted for an earlier one
            grow = min(budget, seq.target - seq.computed) if seq.prefilling else 0.0
            budget -= grow
            if not seq.prefilling:
                grow = min(iterations, seq.output - seq.generated)
            need = self._blocks_for(seq.computed + grow) - seq.blocks
            while need > self.free_blocks and len(self.running) > 1:
                victim = min(self.running, key=lambda s: (s.generated, -s.prompt))
                self.running.remove(victim)
                victim.blocks, victim.computed = 0, 0.0
                victim.preempted += 1
                self.waiting.append(victim)
                retracted += 1
                if victim is seq:
                    break
            if seq in self.running:
                seq.blocks += max(0, min(need, self.free_blocks))
        if retracted:
            self.preemptions += retracted
            old = self.new_token_ratio
            decoded = sum(s.generated for s in self.running)
            planned = sum(s.output for s in self.running) or 1
            self.new_token_ratio = min(
                1.0, (decoded + SG_RETRACT_STEPS * len(self.running)) / planned
            )
            self.retractions.append((retracted, old, self.new_token_ratio))
            return
        self._admit_sglang(prefill_cap)
        decay = (SG_INIT_RATIO - SG_MIN_RATIO) / SG_DECAY_STEPS * iterations
        self.new_token_ratio = max(SG_MIN_RATIO, self.new_token_ratio - decay)

    def _admit_sglang(self, prefill_cap: float) -> None:
        """Admit while prompt + ratio x output fits what the running requests leave."""
        ratio = self.new_token_ratio
        left = self.free_blocks - sum((s.output - s.generated) * ratio for s in self.running)
        budget = prefill_cap - sum(s.target - s.computed for s in self.running if s.prefilling)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            cost = seq.target + (seq.output - seq.generated) * ratio
            if cost > left:
                break
            self.waiting.popleft()
            chunk = min(budget, seq.target)
            seq.blocks = self._blocks_for(chunk)
            self.running.append(seq)
            budget -= chunk
            left -= cost

    def _prefill_chunks(self, prefill_cap: float) -> list[tuple[Sequence, float]]:
        """Return the prompt tokens each prefilling request gets this step, first come first."""
        out: list[tuple[Sequence, float]] = []
        budget = prefill_cap
        for seq in self.running:
            if budget <= 0:
                break
            if seq.prefilling:
                take = min(budget, seq.target - seq.computed)
                if self.phys.paged:
                    take = min(take, seq.blocks * self.phys.block_size - seq.computed)
                if take > 0:
                    out.append((seq, take))
                    budget -= take
        return out

    def _memory(
        self, chunks: list[tuple[Sequence, float]], iterations: float, room: int
    ) -> Oom | None:
        """Return the step's failed allocation, or None when everything fits."""
        phys = self.phys
        rows = len(self.running)
        per_iteration = max(1.0, iterations)
        if phys.paged:
            free = phys.headroom_bytes
            row = phys.vocab * phys.logprobs_bytes_per_entry
            chunk_rows = [min(t / per_iteration, room) for s, t in chunks if s.prompt_logprobs]
            extra = [
                ("prompt_logprobs", max(chunk_rows, default=0.0) * row),
                ("sampler_logprobs", rows * row if any(s.logprobs for s in self.running) else 0.0),
                (
                    "long_context",
                    sum(s.computed for s in self.running) * phys.long_context_bytes_per_token,
                ),
            ]
            if phys.kind == "sglang":  # nothing profiled: the step's own activations too
                batched = min(self.max_num_batched_tokens, sum(t for _, t in chunks) + rows)
                act = phys.activation_bytes_per_token * batched + rows * phys.vocab * FP32
                extra.append(("activation", act))
            self.in_use_bytes = int(phys.capacity_bytes - free + sum(b for _, b in extra))
            cause, tried = max(extra, key=lambda item: item[1])
            if sum(b for _, b in extra) > free:
                return Oom(int(tried), phys.capacity_bytes - free, phys.capacity_bytes, cause)
            return None
        batched = min(self.max_num_batched_tokens, sum(t for _, t in chunks) + rows)
        activation = phys.activation_bytes_per_token * batched + rows * phys.vocab * FP32
        grown = sum(t for _, t in chunks) + iterations * (rows - len(chunks))
        held = phys.weights_bytes + phys.non_torch_bytes + self._kv_bytes()
        kv_step = grown * phys.kv_bytes_per_token
        self.in_use_bytes = int(held + kv_step + activation)
        if self.in_use_bytes > phys.capacity_bytes:
            return Oom(int(kv_step + activation), int(held), phys.capacity_bytes, "kv_cache")
        return None

    def _progress(self, chunks: list[tuple[Sequence, float]], iterations: float) -> StepResult:
        """Prefill the chunks, decode the rest; return what finished and what began to stream."""
        prefilled = {id(s): take for s, take in chunks}
        finished: list[tuple[Sequence, float]] = []
        first: list[Sequence] = []
        for seq in list(self.running):
            take = prefilled.get(id(seq))
            if take is not None:
                seq.computed += take
                self.prompt_tokens += take
                continue
            if seq.prefilling:
                continue  # no budget left this step
            left = seq.output - seq.generated
            gain = min(iterations, left)
            if seq.generated == 0 and gain > 0:
                first.append(seq)
            seq.generated += gain
            seq.computed += gain
            self.generation_tokens += gain
            if self.phys.paged:
                seq.blocks = max(seq.blocks, self._blocks_for(seq.computed))
            if left <= iterations:
                finished.append((seq, left / iterations if iterations else 1.0))
                self.running.remove(seq)
        return StepResult(finished, None, first)
