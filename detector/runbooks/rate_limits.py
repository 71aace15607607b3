"""Size the gateway's 429 step from the traffic before the cascade: an aggregate bound. Pure.

The goal is a bound on the total load that reaches the surviving pods: the request rate and
the concurrency stay within their healthy capacity, the **aggregate budget**:

- rate: the ok (2xx/3xx) rate before the last victim x serving replicas / replicas seen;
- concurrency: serving replicas x the engine's (lowered) concurrency ceiling (``max_num_seqs``).

Gateways that limit in aggregate enforce the budget itself (``aggregate_limit_rpm``, in requests
per minute so that a budget under 1/s is kept exactly): plain nginx ``limit_req`` on one key per
workload, Kong ``rate-limiting`` with ``limit_by: service``, an Envoy local rate limit or an
Envoy Gateway ``BackendTrafficPolicy`` (both per proxy instance: the bindings divide by the
replicas). ingress-nginx's ``limit-rps`` / ``limit-connections`` annotations count **per client
IP and controller replica**: they are sized from the clients seen in the access lines (budget /
(clients x controller replicas), never under the runbook's floors), and the plan states the
aggregate that setting actually bounds for those clients (``aggregate_bound_rps``), which is
more than the budget whenever the floor of 1 per client is what it gets.
With no load-balancer line of the workload before the last victim the budget is unknown: the
step is not sized (``lacks`` says what it needs), and no floor stands in for the budget; the
step machine does not act on such a plan (``detector.runbooks.transitions``).
Sources: https://nginx.org/en/docs/http/ngx_http_limit_req_module.html ,
https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/annotations/#rate-limiting
, https://gateway.envoyproxy.io/docs/tasks/traffic/local-rate-limit/ ,
https://docs.konghq.com/hub/kong-inc/rate-limiting/ .
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from detector.capacity.numbers import coerce_float, coerce_int
from detector.capacity.sizing import CeilingProposal, connection_limit
from detector.events.model import Signal, SignalKind

AGGREGATE_GATEWAYS = frozenset({"nginx", "kong", "envoy", "envoy-gateway"})
AGGREGATE_LIMITERS = (
    "an aggregate limiter (plain nginx limit_req on one key per workload, Kong limit_by "
    "service, an Envoy Gateway BackendTrafficPolicy or Envoy local rate limit divided by its "
    "replicas, or a global rate limit service)"
)


@dataclass(frozen=True, slots=True)
class Traffic:
    """Load-balancer counts over a window before the last victim, and the rates they give.

    ``clients``: distinct client addresses the lines named (None: no line named one);
    ``client_max_requests``: the most requests of one client over ``clients_span_s``;
    ``proxies``: distinct proxy instances (pods) that logged the lines (0: not known);
    ``clients_capped``: more clients than the correlator names per window (at least).
    """

    window_s: float
    requests: int
    ok: int  # 2xx and 3xx
    errors_5xx: int
    rate_limited: int  # 429
    clients: int | None = None
    client_max_requests: int = 0
    clients_span_s: float = 0.0
    proxies: int = 0
    clients_capped: bool = False

    def rate(self, count: int) -> float:
        """Return ``count`` per second over the window, rounded to 3 decimals."""
        return round(count / self.window_s, 3)

    @property
    def client_max_rate_per_s(self) -> float | None:
        """Return the busiest client's requests per second, None when no client was named."""
        if self.clients is None or self.clients_span_s <= 0:
            return None
        return round(self.client_max_requests / self.clients_span_s, 3)


def traffic_before(signals: tuple[Signal, ...], end: float, window_s: float) -> Traffic:
    """Count LB_RESPONSE lines (attrs status, count, client) in [end - window_s, end].

    A correlator window summary (attrs ``baseline_ok_rate_per_s``, ``request_rate_per_s``,
    ``error_rate_per_s``, ``throttled_rate_per_s``, and the client distribution ``clients``,
    ``client_max_requests``, ``clients_span_s``, ``proxies``) stands for the traffic of its
    window; the latest one at or before ``end`` wins over individual lines.
    """
    summaries = [
        s
        for s in signals
        if s.kind is SignalKind.LB_RESPONSE and "baseline_ok_rate_per_s" in s.attrs
    ]
    if summaries:
        before = [s for s in summaries if s.time <= end] or summaries[:1]
        return _traffic_from_summary(before[-1], window_s)
    requests = ok = errors = limited = 0
    clients: Counter[str] = Counter()
    proxies: set[str] = set()
    for sig in signals:
        if sig.kind is not SignalKind.LB_RESPONSE or not end - window_s <= sig.time <= end:
            continue
        count = coerce_int(sig.attrs.get("count"))
        count = count if count is not None and count > 0 else 1
        status = coerce_int(sig.attrs.get("status")) or 0
        requests += count
        if 200 <= status < 400:
            ok += count
        elif 500 <= status < 600:
            errors += count
        elif status == 429:
            limited += count
        client = sig.attrs.get("client")
        if isinstance(client, str) and client:
            clients[client] += count
        if sig.pod and not sig.attrs.get("sidecar"):
            proxies.add(sig.pod)
    return Traffic(
        window_s,
        requests,
        ok,
        errors,
        limited,
        clients=len(clients) or None,
        client_max_requests=max(clients.values(), default=0),
        clients_span_s=window_s,
        proxies=len(proxies),
    )


def _traffic_from_summary(sig: Signal, window_s: float) -> Traffic:
    """Turn a window summary's rates (per second) into counts over ``window_s``."""
    a = sig.attrs

    def count(key: str) -> int:
        return round((coerce_float(a.get(key)) or 0.0) * window_s)

    ok = count("baseline_ok_rate_per_s")
    errors, limited = count("error_rate_per_s"), count("throttled_rate_per_s")
    clients = coerce_int(a.get("clients"))
    return Traffic(
        window_s,
        ok + errors + limited,
        ok,
        errors,
        limited,
        clients=clients if clients else None,
        client_max_requests=coerce_int(a.get("client_max_requests")) or 0,
        clients_span_s=coerce_float(a.get("clients_span_s")) or 0.0,
        proxies=coerce_int(a.get("proxies")) or 0,
        clients_capped=a.get("clients_capped") is True,
    )


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """The sized 429 step: the aggregate budget and the per-client limits with their reach.

    ``budget_rps``: the healthy request capacity left (None: no load-balancer lines);
    ``aggregate_rpm``: what an aggregate limiter enforces (requests per minute, >= 1);
    ``aggregate_connections``: the concurrency budget; ``per_client_rps`` /
    ``per_client_connections``: ingress-nginx's ``limit-rps`` / ``limit-connections`` (per
    client IP and controller replica, floors applied); ``bound_rps`` / ``bound_connections``:
    the aggregate those per-client values allow for the clients and controller replicas seen;
    ``basis``: all of it in words; ``lacks``: what the sizing lacks ("" when sized): with the
    budget unknown the rate values are only the floors, which the step must not apply.
    """

    budget_rps: float | None
    aggregate_rpm: int
    aggregate_connections: int
    per_client_rps: int
    per_client_connections: int
    bound_rps: int
    bound_connections: int
    basis: str
    lacks: str = ""


def gateway_limits(
    traffic: Traffic,
    healthy: int,
    seen: int,
    ceiling: CeilingProposal,
    *,
    rps_floor: int = 1,
    connections_floor: int = 1,
    gateway: str | None = None,
) -> GatewayLimits:
    """Size the 429 step for ``traffic`` with ``healthy`` of ``seen`` replicas serving.

    With every replica down the limits are sized for the first one back. The floors bound the
    per-client values (the ``limit_rps`` / ``limit_connections`` params the step machine checks);
    the aggregate limit is the budget itself, at least 1 request per minute.
    """
    serving = max(healthy, 1)
    connections, _ = connection_limit(
        healthy, ceiling.proposed, param=ceiling.param, floor=connections_floor
    )
    conn_basis = f"serving {serving} x {ceiling.param} {ceiling.proposed} = {connections}"
    if traffic.requests == 0 or seen == 0:
        return _unsized(traffic, connections, conn_basis, rps_floor)
    ok_rate = traffic.ok / traffic.window_s
    budget = round(ok_rate * serving / seen, 3)
    rpm = max(1, math.floor(budget * 60))
    budget_basis = (
        f"ok rate {ok_rate:.3g}/s over {traffic.window_s:g} s before the last victim x "
        f"serving {serving} (healthy {healthy}, at least the first one back) / seen {seen} "
        f"= {budget:g}/s"
    )
    head = (
        f"aggregate budget (the healthy capacity left): {budget_basis}, and concurrency "
        f"{conn_basis}; an aggregate limiter enforces it: {rpm}/min = {rpm / 60:.3g}/s and "
        f"{connections} connections for all clients together (plain nginx limit_req keyed per "
        "workload, Kong limit_by service; Envoy and Envoy Gateway local limits divided by their "
        "replicas)"
    )
    per_client = _per_client(traffic, budget, connections, rps_floor, connections_floor)
    rps, conns, bound_rps, bound_conns, client_basis = per_client
    if gateway in AGGREGATE_GATEWAYS:
        basis = f"{head}; the configured gateway, {gateway}, enforces it for all clients"
    elif gateway is None:
        basis = f"{head}; no gateway configured (a dry-run plan): if it is ingress-nginx, "
        basis += client_basis
    else:
        basis = f"{head}; {client_basis}"
    return GatewayLimits(
        budget_rps=budget,
        aggregate_rpm=rpm,
        aggregate_connections=connections,
        per_client_rps=rps,
        per_client_connections=conns,
        bound_rps=bound_rps,
        bound_connections=bound_conns,
        basis=basis,
    )


def _unsized(traffic: Traffic, connections: int, conn_basis: str, rps_floor: int) -> GatewayLimits:
    """Return the limits of a step whose request budget is unknown: not sized, and saying
    what it lacks. The rate values are the floors, for the record only."""
    lacks = (
        f"the request rate before the last victim: no load-balancer line of the workload in "
        f"the {traffic.window_s:g} s before it (its gateway's access log or 5xx rates, "
        "attributed to it by the upstream's pod IP, a workloads file entry or the upstream "
        "name <namespace>-<service>-<port>)"
    )
    basis = (
        f"aggregate budget (the healthy capacity left): unknown - it lacks {lacks}; not sized, "
        f"so the step does not act, and no floor stands in for the budget (concurrency "
        f"{conn_basis})"
    )
    return GatewayLimits(
        budget_rps=None,
        aggregate_rpm=60 * rps_floor,
        aggregate_connections=connections,
        per_client_rps=rps_floor,
        per_client_connections=connections,
        bound_rps=rps_floor,
        bound_connections=connections,
        basis=basis,
        lacks=lacks,
    )


def _per_client(
    traffic: Traffic,
    rate: float,
    connections: int,
    rps_floor: int,
    connections_floor: int,
) -> tuple[int, int, int, int, str]:
    """Return (per-client rps, connections, bound rps, bound connections, basis) for the
    aggregate budget ``rate`` (requests per second)."""
    keys = (traffic.clients or 1) * max(traffic.proxies, 1)  # buckets that fill at once
    rps = max(rps_floor, math.floor(rate / keys))
    conns = max(connections_floor, connections // keys)
    bound_rps, bound_conns = keys * rps, keys * conns
    within = bound_rps <= rate and bound_conns <= connections
    basis = (
        f"ingress-nginx counts per client IP and controller replica: {_clients_seen(traffic)}; "
        f"limit-rps = max(floor {rps_floor}, {rate:g}/s / {keys}) = {rps} and "
        f"limit-connections = max(floor {connections_floor}, {connections} / {keys}) = {conns} "
        f"per client, which let through {'at least' if traffic.clients_capped else 'at most'} "
        f"{_who(traffic)} x {rps} r/s = {bound_rps}/s against a budget of {rate:g}/s and "
        f"{_who(traffic)} x {conns} = {bound_conns} connections against {connections}: "
        f"{_verdict(traffic, rps, within)}"
    )
    return rps, conns, bound_rps, bound_conns, basis


def _clients_seen(traffic: Traffic) -> str:
    if traffic.clients is None:
        seen = "the access lines name no client address (sized as if one client sent it all)"
    else:
        seen = (
            f"{'at least ' if traffic.clients_capped else ''}{_who(traffic, replicas=False)} "
            f"seen in "
            f"{traffic.clients_span_s:.3g} s (the busiest sent {traffic.client_max_requests} = "
            f"{traffic.client_max_rate_per_s or 0.0:g}/s)"
        )
    if traffic.proxies:
        return f"{seen}, {traffic.proxies} controller replica(s) seen"
    return f"{seen}, controller replicas not seen (taken as 1)"


def _who(traffic: Traffic, *, replicas: bool = True) -> str:
    count = traffic.clients if traffic.clients is not None else 1
    who = f"{count} client{'s' if count != 1 else ''}"
    if replicas and traffic.proxies > 1:
        return f"{who} x {traffic.proxies} controller replicas"
    return who


def _verdict(traffic: Traffic, rps: int, within: bool) -> str:
    if not within:
        verdict = "over the budget"
    elif traffic.clients is None:
        verdict = "within the budget only if one client sends it all"
    else:
        verdict = "within the budget for the clients seen"
    busiest = traffic.client_max_rate_per_s or 0.0
    if traffic.clients is not None and busiest <= rps:
        verdict += (
            f"; no client seen sent more than {busiest:g}/s, so limit-rps sheds none of the "
            "load seen"
        )
    elif traffic.clients is not None:
        verdict += f"; clients over {rps} r/s (the busiest sent {busiest:g}/s) are cut to it"
    if within and traffic.clients is not None:
        return verdict
    return f"{verdict}; a full bound needs {AGGREGATE_LIMITERS}"


@dataclass(frozen=True, slots=True)
class AggregateLimit:
    """The aggregate limit a planned 429 step asks of a gateway that limits in aggregate.

    ``rpm``: requests per minute for all clients together; ``connections``: concurrent
    connections (None when the step does not say); both already relaxed by the lift.
    """

    rpm: int
    connections: int | None


def aggregate_limit(params: Mapping[str, str]) -> AggregateLimit | None:
    """Return the aggregate limit of an ``enable_rate_limit`` step's rendered ``params``.

    ``aggregate_limit_rpm`` / ``aggregate_connections`` as planned, relaxed by the factor the
    lift applied to the per-client values (``limit_rps`` / ``per_client_rps``, and
    ``limit_connections`` / ``per_client_connections``). A step planned before these params
    existed gives its whole ``limit_rps`` x 60 and ``limit_connections``. None when neither is
    usable.
    """
    rpm = coerce_int(params.get("aggregate_limit_rpm"))
    connections = coerce_int(params.get("aggregate_connections"))
    in_force_rps = coerce_float(params.get("limit_rps"))
    in_force_conns = coerce_int(params.get("limit_connections"))
    if rpm is None:  # planned before the aggregate params: limit_rps was the whole rate
        old_rps = coerce_int(params.get("limit_rps"))
        if old_rps is None or old_rps < 1:
            return None
        return AggregateLimit(old_rps * 60, in_force_conns)
    rpm = math.floor(rpm * _relaxed(in_force_rps, params.get("per_client_rps")))
    if connections is not None:
        factor = _relaxed(in_force_conns, params.get("per_client_connections"))
        connections = math.floor(connections * factor)
    return AggregateLimit(max(rpm, 1), connections)


def _relaxed(in_force: float | None, planned: str | None) -> float:
    """Return in-force / planned when both are numbers and the limit was raised, else 1."""
    base = coerce_float(planned)
    if in_force is None or base is None or base <= 0 or in_force <= base:
        return 1.0
    return in_force / base
