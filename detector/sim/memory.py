"""One engine's GPU memory: what it reserves at start and the allocations that can fail.

**vLLM V1** (``vllm/v1/worker/gpu_worker.py``, ``gpu_model_runner.py``, v0.11.0 - the logic is
the same in the v0.10.1 image the pods run,
https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/v1/worker/gpu_worker.py): requested =
total x ``gpu_memory_utilization``; ``profile_run`` runs ``max_num_batched_tokens`` tokens,
then the sampler (top-p/top-k, ``max_num_logprobs=None``) on ``min(max_num_seqs,
max_num_batched_tokens)`` rows; the KV pool ("Available KV cache memory") is requested -
weights - non-torch - the larger of the two peaks; the peak is freed again (``empty_cache``)
and CUDA graphs are captured after the pool is sized. At run time the memory beside the pool
is therefore ``total x (1 - utilization) + profiled peak - CUDA graphs - co-tenants``, and
the step's own activations and logits come out of it. What the profile never ran comes out of
it too, and an OOM is when it does not fit:

- during the forward pass: an activation peak that grows with the context the batch holds
  (vllm#13100 at utilization 0.99, #13582 at 0.97: crashes with concurrent long-context
  requests, none with one; neither report names the buffer, so ``long_context_bytes_per_token``
  is a stand-in: see ``EngineSpec``);
- after it: a ``prompt_logprobs`` request's ``[scheduled tokens, vocab]`` bf16 logits and their
  fp32 ``log_softmax`` (``_get_prompt_logprobs_dict``; vllm#5907; PR #52054: "~7.5 GiB" at 8192
  tokens and a 152k vocabulary), or the sampler's fp32 ``log_softmax`` over every running row
  once any running request asks for ``logprobs`` (``Sampler.compute_logprobs`` on the whole
  batch; its logits are in the profile). They are live at different moments: the larger counts.

**SGLang** (``model_executor/model_runner.py``, https://github.com/sgl-project/sglang): the
token pool is total x ``mem_fraction_static`` - weights - non-torch; nothing is profiled, so
activations, logits, CUDA graphs and the extras above all live in ``total x (1 -
mem_fraction_static)``.

**Without paged attention**: nothing is reserved; weights, the KV of every token each running
request has, the step's activations and logits must fit the GPU.

This module imports nothing of the product: its memory is the engines', not the detector's.
"""

from __future__ import annotations

from dataclasses import dataclass

from detector.sim.scenario import Scenario

GIB = 1024**3
FP32 = 4
SAMPLER_PROFILE_BYTES_PER_ENTRY = 10  # bf16 logits, fp32 copy and probs, top-p sort (>= 10 B)


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
    beside_pool_bytes: int  # what is left beside the pool at run time (module docstring)
    vocab: int
    activation_bytes_per_token: int
    prompt_logprobs_bytes_per_entry: int
    sampler_logprobs_bytes_per_entry: int
    long_context_bytes_per_token: float
    iteration_overhead_s: float
    iteration_per_seq_s: float
    hbm_bytes_per_s: float
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
    """Return an engine's constants for its args (``max-num-batched-tokens``, ``max-num-seqs``)."""
    model, gpu, engine = scenario.model, scenario.gpu, scenario.engine
    kvb = kv_bytes_per_token(model.layers, model.kv_heads, model.head_dim, model.dtype_bytes)
    capacity = round(gpu.capacity_gib * GIB)
    weights = round(model.weights_gib * GIB)
    non_torch = round(engine.non_torch_gib * GIB)
    batched, seqs = args["max-num-batched-tokens"], args["max-num-seqs"]
    forward = engine.activation_bytes_per_token * batched
    sampler = min(seqs, batched) * model.vocab * SAMPLER_PROFILE_BYTES_PER_ENTRY
    peak = max(forward, sampler)
    fraction = engine.gpu_memory_utilization
    if engine.kind == "sglang":  # nothing profiled
        fraction, peak = engine.mem_fraction_static, 0
    requested = capacity * fraction
    block = 1 if engine.kind == "sglang" else engine.block_size  # SGLang's page size is 1
    pool_tokens = max(0, int(requested - weights - non_torch - peak)) // kvb // block * block
    graphs = (engine.cuda_graph_gib + engine.co_tenant_gib) * GIB
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
        beside_pool_bytes=int(capacity - requested + peak - graphs),
        vocab=model.vocab,
        activation_bytes_per_token=engine.activation_bytes_per_token,
        prompt_logprobs_bytes_per_entry=engine.prompt_logprobs_bytes_per_entry,
        sampler_logprobs_bytes_per_entry=engine.sampler_logprobs_bytes_per_entry,
        long_context_bytes_per_token=engine.long_context_bytes_per_token,
        iteration_overhead_s=engine.iteration_overhead_s,
        iteration_per_seq_s=engine.iteration_per_seq_s,
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        prefill_tokens_per_s=engine.prefill_tokens_per_s,
    )


@dataclass(frozen=True, slots=True)
class Oom:
    """A failed allocation: the bytes tried, the bytes in use, the capacity, and what it was."""

    tried: int
    in_use: int
    capacity: int
    cause: str  # "prompt_logprobs" | "sampler_logprobs" | "long_context" | "kv_cache"


@dataclass(frozen=True, slots=True)
class StepLoad:
    """What one engine iteration of the step holds, for its memory (counts and tokens).

    ``batched``: tokens in the iteration; ``rows``: running requests (logits rows);
    ``context``: tokens of KV the running requests hold; ``prompt_logprobs_rows``: the largest
    chunk of a ``prompt_logprobs`` request in one iteration; ``logprobs``: a running request
    asks for sampled logprobs.
    """

    batched: float
    rows: int
    context: float
    prompt_logprobs_rows: float
    logprobs: bool


def peak_bytes(phys: Physics, load: StepLoad) -> int:
    """Return the bytes in use at the step's peak, at most the capacity (nvidia-smi's view)."""
    if not phys.paged:
        return int(min(phys.capacity_bytes, _unpaged_bytes(phys, load)))
    need = max(n for _, n, _ in _transients(phys, load))
    return int(min(phys.capacity_bytes, phys.capacity_bytes - phys.beside_pool_bytes + need))


def check(phys: Physics, load: StepLoad) -> Oom | None:
    """Return the step's failed allocation (module docstring), or None when it fits."""
    cap = phys.capacity_bytes
    if not phys.paged:
        used = _unpaged_bytes(phys, load)
        held = phys.weights_bytes + phys.non_torch_bytes
        return Oom(int(used - held), held, cap, "kv_cache") if used > cap else None
    cause, need, tried = max(_transients(phys, load), key=lambda t: t[1])
    if need <= phys.beside_pool_bytes:
        return None
    return Oom(int(tried), int(cap - phys.beside_pool_bytes + need - tried), cap, cause)


def _unpaged_bytes(phys: Physics, load: StepLoad) -> float:
    """Return weights + non-torch + the KV held + the step's activations and logits."""
    kv = load.context * phys.kv_bytes_per_token
    act = phys.activation_bytes_per_token * load.batched
    return phys.weights_bytes + phys.non_torch_bytes + kv + act + load.rows * phys.vocab * FP32


def _transients(phys: Physics, load: StepLoad) -> list[tuple[str, float, float]]:
    """Return (cause, bytes needed beside the pool at that moment, bytes of the extra) for the
    forward pass and for the logprobs after it (module docstring)."""
    act = phys.activation_bytes_per_token * load.batched
    logits = load.rows * phys.vocab * FP32
    during = load.context * phys.long_context_bytes_per_token
    prompt = load.prompt_logprobs_rows * phys.vocab * phys.prompt_logprobs_bytes_per_entry
    sampled = load.rows * phys.vocab * phys.sampler_logprobs_bytes_per_entry * load.logprobs
    after, cause = (
        (prompt, "prompt_logprobs") if prompt >= sampled else (sampled, "sampler_logprobs")
    )
    return [("long_context", act + during, during), (cause, logits + after, after)]
