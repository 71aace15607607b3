"""Crash look-alike recording: vLLM pods crash-loop on a CUDA illegal memory access.

``illegal-address``: two vLLM pods of ``llm/vllm-qwen`` die of ``CUDA error: an illegal
memory access was encountered`` and crash-loop (the third dies of it once, later), the ingress
answers 502 and, while one pod serves alone, 504; the GPU memory of every running pod sits at
96 %, vLLM's own pre-reservation at ``gpu_memory_utilization 0.9`` (its start-up lines say
so). No engine metrics are scraped. Taken as pressure, that VRAM opened an incident "memory
at the ceiling while 5xx rise" (issue 11).
The detector must record a "not this pattern" verdict naming the cause and the pods, and open
no incident. Line shapes: https://github.com/vllm-project/vllm/issues/24430 (V1 engine core)
and https://github.com/vllm-project/vllm/issues/6976 (the CUDA error and its hints).
"""

from __future__ import annotations

from detector.lab import recorder as r
from detector.lab import recorder_traffic as tr
from detector.lab import wordings as w
from detector.lab.recorder import Pod, Recorder
from detector.lab.recorder_traffic import Outcome

VLLM_IMAGE = "docker.io/vllm/vllm-openai:v0.10.1.1"
QWEN_UPSTREAM, QWEN_HOST = "llm-vllm-qwen-8000", "qwen.example.com"
ILLEGAL_END = 330.0
# deaths per pod (seconds); the kubelet's back-off doubles from 10 s between them
_FAULTS = ((100.0, 160.0, 250.0), (104.0, 170.0, 262.0), (240.0,))
RESERVED_MIB = 78_297.0  # 96 % of an H100's 81,559 MiB: 0.9 of it plus context and graphs
_ENGINE_FRAMES = """\
{d}/vllm/v1/engine/core.py|691|run_engine_core|engine_core.run_busy_loop()
{d}/vllm/v1/engine/core.py|718|run_busy_loop|self._process_engine_step()
{d}/vllm/v1/engine/core.py|743|_process_engine_step|outputs, model_executed = self.step_fn()
{d}/vllm/v1/engine/core.py|288|step|model_output = self.execute_model_with_error_logging(
{d}/vllm/v1/worker/gpu_model_runner.py|1589|execute_model|self._prepare_inputs(scheduler_output)
"""
_HINTS = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
)


def illegal_address(rec: Recorder, scale: int) -> None:
    """Two of three vLLM pods crash-loop on a CUDA illegal memory access while 5xx rise."""
    lb = tr.ingress(rec)
    ips = [f"10.0.{13 + i}.{51 + i}" for i in range(3)]
    pods = r.deployment(rec, "llm", "vllm-qwen", 3, "vllm", VLLM_IMAGE, 8000, ips)
    nodes = ("gpu-h100-node-06", "gpu-h100-node-07", "gpu-h100-node-08")
    r.place_gpus(rec, pods, nodes, 1, r.H100)
    for i, (pod, faults) in enumerate(zip(pods, _FAULTS, strict=True)):
        pod.ready_after_s, pod.starts, backoff = 45.0, [1.5 * i], 10.0
        for fault in faults:
            pod.deaths.append(fault)
            rec.restart(pod, fault + backoff)
            backoff *= 2
        _vllm_crash_life(rec, lb, pod)
    serve = _serve(rec, pods)
    for t in r.arrivals(rec.rng, 45.0, ILLEGAL_END, lambda _t: 2.0 * scale):
        lb.client(t, pods, QWEN_UPSTREAM, QWEN_HOST, "POST /v1/chat/completions", serve)
    for t in range(0, int(ILLEGAL_END), 15):
        for pod in pods:
            r.scrape_fb(rec, t, pod, _vram_mib(rec, pod, float(t)))
    tr.web_noise(rec, lb, ILLEGAL_END, scale, 0.03)
    tr.monitoring(rec, ILLEGAL_END)


def _vram_mib(rec: Recorder, pod: Pod, t: float) -> float:
    """Return the pod's framebuffer use: nothing while dead, the reservation once started."""
    dt = t - pod.starts[pod.run(t)] - 1.0
    if pod.dead_since(t) is not None or dt < 14.0:
        return 0.0
    if dt < 36.0:
        return r.interp([(14.0, 520.0), (22.4, 15868.0), (36.0, 16420.0)], dt)
    return RESERVED_MIB + rec.rng.uniform(-30.0, 30.0)


def _serve(rec: Recorder, pods: list[Pod]) -> tr.Serve:
    """Return a vLLM pod's handler: 200, or 504 while it serves alone (its queue times out)."""

    def serve(pod: Pod, t: float, request: str) -> Outcome:
        alone = sum(1 for p in pods if p.serving(t)) == 1
        if alone and rec.rng.random() < 0.5:
            return Outcome(504, 160, 60.0 + rec.rng.uniform(0.0, 0.01), tr.TIMED_OUT)
        out = Outcome(200, rec.rng.randrange(600, 6000), rec.rng.uniform(0.5, 8.0))
        client = f"{tr.INGRESS_IP}:{rec.rng.randrange(32768, 61000)}"
        method, path = request.split()
        rec.log(pod, t - out.seconds + 0.001, w.uvicorn_access(client, method, path, 200, w.API))
        return out

    return serve


def _vllm_crash_life(rec: Recorder, lb: tr.Ingress, pod: Pod) -> None:
    """Add one pod's runs: start-up, the illegal-address death, 502s, BackOff, restart."""
    for run, t0 in enumerate(pod.starts):
        r.started(rec, t0, pod, scheduled=run == 0)
        engine = f"(EngineCore_0 pid={rec.rng.randrange(140, 190)})"
        rec.lines(pod, t0 + 1.0, w.vllm_startup(rec.start + t0 + 1.0, engine))
        if run == len(pod.deaths):
            return
        d = pod.deaths[run]
        rec.lines(pod, d, illegal_address_death(rec.start + d, engine))
        lb.cut(d + 0.5, pod, QWEN_UPSTREAM, QWEN_HOST, "POST /v1/chat/completions", 3)
        r.back_off(rec, pod, d + 3.0, pod.starts[run + 1] - 1.0, 10.0)


def illegal_address_death(t: float, engine: str) -> list[w.Line]:
    """Return a vLLM V1 engine core's death by a CUDA illegal memory access, then shutdown."""
    err = w.vllm_prefix(t, "ERROR", "core.py:700", engine)
    error = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    core = [
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        *w.frames(_ENGINE_FRAMES),
        error,
        *_HINTS,
    ]
    out: list[w.Line] = [(0.001, "stdout", err + text) for text in core]
    api = w.vllm_prefix(t, "ERROR", "async_llm.py:416")
    out.append((0.004, "stdout", api + "AsyncLLM output_handler failed."))
    shutdown = ("Shutting down", "Application shutdown complete.", "Finished server process [1]")
    return out + [(0.9, "stdout", f"{w.API} INFO:     {msg}") for msg in shutdown]
