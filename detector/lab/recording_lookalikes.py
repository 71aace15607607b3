"""Look-alike recordings: a crash loop on host RAM and a 5xx surge from a failing dependency.

Both show crash loops or 502/503/504 at an ingress upstream as the cascade does, but no GPU
out-of-memory error: the detector must record a "not this pattern" verdict, not an incident.
"""

from __future__ import annotations

from detector.lab import recorder as r
from detector.lab import recorder_traffic as tr
from detector.lab import wordings as w
from detector.lab.recorder import Pod, Recorder
from detector.lab.recorder_traffic import Ingress, Outcome
from detector.lab.wordings import frames, utc

# --- host-oom: crash loop on host RAM, no GPU OOM --------------------------------------------

EMBED_UPSTREAM, EMBED_HOST = "batch-embedder-8080", "embed.example.com"
NEGATIVE_END = 180.0
_KILLS = ((40.0, 90.0, 135.0), (60.0, 125.0), (100.0, 150.0))  # OOMKilled, back-off doubles


def host_oom(rec: Recorder, scale: int) -> None:
    """Three embedder pods crash-loop OOMKilled (exit 137) with 5xx at their upstream."""
    lb = tr.ingress(rec)
    ips = [f"10.0.{7 + i}.{31 + i}" for i in range(3)]
    image = "registry.example.com/batch/embedder:1.4.2"
    pods = r.deployment(rec, "batch", "embedder", 3, "embedder", image, 8080, ips)
    nodes = ("gpu-h100-node-03", "gpu-h100-node-04", "gpu-h100-node-05")
    r.place_gpus(rec, pods, nodes, 1, r.H100)
    for i, (pod, kills) in enumerate(zip(pods, _KILLS, strict=True)):
        pod.ready_after_s, backoff = 12.0, 10.0
        for kill in kills:
            pod.deaths.append(kill)
            rec.restart(pod, kill + backoff)
            backoff *= 2
        _embedder_life(rec, lb, pod, scale, traceback=i != 1)
    serve = _embed_serve(rec)
    for t in r.arrivals(rec.rng, 12.0, NEGATIVE_END, lambda _t: 0.25 * scale):
        lb.client(t, pods, EMBED_UPSTREAM, EMBED_HOST, "POST /v1/embeddings", serve)
    for t in range(0, int(NEGATIVE_END), 15):
        for pod in pods:
            up = pod.dead_since(t) is None and t - pod.starts[pod.run(t)] >= 6.0
            r.scrape_fb(rec, t, pod, 9240.0 + rec.rng.uniform(-300, 900) if up else 0.0)
    tr.web_noise(rec, lb, NEGATIVE_END, scale, 0.03)
    tr.monitoring(rec, NEGATIVE_END)


def _embed_serve(rec: Recorder) -> tr.Serve:
    """Return an embedder pod's handler: 200 and its uvicorn access line."""

    def serve(pod: Pod, t: float, request: str) -> Outcome:
        out = Outcome(200, rec.rng.randrange(40_000, 900_000), rec.rng.uniform(0.08, 1.8))
        client = f"{tr.INGRESS_IP}:{rec.rng.randrange(32768, 61000)}"
        method, path = request.split()
        rec.log(pod, t - out.seconds + 0.001, w.uvicorn_access(client, method, path, 200))
        return out

    return serve


def _embedder_life(rec: Recorder, lb: Ingress, pod: Pod, scale: int, traceback: bool) -> None:
    """Add one embedder pod's runs: start-up, host-memory warnings, OOMKilled, back-off."""
    for run, t0 in enumerate(pod.starts):
        r.started(rec, t0, pod, scheduled=run == 0)
        rec.lines(pod, t0 + 0.5, w.embedder_startup(rec.start + t0 + 0.5))
        _pod_status(rec, t0 + pod.ready_after_s, pod, run)
        if run == len(pod.deaths):
            return
        kill = pod.deaths[run]
        for dt, text in w.embedder_warnings(rec.rng.randrange(60_000, 180_000)):
            line = w.pylog(rec.start + kill - dt, "WARNING", "embedder.batching", text)
            rec.log(pod, kill - dt, line, "stderr")
        if traceback and run == 0:  # a DataLoader worker died first and the parent says so
            lines = [(0.0, "stderr", text) for text in embedder_killed_traceback()]
            rec.lines(pod, kill - 0.4, lines)
        lb.cut(kill, pod, EMBED_UPSTREAM, EMBED_HOST, "POST /v1/embeddings", 2 * scale)
        _pod_status(rec, kill + 1.0, pod, run, waiting=True)
        r.back_off(rec, pod, kill + 1.0, pod.starts[run + 1] - 0.5, 10.0)


def _pod_status(rec: Recorder, t: float, pod: Pod, run: int, waiting: bool = False) -> None:
    """Add the Pod as ``kubectl get pod -o json`` shows it: Ready, or CrashLoopBackOff."""
    status = _container_status(rec, pod, run, waiting)
    ready = "False" if waiting else "True"
    conditions = [
        {"type": kind, "status": ready, "lastProbeTime": None, "lastTransitionTime": _at(rec, t)}
        for kind in ("Ready", "ContainersReady")
    ]
    meta = {
        "name": pod.name,
        "generateName": f"{pod.owner}-",
        "namespace": pod.namespace,
        "uid": pod.uid,
        "resourceVersion": rec.resource_version(),
        "creationTimestamp": _at(rec, -2.0),
        "labels": pod.labels(),
        "ownerReferences": [r.owner_reference(pod)],
    }
    host_ip = f"10.128.0.{30 + int(pod.node[-2:])}"
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": _pod_spec(pod),
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": host_ip,
            "podIP": pod.ip,
            "startTime": _at(rec, -1.0),
            "containerStatuses": [status],
            "qosClass": "Guaranteed",
        },
    }
    rec.put("k8s-pods.jsonl", t, obj)


def _pod_spec(pod: Pod) -> dict[str, object]:
    """Return the pod's spec: one container with a 16Gi memory limit and one GPU."""
    limits = {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    ports = [{"containerPort": pod.port, "protocol": "TCP"}]
    resources = {"limits": limits, "requests": limits}
    container = {"name": pod.container, "image": pod.image, "ports": ports, "resources": resources}
    return {"containers": [container], "nodeName": pod.node, "restartPolicy": "Always"}


def _at(rec: Recorder, t: float) -> str:
    """Return offset ``t`` as a Kubernetes timestamp."""
    return w.rfc3339(rec.start + t)


def _container_status(rec: Recorder, pod: Pod, run: int, waiting: bool) -> dict[str, object]:
    """Return the containerStatus of run ``run``: running, or waiting after its OOMKill."""
    last: dict[str, object] = {}
    done = run if waiting else run - 1  # the run whose termination is lastState
    if done >= 0:
        last = {
            "terminated": {
                "exitCode": 137,
                "reason": "OOMKilled",
                "startedAt": _at(rec, pod.starts[done]),
                "finishedAt": _at(rec, pod.deaths[done]),
                "containerID": f"containerd://{pod.container_ids[done]}",
            }
        }
    state: dict[str, object] = {"running": {"startedAt": _at(rec, pod.starts[run])}}
    if waiting:
        wait_s = round(pod.starts[run + 1] - pod.deaths[run])
        message = (
            f"back-off {wait_s}s restarting failed container={pod.container} "
            f"pod={pod.name}_{pod.namespace}({pod.uid})"
        )
        state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
    return {
        "name": pod.container,
        "state": state,
        "lastState": last,
        "ready": not waiting,
        "restartCount": run,
        "image": pod.image,
        "imageID": pod.digest,
        "containerID": f"containerd://{pod.container_ids[run]}",
        "started": not waiting,
    }


# --- upstream-5xx: a failing dependency, no OOM, no crash loop -------------------------------

RERANK_UPSTREAM, RERANK_HOST = "shop-reranker-8080", "api.shop.example.com"
UPSTREAM_END = 115.0
OUTAGE = (30.0, 90.0)  # catalog-db-0 away: drained, volume re-attached, restarted
DB_ADDR = "10.96.41.17"


def upstream_5xx(rec: Recorder, scale: int) -> None:
    """Three reranker pods answer 502/503/504 while their database is away; GPU memory flat."""
    lb = tr.ingress(rec)
    ips = [f"10.0.{10 + i}.{41 + i}" for i in range(3)]
    image = "registry.example.com/shop/reranker:2.3.0"
    pods = r.deployment(rec, "shop", "reranker", 3, "reranker", image, 8080, ips)
    r.place_gpus(rec, pods, ("gpu-l4-node-01", "gpu-l4-node-02", "gpu-l4-node-03"), 1, r.L4)
    for pod in pods:
        pod.ready_after_s = 8.0
        r.started(rec, 0.0, pod, scheduled=True)
        rec.lines(pod, 0.5, w.reranker_startup(rec.start + 0.5))
    _catalog_db(rec)
    serve = _rerank_serve(rec)
    for t in r.arrivals(rec.rng, 8.0, UPSTREAM_END, lambda _t: 0.7 * scale):
        lb.client(t, pods, RERANK_UPSTREAM, RERANK_HOST, "POST /v1/rerank", serve)
    for t in range(0, int(UPSTREAM_END), 15):
        for pod in pods:
            r.scrape_fb(rec, t, pod, 6120.0 + rec.rng.uniform(-6.0, 6.0) if t >= 5 else 0.0)
    tr.web_noise(rec, lb, UPSTREAM_END, scale, 0.03)
    tr.monitoring(rec, UPSTREAM_END)


def _rerank_serve(rec: Recorder) -> tr.Serve:
    """Return the reranker pods' handler: fine, or 502/504 then circuit-breaker 503s."""
    opened: dict[str, float] = {}  # pod -> when its circuit breaker last opened

    def serve(pod: Pod, t: float, request: str) -> Outcome:
        if not OUTAGE[0] <= t < OUTAGE[1]:
            if opened.pop(pod.name, None) is not None:
                _app_log(rec, pod, t, "INFO", "catalog-db reachable again; circuit closed")
            out = Outcome(200, rec.rng.randrange(900, 4000), rec.rng.uniform(0.03, 0.25))
        elif OUTAGE[0] + 30.0 <= t < OUTAGE[0] + 50.0 and rec.rng.random() < 0.3:
            # reads sent while the old DB pod was terminating hang until the 30 s timeout
            _app_log(rec, pod, t, "WARNING", reranker_timeout(DB_ADDR))
            return Outcome(504, 160, 30.0 + rec.rng.uniform(0.0, 0.01), tr.TIMED_OUT)
        elif t < OUTAGE[0] + 20.0:  # refused while the new DB pod waits for its volume
            _app_log(rec, pod, t, "WARNING", f"catalog-db unreachable: {refused(DB_ADDR)}")
            out = Outcome(502, 110, rec.rng.uniform(0.002, 0.02))
        elif t - opened.get(pod.name, -99.0) >= 30.0:  # (half-open) probe fails: open again
            if not opened:  # the first failure of all is logged with its traceback
                _app_log(rec, pod, t, "ERROR", "passage fetch failed; answering 502")
                tb = [(0.0, "stderr", x) for x in reranker_refused_traceback(DB_ADDR)]
                rec.lines(pod, t - 0.004, tb)
            opened[pod.name] = t
            msg = "catalog-db circuit open after 5 consecutive failures; answering 503 for 30 s"
            _app_log(rec, pod, t + 0.001, "WARNING", msg)
            out = Outcome(502, 110, rec.rng.uniform(0.002, 0.02))
        else:
            out = Outcome(503, 95, rec.rng.uniform(0.001, 0.004))
        client = f"{tr.INGRESS_IP}:{rec.rng.randrange(32768, 61000)}"
        method, path = request.split()
        rec.log(pod, t - 0.001, w.uvicorn_access(client, method, path, out.status))
        return out

    return serve


def _app_log(rec: Recorder, pod: Pod, t: float, level: str, text: str) -> None:
    """Add one Python logging line of the reranker (stderr), just before its response."""
    rec.log(pod, t - 0.005, w.pylog(rec.start + t - 0.005, level, "reranker.store", text), "stderr")


def _catalog_db(rec: Recorder) -> None:
    """Add the database pod drained away (Killing, fast shutdown) and, later, back."""
    image = "docker.io/library/postgres:16.8"
    old = rec.pod(
        "shop", "catalog-db", "cpu-node-03", "10.0.4.21", "postgres", image, "catalog-db-0"
    )
    old.owner_uid = rec.uuid()
    rec.event(OUTAGE[0], old, "Killing", "Stopping container postgres")
    for i, text in enumerate(postgres_shutdown()):
        rec.log(old, OUTAGE[0] + 0.2 + 0.01 * i, postgres_log(rec.start + OUTAGE[0] + 0.2, text))
    new = rec.pod(
        "shop", "catalog-db", "cpu-node-01", "10.0.4.37", "postgres", image, "catalog-db-0"
    )
    new.owner_uid, new.starts = old.owner_uid, [OUTAGE[1] - 15.0]
    _db_volume_moves(rec, new)
    r.started(rec, OUTAGE[1] - 15.0, new)
    for i, text in enumerate(postgres_startup(rec.start + OUTAGE[0] + 0.3)):
        t = OUTAGE[1] - 14.0 + 0.05 * i
        rec.log(new, t, postgres_log(rec.start + t, text))


def _db_volume_moves(rec: Recorder, new: Pod) -> None:
    """Add the new database pod's scheduling and its volume's Multi-Attach, then attach."""
    msg = f"Successfully assigned shop/catalog-db-0 to {new.node}"
    rec.event(
        OUTAGE[0] + 6.0, new, "Scheduled", msg, component="default-scheduler", container=False
    )
    volume = f"pvc-{rec.uuid()}"
    multi = (
        f'Multi-Attach error for volume "{volume}" Volume is already exclusively attached '
        "to one node and can't be attached to another"
    )
    attached = f'AttachVolume.Attach succeeded for volume "{volume}"'
    for t, reason, text, warning in (
        (OUTAGE[0] + 11.0, "FailedAttachVolume", multi, True),
        (OUTAGE[1] - 26.0, "SuccessfulAttachVolume", attached, False),
    ):
        rec.event(
            t,
            new,
            reason,
            text,
            warning=warning,
            component="attachdetach-controller",
            container=False,
        )


# --- wordings of the look-alike services -------------------------------------------------

_DATALOADER_FRAMES = """\
{d}/torch/utils/data/dataloader.py|1243|_try_get_data|data = self._data_queue.get(timeout=timeout)
/usr/local/lib/python3.11/multiprocessing/queues.py|113|get|if not self._poll(timeout):
{d}/torch/utils/data/_utils/signal_handling.py|67|handler|_error_if_any_worker_fails()
"""
_EMBEDDER_FRAMES = """\
/app/embedder/batching.py|88|encode_batch|for batch in loader:
{d}/torch/utils/data/dataloader.py|701|__next__|data = self._next_data()
{d}/torch/utils/data/dataloader.py|1448|_next_data|idx, data = self._get_data()
{d}/torch/utils/data/dataloader.py|1256|_try_get_data|raise RuntimeError(
"""
_RERANKER_FRAMES = """\
/app/reranker/api.py|57|rerank|passages = await store.fetch_passages(ids)
/app/reranker/store.py|41|fetch_passages|conn = await asyncpg.connect(self.dsn)
{d}/asyncpg/connection.py|2329|connect|return await connect_utils._connect(
/usr/local/lib/python3.11/asyncio/base_events.py|1085|create_connection|raise exceptions[0]
/usr/local/lib/python3.11/asyncio/selector_events.py|634|sock_connect|return await fut
"""
PY311_SITE = "/usr/local/lib/python3.11/site-packages"


def embedder_killed_traceback() -> list[str]:
    """Return what a PyTorch DataLoader parent prints when the kernel SIGKILLs a worker.

    Wording of torch/utils/data/_utils/signal_handling.py and dataloader.py; no CUDA OOM.
    """
    return [
        "Traceback (most recent call last):",
        *frames(_DATALOADER_FRAMES, PY311_SITE),
        "RuntimeError: DataLoader worker (pid 57) is killed by signal: Killed. ",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        *frames(_EMBEDDER_FRAMES, PY311_SITE),
        "RuntimeError: DataLoader worker (pid(s) 57) exited unexpectedly",
    ]


def refused(db_addr: str) -> str:
    """Return asyncio's wording for a refused PostgreSQL connection."""
    return f"ConnectionRefusedError: [Errno 111] Connect call failed ('{db_addr}', 5432)"


def reranker_refused_traceback(db_addr: str) -> list[str]:
    """Return the traceback the reranker logs when its database refuses the connection."""
    return [
        "Traceback (most recent call last):",
        *frames(_RERANKER_FRAMES, PY311_SITE),
        refused(db_addr),
    ]


def reranker_timeout(db_addr: str) -> str:
    """Return the reranker's warning when a database read outlives its 30 s budget."""
    return f"fetch_passages timed out after 30.0 s (catalog-db {db_addr}:5432)"


def postgres_log(t: float, text: str) -> str:
    """Return a PostgreSQL server log line (docker image default ``log_line_prefix``)."""
    millis = round((t % 1) * 1000) % 1000
    return f"{utc(t, '%Y-%m-%d %H:%M:%S')}.{millis:03d} UTC {text}"


def postgres_shutdown() -> list[str]:
    """Return PostgreSQL 16's lines for a fast shutdown (SIGTERM from the kubelet)."""
    return [
        "[1] LOG:  received fast shutdown request",
        "[1] LOG:  aborting any active transactions",
        '[1] LOG:  background worker "logical replication launcher" (PID 68) exited with '
        "exit code 1",
        "[27] LOG:  shutting down",
        "[27] LOG:  checkpoint starting: shutdown immediate",
        "[1] LOG:  database system is shut down",
    ]


def postgres_startup(shut_down_at: float) -> list[str]:
    """Return PostgreSQL 16's start-up lines after a clean shutdown at ``shut_down_at``."""
    return [
        "[1] LOG:  starting PostgreSQL 16.8 (Debian 16.8-1.pgdg120+1) on x86_64-pc-linux-gnu, "
        "compiled by gcc (Debian 12.2.0-14) 12.2.0, 64-bit",
        '[1] LOG:  listening on IPv4 address "0.0.0.0", port 5432',
        '[1] LOG:  listening on Unix socket "/var/run/postgresql/.s.PGSQL.5432"',
        f"[29] LOG:  database system was shut down at {utc(shut_down_at, '%Y-%m-%d %H:%M:%S')} UTC",
        "[1] LOG:  database system is ready to accept connections",
    ]
