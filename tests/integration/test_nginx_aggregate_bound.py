"""The 429 step bounds the aggregate load through a real nginx, for many clients at once.

nginx is started by the fixture of test_nginx_actuator.py (Debian package ``nginx``) on free
loopback ports. The incident: two of four pods died; before, 40 clients each sent one
request every 2 s, spread over the 2 s (20 ok/s in all). The healthy capacity left is
20 x 2 serving / 4 seen = 10/s: the aggregate budget.

Each simulated client has its own source address (127.0.0.2, .3, ...: on Linux all of
127.0.0.0/8 is loopback), so a per-client limiter sees 40 clients, as ingress-nginx would, and
each sends at the per-client rate the plan saw. Counts only, no timing threshold: the elapsed
time is measured and used to compute the bound (leaky bucket with ``nodelay``: at most
1 + burst + floor(rate x elapsed) answers that are not 429, see test_nginx_actuator.py).
"""

from __future__ import annotations

import http.client
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from small_cascade import T0, signal
from test_nginx_actuator import RunningNginx, nginx  # the nginx fixture of the actuator tests

from detector.actuators.base import Status
from detector.actuators.nginx.config import RateLimit
from detector.actuators.nginx.limiter import NginxRateLimiter
from detector.correlate.context import IncidentContext
from detector.events.model import SignalKind
from detector.runbooks.bindings.nginx import rate_limit_from_step
from detector.runbooks.definition import Action
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import PlannedStep, plan

__all__ = ["nginx"]  # a fixture, used by name
CLIENTS = 40
PERIOD_S = 2.0  # each client's interval before the incident: 0.5 requests/s
REQUESTS_PER_CLIENT = 3


def _address(i: int) -> str:
    return f"127.0.0.{i + 2}"


def context() -> IncidentContext:
    """40 clients at 0.5/s each through one controller, in the 60 s before the last victim."""
    controller = "ingress-nginx-controller-7d9f-x2kq4"  # the pod that logged the lines
    lines = [
        signal(
            SignalKind.LB_RESPONSE,
            -30 + k * PERIOD_S + i * PERIOD_S / CLIENTS,
            controller,
            status=200,
            upstream="ml-llm-8000",
            client=_address(i),  # $remote_addr, as the access line logs it
        )
        for i in range(CLIENTS)
        for k in range(30)
    ]
    config = signal(
        SignalKind.ENGINE_CONFIG,
        -600,
        "llm-a",
        engine="vllm",
        max_num_seqs=256,
        max_model_len=32_768,
        kv_cache_tokens=434_560,
    )
    ooms = (signal(SignalKind.GPU_OOM, 0, "llm-a"), signal(SignalKind.GPU_OOM, 30, "llm-b"))
    return IncidentContext(
        key="prod/ml/llm",
        namespace="ml",
        workload="llm",
        workload_kind="Deployment",
        stage="cascading",
        opened_at=T0,
        victims=("llm-a", "llm-b"),
        pods_seen=("llm-a", "llm-b", "llm-c", "llm-d"),
        signals=tuple(sorted((*lines, config, *ooms), key=lambda s: s.time)),
    )


def rate_step() -> PlannedStep:
    steps = plan(load_runbook(default_runbook_path()), context(), dry_run=False)
    return next(s for s in steps if s.action is Action.ENABLE_RATE_LIMIT)


def run_clients(port: int, interval_s: float) -> tuple[Counter[int], float]:
    """Run every client at once, each sending every ``interval_s`` from its own offset (as
    before the incident: spread over the interval); return the statuses and the seconds."""

    def one(i: int) -> Counter[int]:
        counts: Counter[int] = Counter()
        time.sleep(i * interval_s / CLIENTS)
        for k in range(REQUESTS_PER_CLIENT):
            if k:
                time.sleep(interval_s)
            conn = http.client.HTTPConnection(
                "127.0.0.1", port, timeout=10, source_address=(_address(i), 0)
            )
            try:
                conn.request("POST", "/v1/chat/completions", body=b"{}")
                response = conn.getresponse()
                response.read()
                counts[response.status] += 1
            finally:
                conn.close()
        return counts

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        results = list(pool.map(one, range(CLIENTS)))
    elapsed = time.monotonic() - start
    return sum(results, Counter()), elapsed


def test_the_plan_sizes_the_aggregate_and_states_the_per_client_bound() -> None:
    p = rate_step().params
    assert p["aggregate_budget_rps"] == "10.0"  # 20 ok/s x 2 serving / 4 seen
    assert p["aggregate_limit_rpm"] == "600"
    assert p["aggregate_connections"] == "26"  # 2 serving x max_num_seqs 13
    assert (p["clients_seen"], p["client_max_rate_per_s"], p["gateway_replicas_seen"]) == (
        "40",
        "0.5",
        "1",
    )
    assert (p["limit_rps"], p["limit_connections"]) == ("1", "1")  # floors: 10/s / 40 < 1
    assert (p["aggregate_bound_rps"], p["aggregate_bound_connections"]) == ("40", "40")
    basis = p["basis"]
    assert "at most 40 clients x 1 r/s = 40/s against a budget of 10/s" in basis
    assert "over the budget" in basis and "sheds none of the load seen" in basis


def test_aggregate_limit_keeps_many_clients_within_the_budget(nginx: RunningNginx) -> None:
    step = rate_step()
    limit = rate_limit_from_step(step)
    budget = float(step.params["aggregate_budget_rps"])
    assert limit.key == "global" and limit.requests_per_s == budget  # one bucket for all
    actuator = NginxRateLimiter(nginx.gateway)
    applied = actuator.apply(actuator.plan(limit), dry_run=False)
    assert applied.status is Status.OK, applied.message()

    observed = float(step.params["client_max_rate_per_s"])
    counts, elapsed_s = run_clients(nginx.port, 1 / observed)
    ok = counts[200]
    allowed = 1 + limit.burst + math.floor(budget * elapsed_s)
    print(f"aggregate: {dict(counts)} in {elapsed_s:.3f} s; 2xx allowed {allowed}")
    assert set(counts) <= {200, 429}, counts
    assert counts.total() == CLIENTS * REQUESTS_PER_CLIENT
    assert 1 <= ok <= allowed, (counts, elapsed_s)  # within the budget, plus the free first


def test_a_per_client_limit_lets_through_what_its_plan_says(nginx: RunningNginx) -> None:
    """ingress-nginx's way (one bucket per client IP) at the planned per-client rate."""
    step = rate_step()
    per_client = int(step.params["limit_rps"])
    limit = RateLimit(
        zone="detector_ml_llm", rate_per_s=per_client, key="$binary_remote_addr"
    )  # what limit-rps does inside ingress-nginx
    actuator = NginxRateLimiter(nginx.gateway)
    assert actuator.apply(actuator.plan(limit), dry_run=False).status is Status.OK

    observed = float(step.params["client_max_rate_per_s"])
    assert observed < per_client  # each client stays under its own limit...
    counts, elapsed_s = run_clients(nginx.port, 1 / observed)
    print(f"per client: {dict(counts)} in {elapsed_s:.3f} s")
    assert counts == Counter({200: CLIENTS * REQUESTS_PER_CLIENT})  # ...so none is shed
    bound = int(step.params["aggregate_bound_rps"])
    assert counts[200] <= CLIENTS * (1 + limit.burst) + math.floor(bound * elapsed_s)
