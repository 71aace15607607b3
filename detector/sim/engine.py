"""One serving engine's scheduler and speed, each from the engine's own rules (memory: ``memory``).

**vLLM V1** (``kind: vllm``), after ``vllm/v1/core/sched/scheduler.py`` (v0.11.0, the same
logic as the v0.10.1 image the pods run,
https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/v1/core/sched/scheduler.py): the KV
pool is fixed at start, in blocks of ``block_size`` tokens; each step the RUNNING requests are
scheduled first, oldest first: a request's new tokens need blocks (``allocate_slots``); when a
block is missing the newest running request is preempted (FCFS: ``self.running.pop()``): its
blocks are freed, ``num_computed_tokens = 0`` (recompute: prompt and generated tokens are
prefilled again) and it goes to the FRONT of the waiting queue; counted in
``vllm:num_preemptions_total``, never logged by V1. WAITING requests are admitted only when no
request was preempted, in order, while a running slot is free (``max_num_seqs``), the token
budget (``max_num_batched_tokens``) lasts and ``allocate_slots`` succeeds for the chunk; the
first that does not fit stops admission. The KV cache never causes an OOM. Simplification:
the model steps ``step_s`` (0.5 s, many engine iterations) at once, so a preemption blocks
admission for the whole step, where vLLM blocks it for one iteration.

**SGLang** (``kind: sglang``), after ``managers/schedule_policy.py`` (``PrefillAdder``) and
``managers/schedule_batch.py`` (``retract_decode``) of the 0.4.6 image the pods run
(https://github.com/sgl-project/sglang/tree/v0.4.6.post5/python/sglang/srt): a page is one
token; a waiting request is admitted when its prompt plus its ``max_new_tokens`` (at most 4096)
fit what the running requests leave, each of those reserving its remaining ``max_new_tokens``
x ``new_token_ratio``; the ratio starts at 0.7 and decays over 600 decode steps to 0.098. When
decode runs out of tokens it retracts the running request with the fewest output tokens (ties:
the longest prompt) to the BACK of the queue, recomputed later, until the others have room for
20 more tokens each; the last one left is aborted; the ratio is re-estimated as (tokens decoded
+ 20 x requests) / their ``max_new_tokens`` ("Decode out of memory happened.
#retracted_reqs: N, #new_token_ratio: a -> b").

**Without paged attention** (``kind: unpaged``: a plain PyTorch/transformers server, Triton
dynamic batching): up to ``max_num_seqs`` requests run at once, each holding KV for every token
it has; batch x length is the memory.

Speed (every kind): decode is bound by reading the weights and the KV the batch holds from
HBM, so one iteration takes ``iteration_overhead_s + iteration_per_seq_s x running + (weights
+ KV held) / hbm_bytes_per_s + prefill tokens / prefill_tokens_per_s``; each running request
past its prefill gains one token per iteration, so decode slows as the batch and its context
grow and long prefills slow everyone (chunked prefill mixes both in one batch of at most
``max_num_batched_tokens``: https://docs.vllm.ai/en/latest/configuration/optimization.html).

This module imports nothing of the product.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from detector.sim.memory import Oom, Physics, StepLoad, check, peak_bytes

SG_INIT_RATIO, SG_MIN_RATIO, SG_DECAY_STEPS, SG_RETRACT_STEPS = 0.7, 0.098, 600, 20
SG_CLIP_MAX_NEW_TOKENS = 4096


@dataclass(slots=True)
class Sequence:
    """One request inside an engine: its tokens, what it asks for, and its progress.

    ``output``: the tokens it will generate; ``max_new``: the client's ``max_tokens`` (what
    SGLang reserves by; at least ``output``). ``computed``: tokens whose KV is in the cache; the
    request is prefilling while ``computed < prompt + generated`` (after a preemption it
    prefills its generated tokens again).
    """

    rid: int
    prompt: int
    output: int
    logprobs: bool = False
    prompt_logprobs: bool = False
    max_new: int = 0
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

    def reserve(self) -> float:
        """Return SGLang's tokens still to come: ``min(max_new_tokens - generated, 4096)``."""
        return min(max(self.max_new, self.output) - self.generated, SG_CLIP_MAX_NEW_TOKENS)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step did: finished requests with the fraction of the step, the requests whose
    first token came, those the engine aborted (SGLang's last request), or the OOM."""

    finished: list[tuple[Sequence, float]]
    oom: Oom | None
    first_tokens: list[Sequence] = field(default_factory=list)
    aborted: list[Sequence] = field(default_factory=list)


@dataclass(slots=True)
class Engine:
    """The scheduler of one running engine (module docstring); memory is ``memory.check``."""

    phys: Physics
    max_num_seqs: int
    max_num_batched_tokens: int
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    prompt_tokens: float = 0.0  # counters for the stats line, reset by it
    generation_tokens: float = 0.0
    preemptions: int = 0  # vllm:num_preemptions_total; SGLang's retractions
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

    def context(self) -> float:
        """Return the tokens of KV the running requests hold."""
        return sum(s.computed for s in self.running)

    def kv_usage(self) -> float:
        """Return the KV-cache usage, 0-1: blocks held over the pool (vLLM's
        ``kv_cache_usage_perc``, SGLang's ``token_usage``); without a pool, the KV held over what
        the GPU leaves beside the weights."""
        phys = self.phys
        if phys.paged:
            return min(1.0, self._held_blocks() * phys.block_size / max(1, phys.kv_pool_tokens))
        room = phys.capacity_bytes - phys.weights_bytes - phys.non_torch_bytes
        return min(1.0, self.context() * phys.kv_bytes_per_token / max(1, room))

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
        return -(-int(tokens + 0.999) // size)

    # --- one step --------------------------------------------------------------------------

    def step(self, dt: float) -> StepResult:
        """Advance ``dt`` seconds of engine iterations: schedule, check memory, progress."""
        if self.dead:
            self.waiting.extend(self.running)
            self.running.clear()
            return StepResult([], None)
        decoding = sum(1 for s in self.running if not s.prefilling)
        room = max(0, self.max_num_batched_tokens - decoding)
        iterations, prefill_cap = self._iterations(dt, room)
        aborted: list[Sequence] = []
        if self.phys.kind == "sglang":
            aborted = self._schedule_sglang(iterations, prefill_cap)
        elif self.phys.paged:
            if not self._schedule_running(iterations, prefill_cap):
                self._admit(prefill_cap)
        else:
            while self.waiting and len(self.running) < self.max_num_seqs:
                self.running.append(self.waiting.popleft())
        chunks = self._prefill_chunks(prefill_cap)
        load = self._step_load(chunks, iterations, room)
        self.in_use_bytes = peak_bytes(self.phys, load)
        oom = check(self.phys, load)
        if oom is not None:
            return StepResult([], oom)
        result = self._progress(chunks, iterations)
        return StepResult(result.finished, None, result.first_tokens, aborted)

    def _iterations(self, dt: float, room: int) -> tuple[float, float]:
        """Return (engine iterations in ``dt``, prompt tokens they can prefill)."""
        phys = self.phys
        read = phys.weights_bytes + self.context() * phys.kv_bytes_per_token
        decode_s = (
            phys.iteration_overhead_s
            + phys.iteration_per_seq_s * len(self.running)
            + read / phys.hbm_bytes_per_s
        )
        demand = sum(s.target - s.computed for s in self.running)
        demand += sum(s.target for s in self.waiting)
        if demand <= 0 or room <= 0:
            return dt / decode_s, 0.0
        full = dt / (decode_s + room / phys.prefill_tokens_per_s)  # every iteration chunked full
        if full * room < demand:
            return full, full * room
        spare = dt - demand / phys.prefill_tokens_per_s
        return max(full, spare / decode_s), demand

    def _grow(self, seq: Sequence, iterations: float, budget: float) -> float:
        """Return the tokens ``seq`` adds this step: its prefill chunk or its decoded tokens."""
        if seq.prefilling:
            return min(budget, seq.target - seq.computed)
        return min(iterations, seq.output - seq.generated)

    def _schedule_running(self, iterations: float, prefill_cap: float) -> bool:
        """vLLM: give running requests the blocks of their new tokens, preempting the newest;
        return whether any request was preempted."""
        budget, preempted, k = prefill_cap, False, 0
        while k < len(self.running):
            seq = self.running[k]
            grow = self._grow(seq, iterations, budget)
            if seq.prefilling:
                budget -= grow
            need = self._blocks_for(seq.computed + grow) - seq.blocks
            while need > self.free_blocks:
                victim = self.running.pop()
                victim.blocks, victim.computed = 0, 0.0
                victim.preempted += 1
                self.preemptions += 1
                self.waiting.appendleft(victim)
                preempted = True
                if victim is seq:
                    return True
            seq.blocks += max(0, need)
            k += 1
        return preempted

    def _admit(self, prefill_cap: float) -> None:
        """vLLM: admit waiting requests in order while slots, budget and blocks last."""
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

    def _schedule_sglang(self, iterations: float, prefill_cap: float) -> list[Sequence]:
        """SGLang: retract while the step's tokens do not fit, then grow; admit by the reserve.

        Returns the request aborted when even the last one left does not fit.
        """
        budget, needs = prefill_cap, {}
        for seq in self.running:
            needs[id(seq)] = grow = self._grow(seq, iterations, budget)
            budget -= grow if seq.prefilling else 0.0
        retracted, aborted = 0, []
        while sum(self._sglang_need(s, needs) for s in self.running) > self.free_blocks:
            if len(self.running) == 1:
                aborted.append(self.running.pop())
                break
            victim = min(self.running, key=lambda s: (s.generated, -s.prompt))
            self.running.remove(victim)
            victim.blocks, victim.computed = 0, 0.0
            victim.preempted += 1
            self.waiting.append(victim)
            retracted += 1
        for seq in self.running:
            seq.blocks += self._blocks_for(seq.computed + needs[id(seq)]) - seq.blocks
        if retracted:
            self.preemptions += retracted
            old = self.new_token_ratio
            decoded = sum(s.generated for s in self.running)
            planned = sum(max(s.max_new, s.output) for s in self.running) + 1
            new = min(1.0, (decoded + SG_RETRACT_STEPS * len(self.running)) / planned)
            self.new_token_ratio = new
            self.retractions.append((retracted, old, new))
            return aborted
        self._admit_sglang(prefill_cap)
        decay = (SG_INIT_RATIO - SG_MIN_RATIO) / SG_DECAY_STEPS * iterations
        self.new_token_ratio = max(SG_MIN_RATIO, self.new_token_ratio - decay)
        return aborted

    def _sglang_need(self, seq: Sequence, needs: dict[int, float]) -> int:
        """Return the tokens ``seq`` needs beyond what it holds: this step's and 20 to come."""
        ahead = 0 if seq.prefilling else min(SG_RETRACT_STEPS, seq.output - seq.generated)
        return max(0, self._blocks_for(seq.computed + needs[id(seq)] + ahead) - seq.blocks)

    def _admit_sglang(self, prefill_cap: float) -> None:
        """SGLang: admit while prompt + ``max_new_tokens`` fit what the running leave."""
        reserved = sum(s.reserve() * self.new_token_ratio for s in self.running)
        left = self.free_blocks - reserved
        budget = prefill_cap - sum(s.target - s.computed for s in self.running if s.prefilling)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            cost = seq.target + seq.reserve()
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

    def _step_load(
        self, chunks: list[tuple[Sequence, float]], iterations: float, room: int
    ) -> StepLoad:
        """Return what one iteration of the step holds (``memory.StepLoad``).

        A ``prompt_logprobs`` request's chunk is what one iteration schedules for it: its
        remaining prompt up to the budget beside the decodes (vLLM schedules it at once).
        """
        rows = len(self.running)
        prefill = sum(t for _, t in chunks) / max(1.0, iterations)
        grown = iterations * (rows - len(chunks)) if not self.phys.paged else 0.0
        logprob_rows = [min(room, s.target - s.computed) for s, _ in chunks if s.prompt_logprobs]
        return StepLoad(
            batched=min(self.max_num_batched_tokens, rows - len(chunks) + max(prefill, 1.0)),
            rows=rows,
            context=self.context() + sum(t for _, t in chunks) + grown,
            prompt_logprobs_rows=max(logprob_rows, default=0.0),
            logprobs=any(s.logprobs for s in self.running),
        )

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
