"""What the simulated endpoint shows, in the real wire formats of ``detector.lab``.

Container logs (vLLM start-up with this engine's arguments and KV-cache figures, its stats
line, the ``torch.OutOfMemoryError`` death, the illegal-address crash), Kubernetes events
(kubelet and scheduler), dcgm-exporter framebuffer samples and vLLM's Prometheus gauges, and
ingress-nginx access lines inside the controller pod's Fluent Bit envelope. The line shapes
and envelopes are ``detector.lab``'s (``wordings``, ``recorder``, ``recorder_traffic``,
``recording_crashes``); this module only fills them with the model's numbers.
"""

from __future__ import annotations

import re

from detector.lab import recorder as r
from detector.lab import recorder_traffic as tr
from detector.lab import recording_crashes as crashes
from detector.lab import wordings as w
from detector.lab.recorder import Pod, Recorder
from detector.sim import emit_sglang
from detector.sim.engine import Engine
from detector.sim.memory import GIB, Oom, Physics
from detector.sim.scenario import Scenario

MIB = 1024**2
REQUEST = "POST /v1/chat/completions"
_STARTUP_SPAN_S = 43.0  # the last start-up line's offset in wordings' vLLM start-up


def startup_lines(
    rec: Recorder,
    t0: float,
    engine_tag: str,
    args: dict[str, int],
    phys: Physics,
    load_s: float,
    scenario: Scenario,
) -> list[w.Line]:
    """Return the server's start-up lines at ``t0`` with this engine's args and KV-cache figures.

    vLLM: the template is ``wordings.vllm_startup`` (vLLM 0.10.1 on an H100); its ceilings,
    KV-cache size, blocks and concurrency are replaced by the model's, and its offsets stretched
    to end one second before Ready (``load_s`` after the container starts). A server without
    paged attention logs its model load and uvicorn's start-up.
    """
    scale = max(0.1, (load_s - 2.0) / _STARTUP_SPAN_S)
    if phys.kind == "sglang":
        fraction = scenario.engine.mem_fraction_static
        return emit_sglang.startup(rec, t0, args, phys, load_s, scenario.model.name, fraction)
    if not phys.paged:
        steps = [
            (0.0, "server.model", f"loading {scenario.model.name} on cuda:0 (bfloat16)"),
            (load_s - 2.0, "server.model", f"model ready; dynamic batching up to "
                                           f"{args['max-num-seqs']} requests"),
        ]  # fmt: skip
        return [(t0 + dt, stream, text) for dt, stream, text in _python_service(rec, t0, steps)]
    seqs, batched, length = (
        args["max-num-seqs"],
        args["max-num-batched-tokens"],
        args["max-model-len"],
    )
    tokens = phys.kv_pool_tokens
    subs = (
        (r"'max_model_len': \d+", f"'max_model_len': {length}"),
        (r"'max_num_seqs': \d+", f"'max_num_seqs': {seqs}"),
        (
            r"'gpu_memory_utilization': [\d.]+",
            f"'gpu_memory_utilization': {scenario.engine.gpu_memory_utilization}",
        ),
        (r"max model len \d+", f"max model len {length}"),
        (r"max_num_batched_tokens=\d+", f"max_num_batched_tokens={batched}"),
        (r"max_seq_len=\d+", f"max_seq_len={length}"),
        (
            r"Available KV cache memory: [\d.]+ GiB",
            f"Available KV cache memory: {phys.kv_pool_bytes / GIB:.2f} GiB",
        ),
        (r"GPU KV cache size: [\d,]+ tokens", f"GPU KV cache size: {tokens:,} tokens"),
        (
            r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x",
            f"Maximum concurrency for {length:,} tokens per request: {tokens / length:.2f}x",
        ),
        (r"num_gpu_blocks is: \d+", f"num_gpu_blocks is: {tokens // 16}"),
    )
    out: list[w.Line] = []
    for i, (dt, stream, text) in enumerate(w.vllm_startup(rec.start + t0, engine_tag)):
        for pattern, repl in subs:
            text = re.sub(pattern, repl, text)
        out.append((t0 + dt * scale + i * 5e-5, stream, text))  # 50 us apart, as Recorder.lines
    return out


def _python_service(rec: Recorder, t0: float, steps: list[tuple[float, str, str]]) -> list[w.Line]:
    """Return Python logging lines, then uvicorn's start-up (``wordings``' shape)."""
    out = [
        (dt, "stderr", w.pylog(rec.start + t0 + dt, "INFO", name, msg)) for dt, name, msg in steps
    ]
    last = steps[-1][0] + 0.3
    up = ("Started server process [1]", "Application startup complete.",
          "Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)")  # fmt: skip
    return out + [(last, "stderr", f"INFO:     {msg}") for msg in up]


def oom_death(
    rec: Recorder, pod: Pod, t: float, engine_tag: str, oom: Oom, kind: str, zombie: bool
) -> None:
    """Log the engine's death by CUDA OOM: the traceback and ``torch.OutOfMemoryError``.

    ``zombie``: only the engine core's lines; the API server neither notices nor shuts down
    (vllm#39863).
    """
    free = max(2 * MIB, oom.capacity - oom.in_use)
    tried = max(oom.tried, free + 2 * MIB)
    numbers = w.OomNumbers(float(tried), float(oom.capacity), float(free), 0.41 * GIB)
    if kind == "sglang":
        emit_sglang.oom_death(rec, pod, t, numbers)
        return
    if kind == "vllm":
        lines = w.vllm_oom_death(rec.start + t, engine_tag, numbers, [], _WHERE.get(oom.cause))
        rec.lines(pod, t, [line for line in lines if not zombie or w.API not in line[2]])
        return
    site = "/opt/conda/lib/python3.11/site-packages/transformers/generation/utils.py"
    table = (
        f"{site}|2215|generate|result = self._sample(\n"
        f"{site}|3206|_sample|outputs = self(**model_inputs, return_dict=True)"
    )
    texts = ["Traceback (most recent call last):", *w.frames(table), numbers.message()]
    rec.lines(pod, t, [(0.0, "stderr", text) for text in texts])


# The frames below ``execute_model`` where each unprofiled allocation fails, from vLLM 0.11.0's
# gpu_model_runner.py, sample/sampler.py and models/llama.py (the 0.10.1 image has the same path
# under other line numbers): https://github.com/vllm-project/vllm/tree/v0.11.0/vllm
_RUNNER = "{d}/vllm/v1/worker/gpu_model_runner.py"
_SAMPLER = "{d}/vllm/v1/sample/sampler.py"
_LOG_SOFTMAX = (
    f"{_SAMPLER}|199|compute_logprobs|return logits.log_softmax(dim=-1, dtype=torch.float32)"
)
_WHERE = {
    cause: "".join(row + "\n" for row in rows)
    for cause, rows in {
        "prompt_logprobs": (
            f"{_RUNNER}|2413|execute_model|) = self._bookkeeping_sync(scheduler_output, "
            "sampler_output,",
            f"{_RUNNER}|2131|_bookkeeping_sync|prompt_logprobs_dict = "
            "self._get_prompt_logprobs_dict(",
            f"{_RUNNER}|2793|_get_prompt_logprobs_dict|logprobs = "
            "self.sampler.compute_logprobs(logits)",
            _LOG_SOFTMAX,
        ),
        "sampler_logprobs": (
            f"{_RUNNER}|2367|execute_model|sampler_output = self._sample(logits, "
            "spec_decode_metadata)",
            f"{_RUNNER}|2061|_sample|sampler_output = self.sampler(",
            f"{_SAMPLER}|81|forward|raw_logprobs = self.compute_logprobs(logits)",
            _LOG_SOFTMAX,
        ),
        "long_context": (
            f"{_RUNNER}|2298|execute_model|model_output = self.model(",
            "{d}/vllm/model_executor/models/llama.py|597|forward|model_output = "
            "self.model(input_ids, positions, intermediate_tensors,",
        ),
    }.items()
}


def start_failed(rec: Recorder, pod: Pod, t: float, scenario: Scenario) -> None:
    """Log vLLM's start-up failure on a GPU the dead engine still holds (vllm#42017).

    ``gpu_worker.py``: "Free memory on device (X/Y GiB) on startup is less than desired GPU
    memory utilization (U, Z GiB). Decrease GPU memory utilization or reduce GPU memory used by
    other processes."
    """
    total, util = scenario.gpu.capacity_gib, scenario.engine.gpu_memory_utilization
    free = total * 0.12
    text = (
        f"ValueError: Free memory on device cuda:0 ({free:.2f}/{total:.2f} GiB) on startup is "
        f"less than desired GPU memory utilization ({util}, {total * util:.2f} GiB). Decrease "
        "GPU memory utilization or reduce GPU memory used by other processes."
    )
    rec.log(pod, t, w.vllm_prefix(rec.start + t, "ERROR", "core.py:700", "") + text)


def crash_death(rec: Recorder, pod: Pod, t: float, engine_tag: str) -> None:
    """Log the engine's death by a CUDA illegal memory access (``recording_crashes``)."""
    rec.lines(pod, t, crashes.illegal_address_death(rec.start + t, engine_tag))


def stats(rec: Recorder, pod: Pod, t: float, engine: Engine, window_s: float) -> None:
    """Log vLLM's periodic stats line; throughputs over ``window_s``, counters then reset."""
    line = w.vllm_stats(
        rec.start + t,
        engine.prompt_tokens / window_s,
        engine.generation_tokens / window_s,
        len(engine.running),
        len(engine.waiting),
        engine.kv_usage(),
        0.42,
    )
    engine.prompt_tokens = engine.generation_tokens = 0.0
    rec.log(pod, t, line)


def gauges(rec: Recorder, pod: Pod, t: float, engine: Engine, model: str) -> None:
    """Add one scrape of vLLM's ``/metrics`` gauges of a serving pod."""
    labels = {
        "model_name": model,
        "engine": "0",
        "namespace": pod.namespace,
        "pod": pod.name,
        "instance": pod.addr,
        "job": "vllm",
    }
    rec.sample(t, "vllm:kv_cache_usage_perc", engine.kv_usage(), labels)
    rec.sample(t, "vllm:num_requests_running", len(engine.running), labels)
    rec.sample(t, "vllm:num_requests_waiting", len(engine.waiting), labels)
    rec.sample(t, "vllm:num_preemptions_total", engine.preemptions, labels)


def framebuffer(rec: Recorder, pod: Pod, t: float, used_bytes: float) -> None:
    """Add dcgm-exporter's FB_USED and FB_FREE of the pod's GPU (``recorder.scrape_fb``)."""
    r.scrape_fb(rec, t, pod, used_bytes / MIB)


def probe_failed(rec: Recorder, pod: Pod, t: float) -> None:
    """Add the kubelet's readiness probe failure while the server is not listening yet."""
    msg = (
        f'Readiness probe failed: Get "http://{pod.addr}/health": dial tcp {pod.addr}: '
        "connect: connection refused"
    )
    rec.event(t, pod, "Unhealthy", msg, warning=True)


def probe_timed_out(rec: Recorder, pod: Pod, t: float, kind: str) -> None:
    """Add the kubelet's ``Readiness``/``Liveness probe failed`` of a ``/health`` too slow."""
    msg = (
        f'{kind} probe failed: Get "http://{pod.addr}/health": context deadline exceeded '
        "(Client.Timeout exceeded while awaiting headers)"
    )
    rec.event(t, pod, "Unhealthy", msg, warning=True)


def liveness_kill(rec: Recorder, pod: Pod, t: float) -> None:
    """Add the kubelet's Killing event of a container that failed its liveness probe."""
    msg = f"Container {pod.container} failed liveness probe, will be restarted"
    rec.event(t, pod, "Killing", msg)


def killing(rec: Recorder, pod: Pod, t: float) -> None:
    """Add the kubelet's Killing event of a deleted pod's container."""
    rec.event(t, pod, "Killing", f"Stopping container {pod.container}")


def access(
    lb: tr.Ingress,
    t: float,
    who: tuple[str, str],
    answer: tuple[int, float, str],
    tried: list[tuple[str, str]],
    upstream: str,
    host: str,
    *,
    length: int | None = None,
) -> None:
    """Log one ingress-nginx access line (and its error line for an upstream failure).

    ``length``: the request's ``$request_length`` in bytes (None: a typical one is drawn).
    ``answer``: (status, request seconds, nginx error text or ""); ``tried``: (pod address,
    upstream status) per upstream tried, empty when nginx answered itself (503 without
    endpoints, 429 from the rate limit).
    """
    status, seconds, error = answer
    body = _BODY.get(status, 150)
    if status == 200:
        body = lb.rec.rng.randrange(600, 6000)
    out = tr.Outcome(status, body, seconds, error)
    up = tr.upstream_fields(upstream, tried, out) if tried else w.Upstream(upstream)
    lb.who, lb.length = who, length
    lb.access(t, host, REQUEST, up, out)
    lb.who = lb.length = None


_BODY = {400: 220, 429: 166, 502: 150, 503: 190, 504: 160}
