"""Measure the resident size of ``detector run`` through a one-million-record log storm.

Run: ``.venv/bin/python bench/bench_storm.py [--records 1000000] [--json PATH]``. Not a test:
it prints numbers and asserts nothing (the target: memory bounded by the workloads and the
window, not by the event volume; bench/README.md explains the output); ``--json`` also writes
the printed figures as one JSON object. It starts its own memory-only Tansu broker
(``detector.lab.broker``) and always kills it at the end.

The storm, written into a temporary folder: the bundled cascade (scale 1), placed at a fifth
of the storm's event time, inside healthy and noisy traffic of 32 workloads and 272 pods over
an hour and more of event time (about 170 records per second of event time, so the
correlator's windows turn over many times). It is merged by event time and produced keyed by
workload (``detector.stream.app.keyed_records``, as ``detector produce`` does) to one topic
of one partition. Phases, each in its own process:
- baseline: ``bench_kafka``'s bare kafka-python ``poll()`` loop over the topic;
- product:  the real ``detector run`` (``python -m detector run``, SQLite in the temporary
            folder) as a child, its VmRSS sampled every 0.5 s against its committed offset;
- replay:   ``detector.pipeline.replay`` over the same files, with no Kafka (a cross-check).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import bench_kafka  # noqa: E402
from phases import (  # noqa: E402
    count_records,
    phase_figures,
    prepared_phases,
    print_rss_profile,
    print_table,
    rss_figures,
    tansu_folder,
    vm_mib,
    write_json,
)

from detector.lab import recorder as r  # noqa: E402
from detector.lab import recorder_traffic as tr  # noqa: E402
from detector.lab import wordings as w  # noqa: E402
from detector.lab.recorder import Pod, Recorder  # noqa: E402
from detector.lab.recording import (  # noqa: E402
    START,
    VLLM_IMAGE,
    _vllm_scrape,
    _vllm_serve,
    _vllm_stats,
    write_recording,
)

PHASES = ("baseline", "product", "replay")
QUANTILES = (0.1, 0.5, 0.9, 1.0)
SCRIPT = str(Path(__file__).resolve())
SAMPLE_S = 0.5  # RSS sampling period of the detector child
CHUNK_S = 300.0  # event seconds generated at a time (the generator's memory stays small)
CASCADE_AT = 0.2  # where the cascade starts, as a share of the storm's event time
MODELS = ("llama-8b", "qwen-7b", "mistral-7b", "gemma-9b", "phi-4", "qwen-14b", "llama-70b", "r1")
APPS = ("checkout", "catalog", "search", "cart", "accounts", "payments", "reviews", "shipping")
GPU_PODS, WEB_PODS, WORKER_PODS = 4, 10, 10
LLM_RATE_PER_S, WEB_RATE_PER_S = 2.0, 3.0  # requests per second per workload
CHATTER_PER_S, PROBE_FAIL_PER_S = 0.4, 1 / 1800  # per worker pod; per web or worker pod
FLAKY = 0.02  # share of web requests answered 503: noise well under the 5xx thresholds
CHATTER = (
    ("INFO", "worker.jobs", "processed batch of {n} items in {ms} ms"),
    ("INFO", "worker.cache", "refreshed {n} keys from the catalog"),
    ("WARNING", "urllib3.connectionpool", "Retrying (Retry(total=2)) after connection broken "
     "by 'ReadTimeoutError(\"read timed out\")': /v1/items?page={n}"),
    ("ERROR", "worker.jobs", "job {n} failed: upstream answered 429 Too Many Requests, retrying "
     "in {ms} ms"),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Start the broker, write and produce the storm, run each phase, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the storm")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--phase", choices=(*PHASES, "prepare"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:  # child process: one phase, one JSON line
        measured = _run_phase(args)
        measured.setdefault("peak_rss_mib", vm_mib("VmHWM"))
        print(json.dumps(measured))
        return 0
    from detector.errors import StreamError

    started = time.perf_counter()
    try:
        with tansu_folder("bench-storm-", bench_kafka.START_TIMEOUT_S) as (bootstrap, folder):
            common = ["--bootstrap", bootstrap, "--topic", f"storm-{uuid.uuid4().hex[:8]}"]
            extra = ["--records", str(args.records), "--seed", str(args.seed)]
            results = prepared_phases(SCRIPT, folder, common, extra, PHASES)
    except StreamError as exc:
        print(exc)
        return 1
    if results is None:
        return 1
    print_table(results, unit="record")
    print()
    print_rss_profile(results, QUANTILES)
    whole_s = time.perf_counter() - started
    print(f"whole run {whole_s:.0f} s")
    throughput, rss = phase_figures(results), rss_figures(results, QUANTILES)
    phases = {name: {**throughput[name], **rss[name]} for name in results}
    for name, got in results.items():  # the product's sampling: how many, from which share on
        phases[name] |= {k: got[k] for k in ("samples", "first_share") if k in got}
    figures = {"bench": "storm", "records_asked": args.records, "seed": args.seed}
    write_json(
        args.json, {**figures, "shares": list(QUANTILES), "phases": phases, "whole_s": whole_s}
    )
    return 0


def _run_phase(args: argparse.Namespace) -> dict[str, Any]:
    if args.phase == "prepare":
        return _prepare(args.dir, args.bootstrap, args.topic, args.records, args.seed)
    if args.phase == "baseline":
        return bench_kafka._baseline(args.dir, args.bootstrap, args.topic)
    if args.phase == "product":
        return _product(args.dir, args.bootstrap, args.topic)
    return _replay(args.dir)


# --- the storm -------------------------------------------------------------------------------


class Storm:
    """Healthy and noisy workloads behind one ingress: vLLM with GPUs, nginx, Python workers."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.lb = tr.ingress(rec)
        self.llm: list[tuple[str, str, list[Pod]]] = []
        self.web: list[tuple[str, str, list[Pod]]] = []
        self.workers: list[Pod] = []
        nodes = [f"gpu-h100-node-{10 + i:02d}" for i in range(len(MODELS) * GPU_PODS // 2)]
        for k, model in enumerate(MODELS):
            ips = [f"10.1.{k}.{10 + i}" for i in range(GPU_PODS)]
            pods = r.deployment(rec, "inference", f"vllm-{model}", GPU_PODS, "vllm",
                                VLLM_IMAGE, 8000, ips)  # fmt: skip
            r.place_gpus(rec, pods, nodes[k * GPU_PODS // 2 :], 2, r.H100)
            self.llm.append((f"inference-vllm-{model}-8000", f"{model}.llm.example.com", pods))
        for k, app in enumerate(APPS * 3):
            ns, tier = ("shop", "web") if k < 2 * len(APPS) else ("jobs", "worker")
            name = f"{app}-{tier}" if k < len(APPS) or tier == "worker" else f"{app}-api"
            n = WEB_PODS if tier == "web" else WORKER_PODS
            image = "docker.io/library/nginx:1.27.4" if tier == "web" else "ghcr.io/shop/worker:2.3"
            ips = [f"10.2.{k}.{10 + i}" for i in range(n)]
            pods = r.deployment(rec, ns, name, n, tier, image, 80, ips)
            if tier == "web":
                self.web.append((f"{ns}-{name}-80", f"{name}.example.com", pods))
            else:
                self.workers += pods
        for i, pod in enumerate(self.pods()):
            pod.starts = [-3600.0]  # up for an hour before the storm
            pod.node = pod.node or f"cpu-node-{1 + i % 12:02d}"
        self.phase = {pod.name: rec.rng.uniform(0, 2 * math.pi) for pod in self.pods()}
        self.serve_llm = _vllm_serve(rec, self.kv)
        self.serve_web = tr._web_serve(rec)

    def pods(self) -> Iterator[Pod]:
        """Yield every pod of the storm's workloads."""
        for _, _, pods in self.llm + self.web:
            yield from pods
        yield from self.workers

    def kv(self, pod: Pod, t: float) -> float:
        """Return a healthy KV-cache usage (0.15 to 0.55) that drifts over ten minutes."""
        return 0.35 + 0.2 * math.sin(t / 600.0 + self.phase[pod.name])

    def chunk(self, t0: float, t1: float) -> None:
        """Add every record of event seconds [t0, t1)."""
        rec, rng = self.rec, self.rec.rng
        for _, _, pods in self.llm:
            for i, pod in enumerate(pods):
                for t in _ticks(t0, t1, 10.0, 2.3 * i):
                    _vllm_stats(rec, pod, t, self.kv(pod, t))
                for t in _ticks(t0, t1, 15.0, 0.0):
                    _vllm_scrape(rec, t, pod, self.kv(pod, t))
        for upstream, host, pods in self.llm:
            for t in r.arrivals(rng, t0, t1, lambda _t: LLM_RATE_PER_S):
                self.lb.client(t, pods, upstream, host, f"POST {w.CHAT}", self.serve_llm)
        for upstream, host, pods in self.web:
            for t in r.arrivals(rng, t0, t1, lambda _t: WEB_RATE_PER_S):
                if rng.random() < FLAKY:
                    out = tr.Outcome(503, 190, rng.uniform(0.001, 0.01))
                    fields = tr.upstream_fields(upstream, [(rng.choice(pods).addr, "503")], out)
                    self.lb.access(t, host, "GET /api/session", fields, out)
                else:
                    path = rng.choice(tr._PAGES)[0]
                    self.lb.route(t, pods, upstream, host, f"GET {path}", self.serve_web)
        for pod in self.workers:
            for t in r.arrivals(rng, t0, t1, lambda _t: CHATTER_PER_S):
                level, logger, msg = rng.choice(CHATTER)
                text = msg.format(n=rng.randrange(1, 5000), ms=rng.randrange(3, 900))
                stream = "stdout" if level == "INFO" else "stderr"
                rec.log(pod, t, w.pylog(rec.start + t, level, logger, text), stream)
        for _, _, pods in self.web:
            self._probes(t0, t1, pods)
        self._probes(t0, t1, self.workers)

    def _probes(self, t0: float, t1: float, pods: list[Pod]) -> None:
        """Add the odd failed readiness probe (a Warning event that names no failure)."""
        for pod in pods:
            for t in r.arrivals(self.rec.rng, t0, t1, lambda _t: PROBE_FAIL_PER_S):
                msg = f'Readiness probe failed: Get "http://{pod.addr}/healthz": context deadline'
                self.rec.event(t, pod, "Unhealthy", msg + " exceeded", warning=True)


def _ticks(t0: float, t1: float, every_s: float, offset_s: float) -> Iterator[float]:
    """Yield the times ``offset_s + k * every_s`` in [t0, t1)."""
    t = offset_s + math.ceil((t0 - offset_s) / every_s) * every_s
    while t < t1:
        yield t
        t += every_s


def write_storm(outdir: Path, target: int, seed: int) -> tuple[list[Path], str]:
    """Write ``target`` records (the cascade and the storm); return the files and a summary."""
    cascade = count_records(write_recording("cascade", outdir / "cascade", seed=seed))
    rec = Recorder(f"storm/{seed}", START)
    storm = Storm(rec)
    (outdir / "storm").mkdir(parents=True, exist_ok=True)
    handles: dict[str, IO[str]] = {}
    written, t0, last_s = 0, 0.0, 0.0
    try:
        while written < target - cascade:
            storm.chunk(t0, t0 + CHUNK_S)
            rows = sorted((t, seq, name, text) for name, got in rec.files.items()
                          for t, seq, text in got)[: target - cascade - written]  # fmt: skip
            rec.files.clear()
            for t, _, name, text in rows:
                if name not in handles:
                    handles[name] = (outdir / "storm" / name).open("w", encoding="utf-8")
                handles[name].write(text + "\n")
                last_s = max(last_s, t / 1e6)
            written += len(rows)
            t0 += CHUNK_S
    finally:
        for handle in handles.values():
            handle.close()
    at_s = round(CASCADE_AT * last_s / 60.0) * 60.0
    write_recording("cascade", outdir / "cascade", seed=seed, start=START + at_s)
    workloads = len(storm.llm) + len(storm.web) + len(APPS)
    summary = (
        f"storm: {written:,} records over {last_s:,.0f} s of event time, {workloads} workloads, "
        f"{sum(1 for _ in storm.pods())} pods; the cascade ({cascade:,} records) at +{at_s:.0f} s"
    )
    return sorted(outdir.glob("*/*.jsonl")), summary


def _merged(paths: list[Path]) -> Iterator[tuple[bytes | None, bytes, int | None]]:
    """Yield the keyed records of the files merged by event time (records with none keep
    their place after the last timed record of their file)."""
    from detector.config import Settings
    from detector.stream.app import keyed_records

    def timed(path: Path) -> Iterator[tuple[int, bytes | None, bytes, int | None]]:
        last = 0
        for key, value, ts in keyed_records([path], Settings()):
            last = ts if ts is not None else last
            yield last, key, value, ts

    for _, key, value, ts in heapq.merge(*(timed(p) for p in paths), key=lambda x: x[0]):
        yield key, value, ts


def _prepare(folder: Path, bootstrap: str, topic: str, target: int, seed: int) -> dict[str, Any]:
    """Write the storm, produce it to ``topic`` (1 partition), note the end offset."""
    from detector.stream.producer import KafkaSink, ensure_topics

    start = time.perf_counter()
    paths, summary = write_storm(folder / "storm", target, seed)
    generated = time.perf_counter() - start
    ensure_topics(bootstrap, [topic])
    sink = KafkaSink(bootstrap)
    sent = size = 0
    start = time.perf_counter()
    try:
        for key, value, ts in _merged(paths):
            sink.send(topic, value, key=key, timestamp_ms=ts)
            sent, size = sent + 1, size + len(value)
        sink.flush(timeout_s=bench_kafka.WAIT_S)
    finally:
        sink.close()
    produced = time.perf_counter() - start
    end = bench_kafka._end_offset(bootstrap, topic)
    deadline = time.monotonic() + 10.0  # Tansu's end offset can trail the flush (bench_kafka)
    while end < sent and time.monotonic() < deadline:
        time.sleep(0.1)
        end = bench_kafka._end_offset(bootstrap, topic)
    (folder / "end.json").write_text(json.dumps({"end": max(end, sent), "records": sent}))
    note = (
        f"{summary}\n{sent:,} records, {size / 1e6:.0f} MB, seed {seed}, generated in "
        f"{generated:.0f} s; produced keyed by workload (merged by event time) to 1 topic x 1 "
        f"partition in {produced:.0f} s ({sent / produced:,.0f} records/s), end offset {end:,}"
    )
    return {"note": note}


# --- the phases that measure -----------------------------------------------------------------


def _product(folder: Path, bootstrap: str, topic: str) -> dict[str, Any]:
    """Run ``detector run`` as a child; sample its RSS against its committed offset."""
    from kafka import KafkaConsumer, TopicPartition

    records = json.loads((folder / "end.json").read_text())["records"]
    group, db_path = f"storm-{uuid.uuid4().hex[:8]}", folder / "run.db"
    cmd = [sys.executable, "-m", "detector", "run", "--db", f"sqlite:///{db_path}",
           "--bootstrap", bootstrap, "--topics", topic, "--group", group,
           "--dead-letter-topic", f"{topic}-dead-letters"]  # fmt: skip
    probe = KafkaConsumer(bootstrap_servers=[bootstrap], group_id=group, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)

    def committed() -> int:
        found = probe.committed(tp)
        return found if isinstance(found, int) and found > 0 else 0

    log_path = folder / "run.log"
    with log_path.open("wb") as log_file:
        spawned = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            samples = _sample(proc, committed, records, deadline_s=60.0 + records / 2000.0)
        finally:
            hwm = _stop(proc)
            probe.close(autocommit=False)
    if not samples or samples[-1][1] < records:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        got = samples[-1][1] if samples else 0
        raise RuntimeError(f"detector run committed {got:,} of {records:,}: {' | '.join(tail)}")
    (t_first, first, _), (t_last, _, _) = samples[0], samples[-1]
    later = [rss for _, n, rss in samples if n >= QUANTILES[0] * records] or [samples[-1][2]]
    with sqlite3.connect(db_path) as conn:
        stages = sorted(s for (s,) in conn.execute("SELECT stage FROM incidents"))
        dead = conn.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    note = (
        f"detector run exit {proc.returncode}; first commit {t_first - spawned:.1f} s after start"
        f" (imports, migrations, group join; not timed), at offset {first:,}; "
        f"{len(stages)} incident(s) {stages}, {dead} dead letter(s); VmRSS sampled every "
        f"{SAMPLE_S} s ({len(samples)} samples), from 10% of the records on: min "
        f"{min(later):.0f} MiB, max {max(later):.0f} MiB"
    )
    return {
        "records": records - first,
        "seconds": t_last - t_first,
        "peak_rss_mib": max(hwm, max(s[2] for s in samples)),
        "rss_at": _at_shares([(n / records, rss) for _, n, rss in samples]),
        "samples": len(samples),
        "first_share": first / records,
        "note": note,
    }


def _sample(
    proc: subprocess.Popen[bytes], committed: Any, records: int, deadline_s: float
) -> list[tuple[float, int, float]]:
    """Return ``(time, committed offset, VmRSS MiB)`` from the first commit to the last."""
    samples: list[tuple[float, int, float]] = []
    deadline = time.monotonic() + deadline_s
    while proc.poll() is None and time.monotonic() < deadline:
        done = committed()
        rss = vm_mib("VmRSS", proc.pid)
        if done and rss is not None:
            samples.append((time.perf_counter(), done, rss))
            if done >= records:
                break
        time.sleep(SAMPLE_S if samples else 0.05)  # finer until the first commit is seen
    return samples


def _stop(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM the detector, wait for it; return its VmHWM (MiB) seen until it exited."""
    hwm = 0.0
    if proc.poll() is None:
        hwm = vm_mib("VmHWM", proc.pid) or 0.0
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30.0
    while proc.poll() is None and time.monotonic() < deadline:
        hwm = max(hwm, vm_mib("VmHWM", proc.pid) or 0.0)
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return hwm


def _replay(folder: Path) -> dict[str, Any]:
    """Replay the storm's files through ``detector.pipeline.replay``; VmRSS at each share."""
    from detector.config import DatabaseSettings, Settings
    from detector.pipeline import replay

    records = json.loads((folder / "end.json").read_text())["records"]
    settings = Settings(database=DatabaseSettings(url=f"sqlite:///{folder / 'replay.db'}"))
    marks = [math.ceil(q * records) for q in QUANTILES]
    seen: list[tuple[float, float]] = []
    count = 0

    def progress(_size: int) -> None:
        nonlocal count
        count += 1
        if marks and count >= marks[0]:
            marks.pop(0)
            seen.append((count / records, vm_mib("VmRSS") or 0.0))

    start = time.perf_counter()
    result = replay(sorted((folder / "storm").glob("*/*.jsonl")), settings, progress=progress)
    seconds = time.perf_counter() - start
    stages = sorted(i.stage for i in result.incidents)
    events = result.events
    note = f"parsed {events.parsed:,}, rejected {events.rejected:,}; incident(s) {stages}"
    return {"records": events.read, "seconds": seconds, "rss_at": _at_shares(seen), "note": note}


def _at_shares(samples: Iterable[tuple[float, float]]) -> dict[str, float]:
    """Return the RSS of the first sample at or past each share of QUANTILES (keys '0.1'...)."""
    out: dict[str, float] = {}
    for share, rss in samples:
        for q in QUANTILES:
            if share >= q and str(q) not in out:
                out[str(q)] = rss
    return out


if __name__ == "__main__":
    raise SystemExit(main())
