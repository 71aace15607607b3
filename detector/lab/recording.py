"""Write recorded streams in their real wire formats: the cascade and two look-alikes.

``python -m detector.lab.recording --out examples`` regenerates ``examples/``. The output is a
pure function of (scenario, seed, scale, start): one ``random.Random`` seeded with the scenario
and the seed, no clock, no I/O besides the files written. Scenarios (see ``examples/README.md``):

- ``cascade``: four vLLM pods of ``llm/vllm-llama`` die of CUDA OOM one after another;
- ``host-oom``: ``batch/embedder`` pods crash-loop OOMKilled (host RAM, exit 137): a look-alike;
- ``upstream-5xx``: ``shop/reranker`` answers 502/503/504 while its database is away.

``EXTRA_SCENARIOS`` are written on request only (``--scenario``), not into ``examples/``:

- ``illegal-address``: ``llm/vllm-qwen`` pods crash-loop on a CUDA illegal memory access with
  VRAM at vLLM's own reservation: a look-alike (``recording_crashes``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from detector.lab import recorder as r
from detector.lab import recorder_traffic as tr
from detector.lab import recording_crashes as crashes
from detector.lab import recording_lookalikes as lookalikes
from detector.lab import wordings as w
from detector.lab.recorder import Pod, Recorder
from detector.lab.recorder_traffic import Ingress, Outcome

START = 1741942800.0  # 2025-03-14T09:00:00Z
SCENARIOS = ("cascade", "host-oom", "upstream-5xx")
EXTRA_SCENARIOS = ("illegal-address",)  # not in examples/: written with --scenario only

VLLM_IMAGE = "docker.io/vllm/vllm-openai:v0.10.1.1"
LLM_UPSTREAM, LLM_HOST = "llm-vllm-llama-8000", "llm.example.com"
CASCADE_END = 540.0
BURST = (180.0, 360.0)
DEATHS = (217.0, 246.0, 292.0, 323.0)  # each 3-8 s after a 15 s scrape, 29-46 s apart
RESTARTS = (345.0, 355.0, 365.0, 375.0)
_OOM_GIB = ((2.00, 1.064, 1.93), (1.50, 0.81, 1.41), (2.00, 1.19, 2.07), (1.25, 0.94, 1.12))


def write_recording(
    scenario: str, outdir: Path, *, seed: int = 7, scale: int = 1, start: float = START
) -> list[Path]:
    """Write the recording of ``scenario`` into ``outdir`` and return the files written.

    ``scale`` multiplies the healthy noise (requests per second, other workloads); ``start``
    is the epoch second of offset 0. Raises ``ValueError`` for an unknown scenario or a scale
    under 1.
    """
    builders: dict[str, Callable[[Recorder, int], None]] = {
        "cascade": _cascade,
        "host-oom": lookalikes.host_oom,
        "upstream-5xx": lookalikes.upstream_5xx,
        "illegal-address": crashes.illegal_address,
    }
    if scenario not in builders:
        known = ", ".join(SCENARIOS + EXTRA_SCENARIOS)
        raise ValueError(f"unknown scenario {scenario!r}; one of {known}")
    if scale < 1:
        raise ValueError(f"scale must be >= 1, not {scale}")
    rec = Recorder(f"{scenario}/{seed}", start)
    builders[scenario](rec, scale)
    return rec.write(outdir)


# --- cascade ---------------------------------------------------------------------------------


def _cascade(rec: Recorder, scale: int) -> None:
    """Four vLLM pods die of CUDA OOM 29-46 s apart under a burst, then restart and recover."""
    lb = tr.ingress(rec)
    ips = [f"10.0.{1 + i // 2}.{21 + 6 * i}" for i in range(4)]
    pods = r.deployment(rec, "llm", "vllm-llama", 4, "vllm", VLLM_IMAGE, 8000, ips)
    r.place_gpus(rec, pods, ("gpu-h100-node-01", "gpu-h100-node-02"), 2, r.H100)
    knots = [_kv_knots(i) for i in range(4)]

    def kv(pod: Pod, t: float) -> float:
        i = pods.index(pod)
        base = 0.16 + 0.03 * i
        return r.interp(knots[i], t) if pod.run(t) == 0 and t >= BURST[0] else base

    for i, pod in enumerate(pods):
        pod.ready_after_s, pod.starts, pod.deaths = 45.0, [1.5 * i], [DEATHS[i]]
        rec.restart(pod, RESTARTS[i])
        _vllm_life(rec, lb, pod, i, kv, scale)
    serve = _vllm_serve(rec, kv)
    for t in r.arrivals(rec.rng, 45.0, CASCADE_END, lambda t: _llm_rate(t) * scale):
        request = "POST /v1/chat/completions" if rec.rng.random() < 0.95 else "GET /v1/models"
        lb.client(t, pods, LLM_UPSTREAM, LLM_HOST, request, serve)
    for t in range(0, int(CASCADE_END), 15):
        for pod in pods:
            _vllm_scrape(rec, float(t), pod, kv(pod, float(t)))
    tr.web_noise(rec, lb, CASCADE_END, scale, 0.06)
    tr.monitoring(rec, CASCADE_END)


def _llm_rate(t: float) -> float:
    """Return requests per second to the vLLM upstream at ``t`` (scale 1): 3x in the burst."""
    return 3.0 if BURST[0] <= t < BURST[1] else 1.0


def _kv_knots(i: int) -> list[tuple[float, float]]:
    """Return KV-cache usage knots of pod ``i``'s first run: the burst, then the survivors."""
    base, first = 0.16 + 0.03 * i, DEATHS[0]
    if i == 0:
        return [(BURST[0], base), (first - 10.0, 0.995)]
    return [(BURST[0], base), (first, 0.75), (first + 12.0, 0.9), (DEATHS[i] - 10.0, 0.995)]


def _running(kv: float) -> int:
    """Return the running batch that goes with a KV-cache usage (about 40 at the ceiling)."""
    return 2 + int(kv * 40)


def _waiting(kv: float) -> int:
    """Return the queue depth that goes with a KV-cache usage (requests wait past 70 %)."""
    return max(0, int((kv - 0.7) / 0.3 * 160))


def _vllm_serve(rec: Recorder, kv: Callable[[Pod, float], float]) -> tr.Serve:
    """Return a vLLM pod's handler: 200 (or 499), 504 when its queue is long, plus its line."""

    def serve(pod: Pod, t: float, request: str) -> Outcome:
        queue = _waiting(kv(pod, t) + rec.rng.uniform(-0.02, 0.02))
        if rec.rng.random() < queue / 250:
            return Outcome(504, 160, 60.0 + rec.rng.uniform(0.0, 0.01), tr.TIMED_OUT)
        if request.startswith("GET"):
            out = Outcome(200, 452, 0.002)
        elif rec.rng.random() < 0.02:
            return Outcome(499, 0, rec.rng.uniform(1.0, 20.0))
        else:
            seconds = 0.4 + rec.rng.expovariate(1 / 3.0) + queue * 0.2
            out = Outcome(200, rec.rng.randrange(600, 6000), min(seconds, 59.0))
        method, path = request.split()
        client = f"{tr.INGRESS_IP}:{rec.rng.randrange(32768, 61000)}"
        rec.log(pod, t - out.seconds + 0.001, w.uvicorn_access(client, method, path, 200, w.API))
        return out

    return serve


def _vllm_life(
    rec: Recorder, lb: Ingress, pod: Pod, i: int, kv: Callable[[Pod, float], float], scale: int
) -> None:
    """Add one vLLM pod's life: start, stats, OOM death, BackOff, restart, stats again."""
    for run, t0 in enumerate(pod.starts):
        r.started(rec, t0, pod, scheduled=run == 0)
        engine = f"(EngineCore_0 pid={rec.rng.randrange(140, 190)})"
        rec.lines(pod, t0 + 1.0, w.vllm_startup(rec.start + t0 + 1.0, engine))
        t = t0 + 52.0 + 2.3 * i
        while t < (pod.deaths[run] if run < len(pod.deaths) else CASCADE_END):
            _vllm_stats(rec, pod, t, kv(pod, t))
            t += 10.0
        if run < len(pod.deaths):
            _vllm_death(rec, lb, pod, i, engine, scale)


def _vllm_stats(rec: Recorder, pod: Pod, t: float, kv: float) -> None:
    """Add one periodic stats line of a vLLM pod."""
    kv = min(0.999, max(0.0, kv + rec.rng.uniform(-0.015, 0.015)))
    running = _running(kv)
    prompt = (1800.0 + 14000.0 * kv) * rec.rng.uniform(0.85, 1.15)
    gen = (260.0 + 520.0 * kv) * rec.rng.uniform(0.85, 1.15)
    line = w.vllm_stats(
        rec.start + t, prompt, gen, running, _waiting(kv), kv, rec.rng.uniform(0.35, 0.55)
    )
    rec.log(pod, t, line)


def _vllm_death(rec: Recorder, lb: Ingress, pod: Pod, i: int, engine: str, scale: int) -> None:
    """Add pod ``i``'s death by CUDA OOM: probe timeout, traceback, 500s and 502s, BackOff."""
    d = pod.deaths[0]
    probe = (
        f'Readiness probe failed: Get "http://{pod.addr}/health": context deadline '
        "exceeded (Client.Timeout exceeded while awaiting headers)"
    )
    rec.event(d - 6.0, pod, "Unhealthy", probe, warning=True)
    tried, free, reserved = _OOM_GIB[i]
    oom = w.OomNumbers(tried * w.GIB, 79.186 * w.GIB, free * w.GIB, reserved * w.GIB)
    clients = [f"{tr.INGRESS_IP}:{rec.rng.randrange(32768, 61000)}" for _ in range(3)]
    rec.lines(pod, d, w.vllm_oom_death(rec.start + d, engine, oom, clients))
    for k in range(len(clients)):
        out = Outcome(500, 0, rec.rng.uniform(1.0, 9.0))
        fields = tr.upstream_fields(LLM_UPSTREAM, [(pod.addr, "500")], out)
        lb.access(d + 0.011 + k * 1e-3, LLM_HOST, "POST /v1/chat/completions", fields, out)
    lb.cut(d + 0.9, pod, LLM_UPSTREAM, LLM_HOST, "POST /v1/chat/completions", 4 * scale)
    r.back_off(rec, pod, d + 3.0, pod.starts[1] - 1.0, 15.0)


def _vllm_scrape(rec: Recorder, t: float, pod: Pod, kv: float) -> None:
    """Add one scrape: FB used/free of the pod's GPU and, while the server is up, vLLM gauges."""
    dt = t - pod.starts[pod.run(t)] - 1.0  # seconds since the server process started
    dead = pod.dead_since(t) is not None
    if dead or dt < 14.0:
        used = 0.0
    elif dt < 36.0:
        used = r.interp([(14.0, 520.0), (17.0, 520.0), (22.4, 15868.0), (36.0, 16420.0)], dt)
    else:
        used = 73120.0 + max(0.0, kv - 0.9) / 0.095 * 6900.0 + rec.rng.uniform(-40.0, 40.0)
    r.scrape_fb(rec, t, pod, used)
    if dead or dt < 43.0 or t % 30:  # the vLLM job scrapes every 30 s
        return
    kv = min(1.0, max(0.0, kv + rec.rng.uniform(-0.01, 0.01)))
    labels = {
        "model_name": w.MODEL,
        "engine": "0",
        "namespace": pod.namespace,
        "pod": pod.name,
        "instance": pod.addr,
        "job": "vllm",
    }
    rec.sample(t, "vllm:kv_cache_usage_perc", kv, labels)
    rec.sample(t, "vllm:num_requests_running", _running(kv), labels)
    rec.sample(t, "vllm:num_requests_waiting", _waiting(kv), labels)


# --- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Write the recordings named on the command line (all by default) under ``--out``."""
    parser = argparse.ArgumentParser(
        prog="python -m detector.lab.recording",
        description="Write recorded streams in real wire formats.",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder; writes OUT/<scenario>/")
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS + EXTRA_SCENARIOS,
        action="append",
        help=f"default: {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scale", type=int, default=1, help="healthy noise multiplier")
    parser.add_argument("--start", type=float, default=START, help="epoch seconds of offset 0")
    args = parser.parse_args(argv)
    for scenario in args.scenario or SCENARIOS:
        paths = write_recording(
            scenario, args.out / scenario, seed=args.seed, scale=args.scale, start=args.start
        )
        for path in paths:
            with path.open("rb") as fh:
                print(f"{path}: {sum(1 for _ in fh)} records")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
