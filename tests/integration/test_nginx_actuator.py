"""The nginx rate-limit actuator against a real nginx (Debian package ``nginx``).

Each test starts its own nginx master on free loopback ports, with its prefix, config, pid
file, logs and temp paths under ``tmp_path``, so it runs as root or not. The gateway server
proxies to a backend server of the same nginx (``return 200``); the limit has to sit in front
of a proxy or content handler, because ``return`` answers in the rewrite phase, before
``limit_req`` runs in the preaccess phase (https://nginx.org/en/docs/dev/development_guide.html
#http_phases).

Counts follow nginx's leaky bucket with ``nodelay``
(https://nginx.org/en/docs/http/ngx_http_limit_req_module.html): the first request of a fresh
zone is free, then at most ``burst`` more at once and one per 1/rate seconds, so a burst of N
requests over D seconds gets at most 1 + burst + floor(rate x D) answers that are not 429. D is
measured, and only used to bound the count: no timing threshold is asserted.
"""

from __future__ import annotations

import http.client
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import pytest
from small_cascade import rate_step

from detector.actuators.base import Status
from detector.actuators.nginx.config import AdmissionRule, RateLimit
from detector.actuators.nginx.limiter import (
    NginxAdmission,
    NginxGateway,
    NginxRateLimiter,
    serving_children,
)
from detector.runbooks.bindings.nginx import rate_limit_from_step

START_TIMEOUT_S = 15.0
BURST_N = 30

CONFIG = """\
daemon off;
master_process on;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/logs/error.log notice;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_buffer_size 128k;  # request bodies in memory: workers may not own temp/
    client_body_temp_path {root}/temp/body;
    proxy_temp_path {root}/temp/proxy;
    fastcgi_temp_path {root}/temp/fastcgi;
    uwsgi_temp_path {root}/temp/uwsgi;
    scgi_temp_path {root}/temp/scgi;
    include {root}/conf/detector/http.conf;
    server {{
        listen 127.0.0.1:{backend};
        location / {{ return 200 "backend\\n"; }}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            include {root}/conf/detector/location.conf;
            include {root}/conf/detector/admission.conf;
            proxy_pass http://127.0.0.1:{backend};
        }}
    }}
}}
"""


def _unavailable(message: str) -> NoReturn:
    """Skip, or fail under CI (env ``CI`` set), when nginx cannot run."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; CI must run the nginx tests (make services installs nginx)")
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        _unavailable("nginx is not installed (Debian package nginx; make services installs it)")
    return found


@dataclass(frozen=True)
class RunningNginx:
    """An nginx started by a test: its gateway description and the gateway's port."""

    gateway: NginxGateway
    port: int
    pid: int


def _wait_until_serving(proc: subprocess.Popen[bytes], root: Path, port: int) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    pid_file = root / "nginx.pid"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _unavailable(f"nginx exited {proc.returncode}: {_stderr_tail(root)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                if pid_file.exists() and pid_file.read_text().strip():
                    return int(pid_file.read_text())
        except OSError:
            pass
        time.sleep(0.05)
    _unavailable(f"nginx did not serve on 127.0.0.1:{port}: {_stderr_tail(root)}")


def _stderr_tail(root: Path) -> str:
    texts = [p.read_text(errors="replace") for p in root.glob("logs/*.log") if p.exists()]
    return " | ".join(text.strip()[-400:] for text in texts)


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[RunningNginx]:
    """Start nginx (master + 1 worker, ``daemon off``) with empty detector includes."""
    binary = _nginx_binary()
    root = tmp_path / "nginx"
    for sub in ("conf/detector", "logs", "temp"):
        (root / sub).mkdir(parents=True)
    port, backend = _free_port(), _free_port()
    conf = root / "conf" / "nginx.conf"
    conf.write_text(CONFIG.format(root=root, port=port, backend=backend))
    http_include = root / "conf/detector/http.conf"
    location_include = root / "conf/detector/location.conf"
    http_include.touch()  # the documented wiring: the includes exist before nginx starts
    location_include.touch()
    (root / "conf/detector/admission.conf").touch()
    gateway = NginxGateway(
        conf_path=conf,
        http_include=http_include,
        location_include=location_include,
        admission_include=root / "conf/detector/admission.conf",
        prefix=root,
        pid_file=root / "nginx.pid",
        error_log=root / "logs" / "startup.log",
        nginx_bin=binary,
    )
    stderr = (root / "logs" / "stderr.log").open("wb")
    proc = subprocess.Popen(gateway.argv(), stdout=stderr, stderr=stderr)
    try:
        pid = _wait_until_serving(proc, root, port)
        yield RunningNginx(gateway, port, pid)
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        stderr.close()


def burst(port: int, n: int = BURST_N) -> tuple[Counter[int], float]:
    """Send ``n`` GET requests back to back; return the status counts and the seconds taken."""
    counts: Counter[int] = Counter()
    start = time.monotonic()
    for _ in range(n):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/v1/completions")
            response = conn.getresponse()
            response.read()
            counts[response.status] += 1
        finally:
            conn.close()
    return counts, time.monotonic() - start


def assert_limited(counts: Counter[int], elapsed_s: float, limit: RateLimit) -> None:
    """Assert the leaky-bucket bound: 1 <= non-429 <= 1 + burst + floor(rate x elapsed)."""
    allowed = 1 + limit.burst + math.floor(limit.requests_per_s * elapsed_s)
    assert set(counts) <= {200, 429}, counts
    assert 1 <= counts[200] <= allowed, (counts, elapsed_s)
    assert counts[429] == BURST_N - counts[200]
    assert counts[429] >= BURST_N - allowed


def planned_rate_limit() -> RateLimit:
    """Return the RateLimit the shipped runbook plans for the small cascade.

    Its aggregate budget: 5 ok/s x 2 serving / 4 seen = 2.5/s, as 150 r/m for all clients
    together (one constant key), and 2 serving x max_num_seqs 128 = 256 connections.
    """
    return rate_limit_from_step(rate_step())


def test_rate_limit_answers_429_at_the_planned_rate_and_revert_restores(
    nginx: RunningNginx,
) -> None:
    limit = planned_rate_limit()
    assert (limit.rate, limit.connections, limit.zone) == ("150r/m", 256, "detector_ml_llm")
    before, _ = burst(nginx.port)
    assert before == Counter({200: BURST_N})

    actuator = NginxRateLimiter(nginx.gateway)
    step_plan = actuator.plan(limit)
    assert "+limit_req_zone global zone=detector_ml_llm:10m rate=150r/m;" in step_plan.diff
    assert "+limit_conn_zone global zone=detector_ml_llm_conn:10m;" in step_plan.diff
    assert "+limit_conn detector_ml_llm_conn 256;" in step_plan.diff
    applied = actuator.apply(step_plan, dry_run=False)
    assert applied.status is Status.OK, applied.message()
    assert actuator.verify(step_plan).status is Status.OK

    limited, elapsed_s = burst(nginx.port)
    print(f"after apply: {dict(limited)} in {elapsed_s:.3f} s at {limit.rate}")
    assert_limited(limited, elapsed_s, limit)

    reverted = actuator.revert(step_plan, dry_run=False)
    assert reverted.status is Status.OK, reverted.message()
    assert reverted.diff.count("-limit_req") == 3  # zone, limit_req, limit_req_status
    assert reverted.diff.count("-limit_conn") == 3  # zone, limit_conn, limit_conn_status
    assert nginx.gateway.http_include.read_text() == ""
    assert nginx.gateway.location_include.read_text() == ""
    after, _ = burst(nginx.port)
    assert after == Counter({200: BURST_N})
    assert actuator.revert(step_plan, dry_run=False).status is Status.UNCHANGED


def test_burst_param_admits_that_many_more(nginx: RunningNginx) -> None:
    limit = RateLimit(zone="detector_ml_llm", rate_per_s=1, burst=5)
    actuator = NginxRateLimiter(nginx.gateway)
    assert actuator.apply(actuator.plan(limit), dry_run=False).status is Status.OK
    counts, elapsed_s = burst(nginx.port)
    print(f"burst=5: {dict(counts)} in {elapsed_s:.3f} s at {limit.rate}")
    assert_limited(counts, elapsed_s, limit)
    assert counts[200] >= 1 + limit.burst  # the burst is served at once (nodelay)


def test_dry_run_writes_nothing_and_reloads_nothing(nginx: RunningNginx) -> None:
    actuator = NginxRateLimiter(nginx.gateway)
    step_plan = actuator.plan(RateLimit(zone="detector_ml_llm", rate_per_s=1))
    files = sorted(nginx.gateway.http_include.parent.iterdir())
    workers = serving_children(nginx.pid)

    result = actuator.apply(step_plan)  # dry-run is the default

    assert result.status is Status.DRY_RUN
    assert result.diff == step_plan.diff
    assert "+limit_req zone=detector_ml_llm nodelay;" in result.diff
    assert "+limit_req_status 429;" in result.diff
    assert sorted(nginx.gateway.http_include.parent.iterdir()) == files
    assert nginx.gateway.http_include.read_text() == ""
    assert nginx.gateway.location_include.read_text() == ""
    assert serving_children(nginx.pid) == workers
    assert burst(nginx.port)[0] == Counter({200: BURST_N})


def test_reapply_is_unchanged_and_reloads_nothing(nginx: RunningNginx) -> None:
    actuator = NginxRateLimiter(nginx.gateway)
    limit = RateLimit(zone="detector_ml_llm", rate_per_s=1)
    step_plan = actuator.plan(limit)
    assert actuator.apply(step_plan, dry_run=False).status is Status.OK
    workers = serving_children(nginx.pid)

    again = actuator.apply(step_plan, dry_run=False)
    replanned = actuator.plan(limit)

    assert again.status is Status.UNCHANGED
    assert again.diff == "" and again.changes == ()
    assert replanned.is_empty and replanned.diff == ""
    assert serving_children(nginx.pid) == workers


def test_config_failing_nginx_t_is_restored_and_never_reloaded(nginx: RunningNginx) -> None:
    actuator = NginxRateLimiter(nginx.gateway)
    workers = serving_children(nginx.pid)
    broken = RateLimit(zone="detector_ml_llm", rate_per_s=1, zone_size="1k")  # "too small"

    result = actuator.apply(actuator.plan(broken), dry_run=False)

    assert result.status is Status.FAILED
    assert result.reason == "config_invalid"
    assert "too small" in (result.error or "")
    assert result.restored
    assert "never activated" in (result.error or "")
    assert nginx.gateway.http_include.read_text() == ""
    assert nginx.gateway.location_include.read_text() == ""
    assert serving_children(nginx.pid) == workers
    assert burst(nginx.port)[0] == Counter({200: BURST_N})


def test_stopped_nginx_fails_before_writing(nginx: RunningNginx) -> None:
    os.kill(nginx.pid, signal.SIGQUIT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while nginx.gateway.pid_file and nginx.gateway.pid_file.exists():
        assert time.monotonic() < deadline, "nginx did not stop"
        time.sleep(0.05)
    actuator = NginxRateLimiter(nginx.gateway)

    result = actuator.apply(actuator.plan(RateLimit("detector_ml_llm", 1)), dry_run=False)

    assert (result.status, result.reason, result.restored) == (Status.FAILED, "not_running", True)
    assert nginx.gateway.http_include.read_text() == ""


def test_reload_nginx_rejects_is_caught_and_the_files_restored(nginx: RunningNginx) -> None:
    """A config ``nginx -t`` accepts but the master cannot load: here, a listen on a busy port.

    ``nginx -t`` does not bind; the master does, fails, and keeps its old configuration
    (https://nginx.org/en/docs/control.html). The actuator sees no new worker, writes its
    files back, and reloads again; that reload fails the same way, so the result says the
    previous state is NOT confirmed restored, while the old configuration keeps serving.
    """
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        conf = nginx.gateway.conf_path
        listen = f"http {{\n    server {{ listen 127.0.0.1:{busy.getsockname()[1]}; }}"
        conf.write_text(conf.read_text().replace("http {", listen, 1))
        gateway = replace(nginx.gateway, reload_confirm_s=2.0)
        actuator = NginxRateLimiter(gateway)

        result = actuator.apply(actuator.plan(RateLimit("detector_ml_llm", 1)), dry_run=False)

        assert (result.status, result.reason) == (Status.FAILED, "reload_failed")
        assert "workers from before the reload" in (result.error or "")
        assert "restoring the previous state failed too" in (result.error or "")
        assert not result.restored
        assert "previous state NOT restored" in result.message()
        assert gateway.http_include.read_text() == ""
        assert gateway.location_include.read_text() == ""
        assert burst(nginx.port)[0] == Counter({200: BURST_N})


def post(port: int, size: int) -> int:
    """POST a JSON body of ``size`` bytes; return the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        body = b'{"prompt": "' + b"x" * max(0, size - 14) + b'"}'
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_the_quarantine_refuses_the_class_with_413_and_is_lifted(nginx: RunningNginx) -> None:
    assert (post(nginx.port, 48_000), post(nginx.port, 2_000)) == (200, 200)
    actuator = NginxAdmission(nginx.gateway)
    step_plan = actuator.plan(AdmissionRule(40_000))  # 39k: a 12k-token prompt is over it
    assert "+client_max_body_size 39k;" in step_plan.diff
    assert actuator.apply(step_plan, dry_run=False).status is Status.OK
    assert (post(nginx.port, 48_000), post(nginx.port, 2_000)) == (413, 200)
    assert burst(nginx.port)[0] == Counter({200: BURST_N})  # the rest flows as before
    assert actuator.revert(step_plan, dry_run=False).status is Status.OK
    assert post(nginx.port, 48_000) == 200
