"""nginx rate limit: rendering and request checks (pure), and the adapter on a fake nginx."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from small_cascade import rate_step

import detector.actuators.nginx.limiter as nginx_module
from detector.actuators.base import ActuatorError, Change, Plan, Status
from detector.actuators.nginx.config import (
    HEADER,
    AdmissionRule,
    RateLimit,
    render_admission,
    render_http,
    render_location,
    zone_name,
)
from detector.actuators.nginx.limiter import (
    NginxAdmission,
    NginxGateway,
    NginxRateLimiter,
    serving_children,
)
from detector.runbooks.bindings.nginx import admission_from_step, rate_limit_from_step
from detector.runbooks.definition import Action

LIMIT = RateLimit(zone="detector_ml_llm", rate_per_s=2)


def test_render_http_and_location() -> None:
    assert render_http(LIMIT) == (
        HEADER + "# Include once inside http {}.\n"
        "limit_req_zone global zone=detector_ml_llm:10m rate=2r/s;\n"
    )
    assert render_location(LIMIT) == (
        HEADER + "# Include in the server {} or location {} that proxies to the workload.\n"
        "limit_req zone=detector_ml_llm nodelay;\n"
        "limit_req_status 429;\n"
    )


def test_render_burst_key_and_size() -> None:
    limit = RateLimit("z", 7, burst=14, zone_size="512k", key="$binary_remote_addr")
    assert render_http(limit).endswith(
        "limit_req_zone $binary_remote_addr zone=z:512k rate=7r/s;\n"
    )
    assert render_location(limit).endswith(
        "limit_req zone=z burst=14 nodelay;\nlimit_req_status 429;\n"
    )
    assert (
        limit.describe() == "limit_req 7 r/s burst 14 key $binary_remote_addr zone=z (512k) -> 429"
    )


def test_render_lifted_is_comments_only() -> None:
    for text in (render_http(None), render_location(None)):
        assert all(line.startswith("#") for line in text.splitlines())
        assert text.endswith("# No rate limit in force.\n")


@pytest.mark.parametrize(
    "fields",
    [
        {"rate_per_s": 0},
        {"rate_per_s": True},
        {"rate_per_s": 2.5},
        {"rate_per_s": None},
        {"rate_per_min": 60},
        {"rate_per_s": None, "rate_per_min": 0},
        {"connections": 0},
        {"connections": 1.5},
        {"burst": -1},
        {"zone": "a;b"},
        {"zone": ""},
        {"zone_size": "10m; include /etc/passwd"},
        {"zone_size": "0"},
        {"key": "$remote_addr }"},
        {"key": "a b"},
        {"status": 200},
    ],
)
def test_rate_limit_rejects_values_that_are_not_plain_tokens(fields: dict[str, object]) -> None:
    values: dict[str, object] = {"zone": "z", "rate_per_s": 2, **fields}
    with pytest.raises(ActuatorError) as caught:
        RateLimit(**values)  # type: ignore[arg-type]
    assert caught.value.reason == "invalid_request"


def test_zone_name_keeps_only_zone_characters() -> None:
    assert zone_name("ml", "llm.v2-chat") == "detector_ml_llm_v2_chat"
    assert len(zone_name("n" * 63, "w" * 63)) == 64


def test_rate_limit_from_step_reuses_the_planned_aggregate_budget() -> None:
    step = rate_step()
    limit = rate_limit_from_step(step, burst=3)
    assert step.params["aggregate_budget_rps"] == "2.5"  # 5.0 ok/s x 2 serving / 4 seen
    assert step.params["aggregate_connections"] == "256"  # 2 serving x max_num_seqs 128
    assert step.params["queue_burst"] == "25"  # 10 s of the budget wait at the gateway
    assert limit == RateLimit(
        zone="detector_ml_llm", rate_per_min=150, burst=25, connections=256, queue=True
    )  # one constant key: every client shares the budget
    unqueued = replace(step, params={**step.params, "queue_burst": "0"})
    assert rate_limit_from_step(unqueued, burst=3).burst == 3  # the configured burst
    assert limit.key == "global" and limit.requests_per_s == 2.5


def test_rate_limit_from_a_step_planned_before_the_aggregate_params() -> None:
    params = {"namespace": "ml", "ingress": "llm", "limit_rps": "2", "limit_connections": "26"}
    limit = rate_limit_from_step(replace(rate_step(), params=params))
    assert limit == RateLimit(zone="detector_ml_llm", rate_per_s=2, connections=26)


def test_rate_limit_from_a_lifted_step_relaxes_the_aggregate_by_the_same_factor() -> None:
    step = rate_step()
    lifted = {**step.params, "limit_rps": "4", "limit_connections": str(256 * 2)}
    assert step.params["per_client_rps"] == "2"  # unknown clients: as if one sent it all
    limit = rate_limit_from_step(replace(step, params=lifted))
    assert (limit.requests_per_s, limit.connections) == (5.0, 512)  # x2, like limit_rps
    assert limit.rate == "5r/s"  # 300 r/m: whole requests per second


def test_render_rate_per_minute_and_connections() -> None:
    limit = RateLimit("z", rate_per_min=48, connections=13)
    assert render_http(limit).endswith(
        "limit_req_zone global zone=z:10m rate=48r/m;\nlimit_conn_zone global zone=z_conn:10m;\n"
    )
    assert render_location(limit).endswith(
        "limit_req zone=z nodelay;\nlimit_req_status 429;\n"
        "limit_conn z_conn 13;\nlimit_conn_status 429;\n"
    )
    assert (
        limit.describe()
        == "limit_req 48 r/min burst 0 limit_conn 13 key global zone=z (10m) -> 429"
    )
    assert limit.requests_per_s == 0.8


@pytest.mark.parametrize(
    "change",
    [
        {"action": Action.STAGGER_RESTARTS},
        {"params": {"namespace": "ml", "ingress": "llm"}},
        {"params": {"namespace": "ml", "ingress": "llm", "limit_rps": "2.5"}},
    ],
)
def test_rate_limit_from_step_rejects_other_steps(change: dict[str, object]) -> None:
    step = replace(rate_step(), **change)  # type: ignore[arg-type]
    with pytest.raises(ActuatorError) as caught:
        rate_limit_from_step(step)
    assert caught.value.reason == "invalid_request"


def test_gateway_argv() -> None:
    gateway = NginxGateway(Path("/c/n.conf"), Path("/c/h"), Path("/c/l"))
    assert gateway.argv("-t", "-q") == ["nginx", "-c", "/c/n.conf", "-t", "-q"]
    full = replace(gateway, prefix=Path("/p"), error_log=Path("/p/e.log"), nginx_bin="/sbin/x")
    assert full.argv("-s", "reload") == [
        "/sbin/x", "-p", "/p", "-c", "/c/n.conf", "-e", "/p/e.log", "-s", "reload",
    ]  # fmt: skip


def fake_nginx(tmp_path: Path, script: str) -> NginxGateway:
    """Return a gateway whose ``nginx`` is a shell script, with empty includes in tmp_path."""
    binary = tmp_path / "nginx"
    binary.write_text("#!/bin/sh\n" + script)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "h.conf").touch()
    (tmp_path / "l.conf").touch()
    return NginxGateway(
        conf_path=tmp_path / "nginx.conf",
        http_include=tmp_path / "h.conf",
        location_include=tmp_path / "l.conf",
        nginx_bin=str(binary),
        command_timeout_s=5.0,
        reload_confirm_s=0.2,
    )


def test_plan_apply_writes_both_files_and_keeps_their_mode(tmp_path: Path) -> None:
    gateway = fake_nginx(tmp_path, "exit 0\n")
    gateway.http_include.chmod(0o640)
    actuator = NginxRateLimiter(gateway)
    result = actuator.apply(actuator.plan(LIMIT), dry_run=False)
    assert result.status is Status.OK, result.message()
    assert gateway.http_include.read_text() == render_http(LIMIT)
    assert gateway.location_include.read_text() == render_location(LIMIT)
    assert stat.S_IMODE(gateway.http_include.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.conf", "l.conf", "nginx"]
    assert actuator.plan_lift().changes[0].after == render_http(None)


@pytest.mark.parametrize(
    ("script", "reason", "text"),
    [
        ('echo "nginx: [emerg] zone is too small" >&2; exit 1\n', "config_invalid", "too small"),
        ("sleep 5\n", "timeout", "ran over 0.2 s"),
    ],
)
def test_nginx_t_failures_restore_the_files(
    tmp_path: Path, script: str, reason: str, text: str
) -> None:
    gateway = replace(fake_nginx(tmp_path, script), command_timeout_s=0.2)
    actuator = NginxRateLimiter(gateway)
    result = actuator.apply(actuator.plan(LIMIT), dry_run=False)
    assert (result.status, result.reason, result.restored) == (Status.FAILED, reason, True)
    assert text in (result.error or "")
    assert gateway.http_include.read_text() == gateway.location_include.read_text() == ""


def test_missing_binary_is_a_result(tmp_path: Path) -> None:
    gateway = replace(fake_nginx(tmp_path, ""), nginx_bin=str(tmp_path / "absent"))
    actuator = NginxRateLimiter(gateway)
    result = actuator.apply(actuator.plan(LIMIT), dry_run=False)
    assert (result.reason, result.restored) == ("binary_missing", True)


def test_reload_command_failing_is_refused_and_not_retried(tmp_path: Path) -> None:
    script = (
        'case "$*" in *"-s reload"*)\n'
        '  echo "kill failed" >&2; echo x >> "$0.reloads"; exit 1;;\n'
        "esac\n"
    )
    gateway = fake_nginx(tmp_path, script)
    actuator = NginxRateLimiter(gateway)
    result = actuator.apply(actuator.plan(LIMIT), dry_run=False)
    assert (result.reason, result.restored) == ("reload_failed", True)
    assert "kill failed" in (result.error or "")
    assert Path(gateway.nginx_bin + ".reloads").read_text() == "x\n"  # once: never signalled
    assert gateway.http_include.read_text() == ""


def test_foreign_targets_are_refused(tmp_path: Path) -> None:
    actuator = NginxRateLimiter(fake_nginx(tmp_path, "exit 0\n"))
    foreign = Plan("enable_rate_limit", actuator.target, (Change("/etc/passwd", None, "x"),))
    result = actuator.apply(foreign, dry_run=False)
    assert (result.status, result.reason) == (Status.FAILED, "invalid_request")
    assert not (tmp_path / "passwd").exists()


def _proc_entry(proc: Path, pid: int, ppid: int, title: str) -> None:
    (proc / str(pid)).mkdir(exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} (nginx: a) b) S {ppid} 1 1 0\n")
    (proc / str(pid) / "cmdline").write_bytes(title.encode() + b"\0")


@pytest.fixture
def fake_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /proc with this process as nginx master and worker 2001; ``FAKE_PROC`` names it."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "stat").write_text("1 (x) S 0\n")
    (proc / "sys").mkdir()
    _proc_entry(proc, 2001, os.getpid(), "nginx: worker process")
    _proc_entry(proc, 3001, 1, "nginx: worker process")
    monkeypatch.setattr(nginx_module, "PROC", proc)
    monkeypatch.setenv("FAKE_PROC", str(proc))
    monkeypatch.setenv("MASTER", str(os.getpid()))
    return proc


def test_serving_children_reads_proc(fake_proc: Path) -> None:
    assert serving_children(os.getpid()) == {2001}
    _proc_entry(fake_proc, 2002, os.getpid(), "nginx: worker process is shutting down")
    assert serving_children(os.getpid()) == {2001}


RELOAD_STARTS_WORKER = """\
case "$*" in *"-s reload"*)
  n=$(( $(ls "$FAKE_PROC" | sort -n | tail -n 1) + 1 ))
  mkdir "$FAKE_PROC/$n"
  printf '%s (nginx) S %s\\n' "$n" "$MASTER" > "$FAKE_PROC/$n/stat"
  printf 'nginx: worker process' > "$FAKE_PROC/$n/cmdline"
  for old in "$FAKE_PROC"/[0-9]*; do
    [ "$old" = "$FAKE_PROC/$n" ] || printf 'nginx: worker process is shutting down' > "$old/cmdline"
  done;;
esac
"""


def test_reload_is_confirmed_by_new_workers(tmp_path: Path, fake_proc: Path) -> None:
    (tmp_path / "nginx.pid").write_text(f"{os.getpid()}\n")
    gateway = replace(fake_nginx(tmp_path, RELOAD_STARTS_WORKER), pid_file=tmp_path / "nginx.pid")
    actuator = NginxRateLimiter(gateway)
    result = actuator.apply(actuator.plan(LIMIT), dry_run=False)
    assert result.status is Status.OK, result.message()
    assert serving_children(os.getpid()) == {3002}
    assert actuator.verify(actuator.plan(LIMIT)).status is Status.OK


def test_reload_without_new_workers_is_not_confirmed(tmp_path: Path, fake_proc: Path) -> None:
    (tmp_path / "nginx.pid").write_text(f"{os.getpid()}\n")
    gateway = replace(fake_nginx(tmp_path, "exit 0\n"), pid_file=tmp_path / "nginx.pid")
    actuator = NginxRateLimiter(gateway)
    result = actuator.apply(actuator.plan(LIMIT), dry_run=False)
    assert (result.status, result.reason, result.restored) == (
        Status.FAILED,
        "reload_failed",
        False,
    )
    assert gateway.http_include.read_text() == ""


def test_stopped_master_fails_before_writing(tmp_path: Path) -> None:
    (tmp_path / "nginx.pid").write_text("999999999\n")
    gateway = replace(fake_nginx(tmp_path, "exit 0\n"), pid_file=tmp_path / "nginx.pid")
    actuator = NginxRateLimiter(gateway)
    result = actuator.apply(actuator.plan(LIMIT), dry_run=False)
    assert (result.reason, result.restored) == ("not_running", True)
    assert actuator.verify(actuator.plan(LIMIT)).reason == "drift"  # nothing was written
    gateway.http_include.write_text(render_http(LIMIT))
    gateway.location_include.write_text(render_location(LIMIT))
    assert actuator.verify(actuator.plan(LIMIT)).reason == "not_running"


def test_reload_with_workers_hidden_is_not_confirmed_but_not_failed(
    tmp_path: Path, fake_proc: Path
) -> None:
    for entry in ("2001", "3001"):  # as under hidepid: other users' processes are not listed
        for name in ("stat", "cmdline"):
            (fake_proc / entry / name).unlink()
        (fake_proc / entry).rmdir()
    (tmp_path / "nginx.pid").write_text(f"{os.getpid()}\n")
    gateway = replace(fake_nginx(tmp_path, "exit 0\n"), pid_file=tmp_path / "nginx.pid")
    actuator = NginxRateLimiter(gateway)
    assert actuator.apply(actuator.plan(LIMIT), dry_run=False).status is Status.OK


def test_a_queued_burst_has_no_nodelay() -> None:
    limit = RateLimit("z", 3, burst=30, queue=True)
    assert render_location(limit).startswith(HEADER + "#")
    assert "limit_req zone=z burst=30;\n" in render_location(limit)
    assert "queued" in limit.describe()


def test_admission_rule_renders_client_max_body_size_in_whole_kib() -> None:
    rule = AdmissionRule(48_700)
    assert render_admission(rule).endswith("client_max_body_size 47k;\n")
    assert rule.describe() == "client_max_body_size 47k -> 413"
    assert render_admission(None).endswith("# No admission rule in force.\n")
    for bad in (0, 1023, "48k", True):
        with pytest.raises(ActuatorError):
            AdmissionRule(bad)  # type: ignore[arg-type]


def test_admission_from_a_quarantine_step_and_nothing_else() -> None:
    step = replace(rate_step(), action=Action.QUARANTINE_REQUESTS, step_id="quarantine_requests",
                   params={"max_body_bytes": "48700"})  # fmt: skip
    assert admission_from_step(step) == AdmissionRule(48_700)
    with pytest.raises(ActuatorError, match="no request class"):
        admission_from_step(replace(step, params={"max_body_bytes": "none"}))
    with pytest.raises(ActuatorError, match="not quarantine_requests"):
        admission_from_step(rate_step())


def test_admission_writes_its_own_include_and_lifts_it(tmp_path: Path) -> None:
    gateway = replace(fake_nginx(tmp_path, "exit 0\n"), admission_include=tmp_path / "a.conf")
    (tmp_path / "a.conf").write_text("# empty\n")
    actuator = NginxAdmission(gateway)
    result = actuator.apply(actuator.plan(AdmissionRule(48_700)), dry_run=False)
    assert result.status is Status.OK, result.message()
    assert (tmp_path / "a.conf").read_text() == render_admission(AdmissionRule(48_700))
    assert gateway.location_include.read_text() == ""  # the rate limit's files untouched
    assert actuator.plan_lift().changes[0].after == render_admission(None)
    with pytest.raises(ActuatorError):
        NginxAdmission(fake_nginx(tmp_path, "exit 0\n"))  # no admission include configured
