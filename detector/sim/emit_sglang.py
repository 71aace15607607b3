"""What a simulated SGLang server shows: its start-up, stats, retraction and death lines.

Line shapes from SGLang's own logs as users posted them: ``server_args=ServerArgs(...)`` and
``max_total_num_tokens=N, chunked_prefill_size=N, max_prefill_tokens=N,
max_running_requests=N, context_len=N, available_gpu_mem=X GB``
(https://github.com/sgl-project/sglang/issues/29575); ``KV Cache is allocated. #tokens: N, K
size: X GB, V size: X GB``; ``Decode batch. #running-req: N, #token: N, token usage: X, gen
throughput (token/s): X, #queue-req: N`` (https://github.com/sgl-project/sglang/issues/1270);
``Decode out of memory happened. #retracted_reqs: N, #new_token_ratio: a -> b``
(https://github.com/sgl-project/sglang/issues/4184); a scheduler's death: ``Scheduler hit an
exception: Traceback ...`` then the launcher's ``Received sigquit from a child process. It
usually means the child failed.``. Metrics: ``sglang:token_usage``, ``sglang:num_running_reqs``,
``sglang:num_queue_reqs`` (https://docs.sglang.ai/references/production_metrics.html).
"""

from __future__ import annotations

from detector.lab import wordings as w
from detector.lab.recorder import Pod, Recorder
from detector.sim.engine import Engine
from detector.sim.memory import Physics

SITE = "/sgl-workspace/sglang/python/sglang/srt"


def prefix(rec: Recorder, t: float, tp: bool = True) -> str:
    """Return SGLang's logger prefix, ``[2025-03-14 09:00:05 TP0] `` (``TP0`` for workers)."""
    rank = " TP0" if tp else ""
    return f"[{w.utc(rec.start + t, '%Y-%m-%d %H:%M:%S')}{rank}] "


def startup(
    rec: Recorder,
    t0: float,
    args: dict[str, int],
    phys: Physics,
    load_s: float,
    model: str,
    fraction: float,
) -> list[w.Line]:
    """Return the server's start-up lines from ``t0``, ending a second before Ready."""
    gb = 1024**3  # SGLang prints GiB as "GB" (mem_cache/memory_pool.py: GB = 1024 * 1024 * 1024)
    total = phys.capacity_bytes / gb
    after_weights = total - phys.weights_bytes / gb - phys.non_torch_bytes / gb
    kv_each = phys.kv_pool_bytes / 2 / gb
    weights = phys.weights_bytes / gb
    rest = phys.capacity_bytes / gb - phys.weights_bytes / gb - phys.kv_pool_bytes / gb
    seqs, chunk, length = (
        args["max-num-seqs"],
        args["max-num-batched-tokens"],
        args["max-model-len"],
    )
    server_args = (
        f"server_args=ServerArgs(model_path='{model}', tokenizer_path='{model}', "
        f"dtype='auto', context_length={length}, mem_fraction_static={fraction}, "
        f"max_running_requests={seqs}, chunked_prefill_size={chunk}, host='0.0.0.0', port=8000)"
    )
    steps = [
        (0.0, False, server_args),
        (2.0, True, f"Load weight begin. avail mem={total - 0.6:.2f} GB"),
        (load_s * 0.6, True, "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
                             f"avail mem={after_weights:.2f} GB, mem usage={weights:.2f} GB."),
        (load_s * 0.6 + 0.5, True, f"KV Cache is allocated. #tokens: {phys.kv_pool_tokens}, "
                                   f"K size: {kv_each:.2f} GB, V size: {kv_each:.2f} GB"),
        (load_s - 4.0, True, f"max_total_num_tokens={phys.kv_pool_tokens}, chunked_prefill_size="
                             f"{chunk}, max_prefill_tokens=16384, max_running_requests={seqs}, "
                             f"context_len={length}, available_gpu_mem={rest:.2f} GB"),
        (load_s - 1.5, False, "The server is fired up and ready to roll!"),
    ]  # fmt: skip
    return [(t0 + dt, "stdout", prefix(rec, t0 + dt, tp) + text) for dt, tp, text in steps]


def stats(rec: Recorder, pod: Pod, t: float, engine: Engine, window_s: float) -> None:
    """Log the ``Decode batch.`` line; throughput over ``window_s``, counters then reset."""
    tokens = int(sum(s.computed for s in engine.running))
    text = (
        f"Decode batch. #running-req: {len(engine.running)}, #token: {tokens}, token usage: "
        f"{engine.kv_usage():.2f}, gen throughput (token/s): "
        f"{engine.generation_tokens / window_s:.2f}, #queue-req: {len(engine.waiting)}"
    )
    engine.prompt_tokens = engine.generation_tokens = 0.0
    rec.log(pod, t, prefix(rec, t) + text)


def gauges(rec: Recorder, pod: Pod, t: float, engine: Engine, model: str) -> None:
    """Add one scrape of SGLang's ``/metrics`` of a serving pod."""
    labels = {
        "model_name": model,
        "engine_type": "unified",
        "tp_rank": "0",
        "namespace": pod.namespace,
        "pod": pod.name,
        "instance": pod.addr,
        "job": "sglang",
    }
    rec.sample(t, "sglang:token_usage", engine.kv_usage(), labels)
    rec.sample(t, "sglang:num_running_reqs", len(engine.running), labels)
    rec.sample(t, "sglang:num_queue_reqs", len(engine.waiting), labels)


def retractions(rec: Recorder, pod: Pod, t: float, engine: Engine) -> None:
    """Log the step's retractions and clear them."""
    for n, old, new in engine.retractions:
        text = (
            f"Decode out of memory happened. #retracted_reqs: {n}, "
            f"#new_token_ratio: {old:.4f} -> {new:.4f}"
        )
        rec.log(pod, t, prefix(rec, t) + text)
    engine.retractions.clear()


def oom_death(rec: Recorder, pod: Pod, t: float, numbers: w.OomNumbers) -> None:
    """Log a scheduler's death by CUDA OOM and the launcher's sigquit."""
    table = "\n".join(
        f"{SITE}/{row}"
        for row in (
            "managers/scheduler.py|2214|run_scheduler_process|scheduler.event_loop_overlap()",
            "managers/scheduler.py|658|event_loop_overlap|batch_result = self.run_batch(batch)",
            "model_executor/model_runner.py|1044|forward|return self.forward_extend(",
        )
    )
    head = prefix(rec, t)
    lines = [
        (0.0, "stdout", head + "Scheduler hit an exception: Traceback (most recent call last):"),
        *[(0.001, "stdout", text) for text in w.frames(table)],
        (0.001, "stdout", numbers.message()),
        (0.05, "stdout", prefix(rec, t + 0.05, tp=False)
         + "Received sigquit from a child process. It usually means the child failed."),
    ]  # fmt: skip
    rec.lines(pod, t, lines)
