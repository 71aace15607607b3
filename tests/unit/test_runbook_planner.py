"""Planning is pure and table-driven: an IncidentContext in, rendered steps and their basis out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from detector.correlate.context import IncidentContext
from detector.events.model import Signal, SignalKind, SourcePos
from detector.runbooks.definition import Action, Floors, Runbook
from detector.runbooks.loader import default_runbook_path, load_runbook
from detector.runbooks.planner import (
    DEFAULT_SPACING_S,
    build_variables,
    last_victim_time,
    memory_headroom,
    observed_load_s,
    plan,
    restart_plan,
    traffic_before,
)

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
K = SignalKind


def sig(kind: SignalKind, dt: float, pod: str | None = None, **attrs: Any) -> Signal:
    return Signal(
        kind=kind,
        time=T0 + dt,
        source=SourcePos("recorded/ml.log", int(dt) + 1),
        namespace="ml",
        pod=pod,
        attrs=attrs,
    )


def lb(dt: float, status: Any, count: int | None = None, upstream: str = "ml-llm-80") -> Signal:
    attrs: dict[str, Any] = {"status": status, "upstream": upstream}
    if count is not None:
        attrs["count"] = count
    return sig(K.LB_RESPONSE, dt, **attrs)


def incident(
    *signals: Signal, victims: tuple[str, ...] = ("llm-a", "llm-b"), **kw: Any
) -> IncidentContext:
    fields: dict[str, Any] = {
        "key": "prod/ml/llm",
        "namespace": "ml",
        "workload": "llm",
        "workload_kind": "Deployment",
        "stage": "cascading",
        "opened_at": T0,
        "victims": victims,
        "pods_seen": ("llm-a", "llm-b", "llm-c", "llm-d"),
        "signals": tuple(sorted(signals, key=lambda s: s.time)),
    }
    fields.update(kw)
    return IncidentContext(**fields)


VLLM_CONFIG = sig(
    K.ENGINE_CONFIG,
    -600,
    "llm-a",
    engine="vllm",
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=32_768,
    kv_cache_tokens=434_560,
    model_load_s=95.2,
)
OOMS = (sig(K.GPU_OOM, 0, "llm-a"), sig(K.GPU_OOM, 30, "llm-b"), sig(K.GPU_OOM, 31, "llm-b"))
# 60 s before the last victim's first OOM (t=30): 100 lines x 3 ok + 20 x 502 + 10 x 429.
TRAFFIC = (
    *(lb(-29 + i * 0.5, 200, count=3) for i in range(100)),
    *(lb(25, "502") for _ in range(20)),
    *(lb(26, 429) for _ in range(10)),
    lb(-31, 200, count=1000),  # outside the window
    lb(31, 503, count=1000),  # after the last victim
)


@pytest.fixture(scope="module")
def runbook() -> Runbook:
    return load_runbook(default_runbook_path())


# name, context, expected variables (subset), expected rendered params (step_id -> subset)
CASES: list[tuple[str, IncidentContext, dict[str, Any], dict[str, dict[str, str]]]] = [
    (
        "vllm with full evidence",
        incident(VLLM_CONFIG, *OOMS, *TRAFFIC),
        {
            "engine": "vllm",
            "victim_count": 2,
            "replicas_seen": 4,
            "healthy_replicas": 2,
            "proposed": {"max_num_seqs": 13, "max_num_batched_tokens": 4096},
            "request_count": 330,
            "ok_rate_per_s": 5.0,
            "error_rate_per_s": 0.333,
            "rate_limited_per_s": 0.167,
            "rate_limit_rps": 2,  # floor(5.0 x 2 / 4)
            "limit_connections": 26,  # 2 healthy x 13
            "upstream": "ml-llm-80",
            "restart_order": ["llm-a", "llm-b"],
            "spacing_s": 96.0,
            "model_load_s": 95.2,
        },
        {
            "lower_batch_ceiling": {
                "set_via": "args",
                "settings": "--max-num-seqs=13 --max-num-batched-tokens=4096 --max-model-len=32768",
                "current_ceiling": "256",
                "new_ceiling": "13",
                "ceiling_is_default": "no",
            },
            "enable_rate_limit": {
                "ingress": "llm",
                "upstream": "ml-llm-80",
                "limit_rps": "2",
                "limit_connections": "26",
                "annotations": '{"nginx.ingress.kubernetes.io/limit-connections": "26", '
                '"nginx.ingress.kubernetes.io/limit-rps": "2"}',
                "healthy_replicas": "2 of 4 pods seen (not dead of GPU OOM when planned)",
            },
            "stagger_restarts": {"pods": '["llm-a", "llm-b"]', "spacing_s": "96"},
        },
    ),
    (
        "nothing but the OOMs: documented defaults and floors",
        incident(*OOMS),
        {
            "engine": "unknown",
            "proposed": {"max_num_seqs": 128},
            "request_count": 0,
            "rate_limit_rps": 1,
            "upstream": None,
            "spacing_s": DEFAULT_SPACING_S,
            "model_load_s": None,
        },
        {
            "lower_batch_ceiling": {
                "set_via": "manual",
                "settings": "max_num_seqs=128 (engine unknown: set by hand)",
                "current_ceiling": "unknown",
                "ceiling_is_default": "yes",
            },
            "enable_rate_limit": {"upstream": "not seen", "limit_rps": "1"},
            "stagger_restarts": {"spacing_s": "120"},
        },
    ),
    (
        "tgi through env",
        incident(
            sig(
                K.ENGINE_CONFIG,
                -60,
                "llm-c",
                engine="text-generation-inference",
                max_concurrent_requests=128,
                max_batch_total_tokens=120_000,
                max_total_tokens=8192,
                model_load_s=30,
            ),
            *OOMS,
        ),
        {
            "engine": "tgi",
            "proposed": {"max_concurrent_requests": 14, "max_batch_total_tokens": 60_000},
        },
        {
            "lower_batch_ceiling": {
                "set_via": "env",
                "settings": "MAX_CONCURRENT_REQUESTS=14 MAX_BATCH_TOTAL_TOKENS=60000",
            },
            "stagger_restarts": {"spacing_s": "60"},  # 30 s load time, floor 60 s
        },
    ),
    (
        "sglang through args",
        incident(
            sig(K.ENGINE_CONFIG, -60, "llm-c", engine="sglang", max_running_requests=64), *OOMS
        ),
        {"engine": "sglang", "proposed": {"max_running_requests": 32}},
        {"lower_batch_ceiling": {"set_via": "args", "settings": "--max-running-requests=32"}},
    ),
    (
        "every pod is a victim: limits sized for the first replica back",
        incident(VLLM_CONFIG, *OOMS, *TRAFFIC, pods_seen=("llm-a", "llm-b")),
        {"healthy_replicas": 0, "rate_limit_rps": 2, "limit_connections": 13},
        {
            "enable_rate_limit": {
                "limit_rps": "2",
                "limit_connections": "13",
                "healthy_replicas": "0 of 2 pods seen (not dead of GPU OOM when planned)",
            }
        },
    ),
    (
        "a victim missing from pods_seen still counts as seen",
        incident(*OOMS, pods_seen=("llm-c",)),
        {"replicas_seen": 3, "healthy_replicas": 1},
        {},
    ),
]


@pytest.mark.parametrize(
    ("ctx", "variables", "params"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_plan_table(
    runbook: Runbook,
    ctx: IncidentContext,
    variables: dict[str, Any],
    params: dict[str, dict[str, str]],
) -> None:
    built = build_variables(ctx, floors=runbook.floors())
    for key, value in variables.items():
        assert built[key] == value, key
    steps = {p.step_id: p for p in plan(runbook, ctx)}
    for step_id, expected in params.items():
        for key, value in expected.items():
            assert steps[step_id].params[key] == value, (step_id, key)


def test_plan_shape_and_dry_run_status(runbook: Runbook) -> None:
    ctx = incident(VLLM_CONFIG, *OOMS, *TRAFFIC)
    steps = plan(runbook, ctx)
    assert [p.position for p in steps] == [1, 2, 3, 4]
    assert [p.action for p in steps] == [
        Action.QUARANTINE_REQUESTS,
        Action.LOWER_BATCH_CEILING,
        Action.ENABLE_RATE_LIMIT,
        Action.STAGGER_RESTARTS,
    ]
    assert {p.status for p in steps} == {"dry_run"}
    assert [p.approval for p in steps] == ["auto", "auto", "auto", "approver:sre-oncall"]
    assert all(p.basis and p.params and p.verify.checks for p in steps)
    assert "no request a victim held is known" in steps[0].basis  # no sizes: undetermined
    assert "434,560" in steps[1].basis
    assert "serving 2 (healthy 2, at least the first one back) / seen 4" in steps[2].basis
    assert "95.2 s" in steps[3].basis
    assert {p.params["mechanism"] for p in steps} == {"undetermined"}


def test_live_plan_waits_for_approval_where_the_policy_says(runbook: Runbook) -> None:
    steps = plan(runbook, incident(*OOMS), dry_run=False)
    assert [p.status for p in steps] == ["planned", "planned", "planned", "awaiting_approval"]


def test_plan_is_pure(runbook: Runbook) -> None:
    ctx = incident(VLLM_CONFIG, *OOMS, *TRAFFIC)
    before = repr(ctx)
    assert plan(runbook, ctx) == plan(runbook, ctx)
    assert repr(ctx) == before


def test_hostile_pod_name_is_rendered_as_data(runbook: Runbook) -> None:
    evil = "llm-{{ 7 * 7 }}"
    ctx = incident(sig(K.GPU_OOM, 0, evil), victims=(evil,), pods_seen=(evil, "llm-b"))
    steps = {p.step_id: p for p in plan(runbook, ctx)}
    assert steps["stagger_restarts"].params["pods"] == '["llm-{{ 7 * 7 }}"]'


@pytest.mark.parametrize(
    ("signals", "victims", "expected"),
    [
        (
            (sig(K.GPU_OOM, 0, "a"), sig(K.GPU_OOM, 10, "b"), sig(K.GPU_OOM, 20, "b")),
            ("a", "b"),
            10,
        ),
        ((sig(K.GPU_OOM, 0, "a"), sig(K.GPU_OOM, 10, "b")), ("c",), 10),
        ((sig(K.LB_RESPONSE, 7),), (), 7),
        ((), (), 0),
    ],
)
def test_last_victim_time(
    signals: tuple[Signal, ...], victims: tuple[str, ...], expected: float
) -> None:
    ctx = incident(*signals, victims=victims)
    assert last_victim_time(ctx) == T0 + expected


def test_traffic_window_counts() -> None:
    traffic = traffic_before(tuple(TRAFFIC), T0 + 30, 60.0)
    assert (traffic.requests, traffic.ok, traffic.errors_5xx, traffic.rate_limited) == (
        330,
        300,
        20,
        10,
    )
    assert traffic.rate(traffic.ok) == 5.0


def test_floors_from_the_runbook_apply() -> None:
    ctx = incident(VLLM_CONFIG, *OOMS, *TRAFFIC)
    built = build_variables(ctx, floors=Floors(batch_ceiling=20, rate_limit_rps=50, spacing_s=300))
    assert built["proposed"]["max_num_seqs"] == 20
    assert built["rate_limit_rps"] == 50
    assert built["spacing_s"] == 300


def test_latest_engine_config_wins() -> None:
    newer = replace(VLLM_CONFIG, time=T0 - 10, attrs={"max_num_seqs": 64})
    built = build_variables(incident(VLLM_CONFIG, newer, *OOMS))
    assert built["current"]["max_num_seqs"] == 64
    assert built["ceiling"]["current"] == 64
    assert built["current"]["engine"] == "vllm"


def kv(dt: float, pod: str, usage: float) -> Signal:
    return sig(K.ENGINE_PRESSURE, dt, pod, engine="vllm", kv_cache_usage=usage)


def vram(dt: float, pod: str, used_gib: float, **attrs: Any) -> Signal:
    return sig(
        K.GPU_MEMORY, dt, pod, used_bytes=int(used_gib * 2**30), total_bytes=80 * 2**30, **attrs
    )


def oom(dt: float, pod: str, free_gib: float) -> Signal:
    return sig(K.GPU_OOM, dt, pod, free_bytes=int(free_gib * 2**30), capacity_bytes=80 * 2**30)


@pytest.mark.parametrize(
    ("signals", "victims", "crashed", "healthy"),
    [
        # crashed pods in the order they died, whatever memory they had before
        ((), ("a", "b", "c"), ["a", "b", "c"], []),
        ((oom(0, "a", 1), oom(5, "b", 8), oom(9, "c", 4)), ("a", "b", "c"), ["a", "b", "c"], []),
        # healthy pods at the ceiling: KV-cache usage wins over VRAM (vLLM pre-reserves
        # VRAM), the latest value counts, most headroom first
        (
            (
                vram(0, "a", 10, pressure="GPU memory"),
                sig(K.ENGINE_PRESSURE, 1, "a", kv_cache_usage=0.99, pressure="KV cache"),
                vram(0, "b", 79, pressure="GPU memory"),
                kv(1, "b", 0.5),
                sig(K.ENGINE_PRESSURE, 2, "b", kv_cache_usage=0.7, pressure="KV cache"),
            ),
            ("z",),
            ["z"],
            ["b", "a"],
        ),
        # healthy pods at a ceiling (marked "pressure") come after the crashed ones;
        # healthy pods with headroom are left alone
        (
            (
                sig(K.ENGINE_PRESSURE, 0, "c", kv_cache_usage=0.97, pressure="KV cache"),
                vram(0, "d", 79.5, pressure="GPU memory"),
                kv(0, "e", 0.2),
            ),
            ("a",),
            ["a"],
            ["c", "d"],  # KV cache 97% used leaves more than VRAM 79.5 of 80 GiB
        ),
    ],
)
def test_restart_order(
    signals: tuple[Signal, ...], victims: tuple[str, ...], crashed: list[str], healthy: list[str]
) -> None:
    ctx = incident(*signals, victims=victims, pods_seen=("a", "b", "c", "d", "e"))
    got_crashed, got_healthy, basis = restart_plan(ctx)
    assert (got_crashed, got_healthy) == (crashed, healthy)
    assert f"{len(crashed)} crashed pod(s) first" in basis
    assert build_variables(ctx)["restart_order"] == crashed + healthy


def test_memory_headroom_sources() -> None:
    signals = (vram(0, "a", 60), oom(1, "b", 2), sig(K.GPU_MEMORY, 2, "c", used_bytes=1))
    assert memory_headroom(signals, "a") == 0.25
    assert memory_headroom(signals, "b") == 0.025
    assert memory_headroom(signals, "c") is None  # no total: unknown
    assert memory_headroom(signals, "zzz") is None


def cfg(dt: float, pod: str, **attrs: Any) -> Signal:
    return sig(K.ENGINE_CONFIG, dt, pod, engine="vllm", **attrs)


@pytest.mark.parametrize(
    ("signals", "load", "fragment"),
    [
        ((), None, ""),
        (
            (cfg(0, "a", model_load_s=40.0), cfg(0, "b", model_load_s=95.2)),
            95.2,
            "seen in the logs",
        ),
        # args line -> KV-cache line of the same pod: the load time measured
        (
            (
                cfg(0, "a", max_num_seqs=256),
                cfg(33.0, "a", kv_cache_tokens=1000),
                cfg(1, "b", max_model_len=4096),
                cfg(21.5, "b", max_concurrency=3.1),
            ),
            33.0,
            "measured in pod a's startup lines",
        ),
        # a KV line of another pod, or one with no start before it, measures nothing
        ((cfg(0, "a", max_num_seqs=1), cfg(30, "b", kv_cache_bytes=1)), None, ""),
        # a start that never reached its KV cache in MAX_LOAD_S is not a load
        ((cfg(0, "a", max_num_seqs=1), cfg(4000, "a", gpu_blocks=10)), None, ""),
        # a config dumped at a crash starts no load: the restart's own start does
        (
            (
                cfg(100, "a", max_num_seqs=256),
                sig(K.GPU_OOM, 100, "a"),
                cfg(240, "a", max_num_seqs=256),
                cfg(273, "a", kv_cache_tokens=1000),
            ),
            33.0,
            "engine arguments at",
        ),
        (
            (cfg(100, "a", max_num_seqs=1), sig(K.GPU_OOM, 101, "a"), cfg(200, "a", gpu_blocks=1)),
            None,
            "",
        ),
    ],
)
def test_observed_load_time(signals: tuple[Signal, ...], load: float | None, fragment: str) -> None:
    got, basis = observed_load_s(signals)
    assert got == load
    assert fragment in basis


def test_spacing_follows_the_measured_load_time(runbook: Runbook) -> None:
    slow = (cfg(-700, "llm-a", max_num_seqs=256), cfg(-600, "llm-a", kv_cache_tokens=10_000))
    steps = {p.step_id: p for p in plan(runbook, incident(*slow, *OOMS))}
    assert steps["stagger_restarts"].params["spacing_s"] == "100"
    assert "measured in pod llm-a" in steps["stagger_restarts"].basis


def test_planned_steps_carry_policy_expiry_and_lift(runbook: Runbook) -> None:
    steps = {p.step_id: p for p in plan(runbook, incident(*OOMS))}
    assert [s.policy for s in steps.values()] == ["auto", "auto", "auto", "approval"]
    assert steps["stagger_restarts"].approval_expiry_s == 600
    assert steps["enable_rate_limit"].lift is not None
    restart = steps["stagger_restarts"].params
    assert (restart["max_unavailable"], restart["max_restarting"]) == ("1", "1")
    assert "Ready" in restart["traffic"]


# The 429 step's sizing: an aggregate budget, per-client limits and what they bound ----------

CONTROLLER = "ingress-nginx-controller-5c8d-abcde"


def client_lines(
    clients: int, per_client: int, *, controllers: tuple[str, ...] = (CONTROLLER,)
) -> list[Signal]:
    """``per_client`` ok lines from each of ``clients`` addresses, evenly over the 60 s window."""
    step = 60.0 / per_client
    return [
        sig(
            K.LB_RESPONSE,
            -30 + k * step + i * step / clients,
            controllers[i % len(controllers)],
            status=200,
            upstream="ml-llm-80",
            client=f"198.51.100.{i}",
        )
        for i in range(clients)
        for k in range(per_client)
    ]


SIZING: list[tuple[str, tuple[Signal, ...], dict[str, Any], tuple[str, ...]]] = [
    (
        "many clients: the per-client floor lets through far more than the budget",
        (VLLM_CONFIG, *OOMS, *client_lines(40, 30)),  # 40 x 0.5/s = 20 ok/s
        {
            "aggregate_budget_rps": 10.0,  # 20 x 2 serving / 4 seen
            "queue_burst": 100,  # 10 s of the budget wait at the gateway, not refused
            "aggregate_limit_rpm": 600,
            "aggregate_connections": 26,  # 2 serving x 13
            "rate_limit_rps": 1,  # max(floor 1, 10 / 40)
            "limit_connections": 1,  # max(floor 1, 26 / 40)
            "aggregate_bound_rps": 40,
            "aggregate_bound_connections": 40,
            "clients_seen": 40,
            "client_max_rate_per_s": 0.5,
            "gateway_replicas_seen": 1,
        },
        (
            "40 clients seen in 60 s (the busiest sent 30 = 0.5/s), 1 controller replica(s) seen",
            "at most 40 clients x 1 r/s = 40/s against a budget of 10/s",
            "40 clients x 1 = 40 connections against 26: over the budget",
            "no client seen sent more than 0.5/s, so limit-rps sheds none of the load seen",
            "a full bound needs an aggregate limiter",
        ),
    ),
    (
        "one client: the per-client limit is the aggregate one",
        (VLLM_CONFIG, *OOMS, *client_lines(1, 300)),  # 5 ok/s from one address
        {
            "aggregate_budget_rps": 2.5,
            "aggregate_limit_rpm": 150,
            "rate_limit_rps": 2,
            "limit_connections": 26,
            "aggregate_bound_rps": 2,
            "aggregate_bound_connections": 26,
            "clients_seen": 1,
        },
        (
            "at most 1 client x 2 r/s = 2/s against a budget of 2.5/s",
            "within the budget for the clients seen",
            "clients over 2 r/s (the busiest sent 5/s) are cut to it",
        ),
    ),
    (
        "unknown clients: sized as one, and said so",
        (VLLM_CONFIG, *OOMS, *TRAFFIC),
        {
            "aggregate_budget_rps": 2.5,
            "rate_limit_rps": 2,
            "limit_connections": 26,
            "aggregate_bound_rps": 2,
            "clients_seen": None,
            "client_max_rate_per_s": None,
            "gateway_replicas_seen": 0,
        },
        (
            "the access lines name no client address (sized as if one client sent it all), "
            "controller replicas not seen (taken as 1)",
            "within the budget only if one client sends it all; a full bound needs",
        ),
    ),
    (
        "two controller replicas: each counts a client alone",
        (VLLM_CONFIG, *OOMS, *client_lines(4, 15, controllers=(CONTROLLER, CONTROLLER + "2"))),
        {"aggregate_budget_rps": 0.5, "rate_limit_rps": 1, "aggregate_bound_rps": 8},
        ("at most 4 clients x 2 controller replicas x 1 r/s = 8/s against a budget of 0.5/s",),
    ),
    (
        "no load-balancer lines: the budget is unknown, the step not sized",
        (VLLM_CONFIG, *OOMS),
        {"aggregate_budget_rps": None, "queue_burst": 0},
        (
            "unknown - it lacks the request rate before the last victim: no load-balancer line "
            "of the workload in the 60 s before it",
            "not sized, so the step does not act, and no floor stands in for the budget",
        ),
    ),
]


@pytest.mark.parametrize(
    ("signals", "variables", "phrases"), [c[1:] for c in SIZING], ids=[c[0] for c in SIZING]
)
def test_rate_limit_sizing(
    runbook: Runbook,
    signals: tuple[Signal, ...],
    variables: dict[str, Any],
    phrases: tuple[str, ...],
) -> None:
    ctx = incident(*signals)
    built = build_variables(ctx, floors=runbook.floors())
    for key, value in variables.items():
        assert built[key] == value, key
    step = next(p for p in plan(runbook, ctx) if p.action is Action.ENABLE_RATE_LIMIT)
    for phrase in phrases:
        assert phrase in step.basis, phrase
    assert step.basis.startswith("aggregate budget (the healthy capacity left)")
    params = step.params
    assert params["aggregate_limit_rpm"] == str(built["aggregate_limit_rpm"])
    assert params["limit_rps"] == params["per_client_rps"] == str(built["rate_limit_rps"])
    assert params["aggregate_bound_rps"] == str(built["aggregate_bound_rps"])
    budget = built["aggregate_budget_rps"]
    assert params["aggregate_budget_rps"] == (str(budget) if budget is not None else "unknown")
    # a plan with no budget says what it lacks; a sized one lacks nothing
    assert (step.lacks is None) == (budget is not None) == (params["lacks"] == "nothing")
    assert step.lacks is None or "request rate before the last victim" in step.lacks


def test_the_per_client_figure_is_never_the_containment_figure(runbook: Runbook) -> None:
    step = next(
        p
        for p in plan(runbook, incident(VLLM_CONFIG, *OOMS, *client_lines(40, 30)))
        if p.action is Action.ENABLE_RATE_LIMIT
    )
    p = step.params
    assert p["aggregate_budget_rps"] == "10.0" and p["aggregate_limit_rpm"] == "600"
    assert p["limit_rps"] == "1" and p["aggregate_bound_rps"] == "40"
    assert "an aggregate limiter enforces it: 600/min = 10/s and 26 connections" in step.basis
    assert p["annotations"] == (
        '{"nginx.ingress.kubernetes.io/limit-connections": "1", '
        '"nginx.ingress.kubernetes.io/limit-rps": "1"}'
    )


def test_a_window_summary_carries_the_client_distribution() -> None:
    summary = sig(
        K.LB_RESPONSE,
        20,
        status=503,
        baseline_ok_rate_per_s=8.0,
        error_rate_per_s=4.0,
        throttled_rate_per_s=0.0,
        clients=120,
        client_max_requests=9,
        clients_span_s=27.5,
        proxies=3,
        clients_capped=False,
    )
    traffic = traffic_before((summary,), T0 + 30, 60.0)
    assert (traffic.clients, traffic.client_max_requests, traffic.proxies) == (120, 9, 3)
    assert traffic.client_max_rate_per_s == round(9 / 27.5, 3)
    built = build_variables(incident(*OOMS, summary))
    assert built["aggregate_budget_rps"] == 4.0  # 8 ok/s x 2 / 4
    assert (built["rate_limit_rps"], built["aggregate_bound_rps"]) == (1, 360)  # 120 x 3


def test_capped_clients_are_a_lower_bound() -> None:
    summary = sig(
        K.LB_RESPONSE,
        20,
        status=200,
        baseline_ok_rate_per_s=100.0,
        clients=60_000,
        client_max_requests=2,
        clients_span_s=30.0,
        clients_capped=True,
    )
    built = build_variables(incident(*OOMS, summary))
    assert "at least 60000 clients seen" in built["rate_limit_basis"]
    assert "let through at least 60000 clients x 1 r/s" in built["rate_limit_basis"]


@pytest.mark.parametrize(
    ("gateway", "says", "never"),
    [
        ("nginx", "the configured gateway, nginx, enforces it for all clients", "per client IP"),
        ("kong", "the configured gateway, kong, enforces it", "per client IP"),
        ("ingress-nginx", "ingress-nginx counts per client IP", "no gateway configured"),
        (None, "no gateway configured (a dry-run plan): if it is ingress-nginx", "enforces it for"),
    ],
)
def test_the_429_plan_speaks_of_the_configured_gateway(
    runbook: Runbook, gateway: str | None, says: str, never: str
) -> None:
    ctx = incident(*OOMS, *TRAFFIC)  # a sized step: with no traffic it is not sized at all
    step = {p.step_id: p for p in plan(runbook, ctx, gateway=gateway)}["enable_rate_limit"]
    assert says in step.params["basis"] and never not in step.params["basis"]
    ingress = gateway in (None, "ingress-nginx")
    assert step.params["annotations"].startswith("{") == ingress
    assert step.params["gateway"] == (gateway or "not configured (dry-run plan)")
