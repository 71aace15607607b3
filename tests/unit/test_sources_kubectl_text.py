"""Pasted kubectl describe/get/YAML output and nvidia-smi tables -> the signals of their JSON."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.reader import read_records
from detector.events.sources.kubectl_text import signals_from_kubectl_text
from detector.events.sources.nvidia_smi_table import signals_from_nvidia_smi_table
from detector.events.sources.timeparse import parse_iso8601

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
SRC = SourcePos("paste.txt", 1)
SCRAPE = 1734429601.0
MIB = 1024 * 1024

DESCRIBE = """Name:             vllm-0
Namespace:        llm
Node:             gpu-node-1/10.0.0.3
Start Time:       Tue, 06 May 2025 17:37:06 +0000
Status:           Running
Controlled By:    ReplicaSet/vllm-5cc594fd46
Containers:
  vllm:
    Image:         vllm/vllm-openai:v0.7.1
    State:          Waiting
      Reason:       CrashLoopBackOff
    Last State:     Terminated
      Reason:       OOMKilled
      Exit Code:    137
      Started:      Tue, 06 May 2025 17:50:00 +0000
      Finished:     Tue, 06 May 2025 17:51:00 +0000
    Ready:          False
    Restart Count:  4
    Environment:
      hf-token:  <set to the key 'token'>
Conditions:
  Type              Status
  Ready             False
Events:
  Type     Reason     Age                From     Message
  ----     ------     ----               ----     -------
  Warning  BackOff    3m (x4 over 5m)    kubelet  Back-off restarting failed container vllm in pod
  Normal   Killing    5m                 kubelet  Container vllm failed liveness probe
  Warning  Unhealthy  5m (x3 over 6m)    kubelet  Liveness probe failed: HTTP probe failed
"""


def _corpus(rel: str) -> list[list[Signal] | ParseError]:
    path = CORPUS / rel
    if not path.exists():
        pytest.skip("corpus not found")
    out: list[list[Signal] | ParseError] = []
    for source, raw in read_records([path]):
        try:
            out.append(parse_record(raw, source, default_time=SCRAPE))
        except ParseError as exc:
            out.append(exc)
    return out


def _one(rel: str) -> list[Signal]:
    (result,) = _corpus(rel)  # the reader yields the whole paste as one record
    assert isinstance(result, list), result
    return result


def _kinds(signals: list[Signal]) -> list[SignalKind]:
    return [s.kind for s in signals]


# --- kubectl describe pod ---------------------------------------------------------------------


def test_describe_oomkilled_crash_loop_and_events() -> None:
    signals = parse_record(DESCRIBE, SRC, default_time=SCRAPE)
    assert _kinds(signals) == [SignalKind.HOST_OOM, SignalKind.CRASH_LOOP, SignalKind.CRASH_LOOP]
    oom, loop, backoff = signals
    for sig in signals:
        assert (sig.namespace, sig.pod, sig.node) == ("llm", "vllm-0", "gpu-node-1")
        assert sig.owner == ("ReplicaSet", "vllm-5cc594fd46")
    assert oom.container == "vllm" and oom.attrs == {"reason": "OOMKilled", "exit_code": 137}
    assert oom.time == parse_iso8601("2025-05-06T17:51:00Z")
    assert loop.attrs == {
        "reason": "CrashLoopBackOff",
        "restart_count": 4,
        "last_reason": "OOMKilled",
        "exit_code": 137,
    }
    assert backoff.attrs == {"reason": "BackOff", "count": 4}
    assert backoff.container == "vllm" and backoff.time == SCRAPE  # ages are relative


def test_exit_137_without_reason_is_host_oom_with_reason_error_is_not() -> None:
    no_reason = DESCRIBE.replace("      Reason:       OOMKilled\n", "")
    assert SignalKind.HOST_OOM in _kinds(parse_record(no_reason, SRC, default_time=SCRAPE))
    error = DESCRIBE.replace("OOMKilled", "Error")
    signals = parse_record(error, SRC, default_time=SCRAPE)
    assert SignalKind.HOST_OOM not in _kinds(signals)
    assert signals[0].attrs["last_reason"] == "Error" and signals[0].attrs["exit_code"] == 137


def test_describe_without_any_time_needs_default_time() -> None:
    text = "\n".join(ln for ln in DESCRIBE.splitlines() if "+0000" not in ln)
    assert parse_record(text, SRC, default_time=SCRAPE)[0].time == SCRAPE
    with pytest.raises(ParseError) as err:
        parse_record(text, SRC)
    assert err.value.reason == "missing_timestamp"


def test_bad_rfc1123_time() -> None:
    with pytest.raises(ParseError) as err:
        parse_record(DESCRIBE.replace("Tue, 06 May 2025 17:37:06", "Tue, 99 Foo"), SRC)
    assert err.value.reason == "bad_timestamp"


def test_single_describe_lines_keep_their_old_meaning() -> None:
    with pytest.raises(ParseError):
        parse_record("Name:             vllm-0", SRC, default_time=SCRAPE)


def test_plain_text_is_not_kubectl() -> None:
    with pytest.raises(ParseError) as err:
        signals_from_kubectl_text("hello\nworld", SRC, default_time=SCRAPE)
    assert err.value.reason == "unknown_format"


def test_yaml_pod_with_identity_and_unquoted_dates() -> None:
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: vllm-0\n  namespace: llm\n"
        "spec:\n  nodeName: n1\nstatus:\n  phase: Running\n  containerStatuses:\n"
        "  - name: vllm\n    restartCount: 2\n    lastState:\n      terminated:\n"
        "        reason: OOMKilled\n        exitCode: 137\n"
        "        finishedAt: 2024-07-16T10:13:25Z\n    state:\n      running: {}\n"
    )
    (oom,) = parse_record(text, SRC)
    assert (oom.kind, oom.pod, oom.namespace, oom.node) == (
        SignalKind.HOST_OOM,
        "vllm-0",
        "llm",
        "n1",
    )
    assert oom.time == parse_iso8601("2024-07-16T10:13:25Z")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("status:\n  - [unclosed", "malformed_json"),
        ("kind: Service\nstatus: {}", "unknown_format"),
        ("status: 3\nkind: Pod", "unknown_format"),
        (
            "containerStatuses:\n- state:\n    waiting:\n      reason: CrashLoopBackOff",
            "missing_timestamp",
        ),
    ],
)
def test_yaml_rejected(text: str, reason: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_record(text, SRC)
    assert err.value.reason == reason


def test_yaml_alias_bomb_is_bounded() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    assert parse_record("status:\n  phase: x\n" + "\n".join(lines), SRC) == []  # 10**9 nodes


# --- nvidia-smi table -------------------------------------------------------------------------


def test_nvidia_smi_table_without_banner_is_rejected() -> None:
    with pytest.raises(ParseError) as err:
        signals_from_nvidia_smi_table("+----+\n| a |", SRC, default_time=SCRAPE)
    assert err.value.reason == "unknown_format"


def test_nvidia_smi_table_needs_a_time() -> None:
    path = CORPUS / "gpu_metrics" / "nvidia_smi_table_h100_550.txt"
    if not path.exists():
        pytest.skip("corpus not found")
    with pytest.raises(ParseError) as err:
        parse_record(path.read_text(), SRC)
    assert err.value.reason == "missing_timestamp"


# --- the corpus, file by file, as FILE_NOTES.jsonl says ---------------------------------------


def test_corpus_describe_flattened_paste() -> None:
    """restarts_19, last_state_error_exit_1, currently_running; indentation lost in the paste."""
    loop, ready = _one("k8s/describe_container_last_error_exit1_flattened.txt")
    assert (loop.kind, ready.kind) == (SignalKind.CRASH_LOOP, SignalKind.POD_READY)
    assert (loop.pod, loop.namespace, loop.container) == (
        "wordpress-5bbd7fd785-p4s9r",
        "default",
        "wordpress",
    )
    assert loop.node == "node-2" and loop.labels["tier"] == "frontend"
    assert loop.attrs == {
        "reason": "Restarted",
        "restart_count": 19,
        "last_reason": "Error",
        "exit_code": 1,
    }
    assert loop.time == parse_iso8601("2020-08-09T12:16:06+05:30")


def test_corpus_events_k8s16_backoff_and_failedsync() -> None:
    backoff, failedsync = _one("k8s/describe_events_failedsync_crashloop_k8s16.txt")
    assert backoff.attrs == {"reason": "BackOff", "count": 3}
    assert failedsync.attrs == {"reason": "FailedSync", "count": 3}
    assert failedsync.container == "registry"
    assert {backoff.kind, failedsync.kind} == {SignalKind.CRASH_LOOP} and backoff.time == SCRAPE


def test_corpus_events_unhealthy_then_backoff() -> None:
    """unhealthy_readiness gives no signal; backoff_event one CRASH_LOOP."""
    (backoff,) = _one("k8s/describe_events_readiness_unhealthy_backoff.txt")
    assert backoff.kind is SignalKind.CRASH_LOOP and backoff.attrs["count"] == 1


def test_corpus_liveness_killing_without_crashloop_status() -> None:
    """Unhealthy / Killing / restarts while Running: no signal (no lastState shown)."""
    assert _one("k8s/describe_events_vllm_sim_liveness_404_killing.txt") == []


def test_corpus_exit_137_reason_error_is_not_host_oom() -> None:
    (loop,) = _one("k8s/describe_last_state_exit137_reason_error.txt")
    assert loop.kind is SignalKind.CRASH_LOOP
    assert loop.attrs == {
        "reason": "Restarted",
        "restart_count": 1,
        "last_reason": "Error",
        "exit_code": 137,
    }
    assert loop.time == parse_iso8601("2023-11-13T03:50:55+01:00")


def test_corpus_get_pods_crashloop_and_describe_head() -> None:
    (loop,) = _one("k8s/get_pods_vllm_crashloop_and_describe_head.txt")
    assert loop.kind is SignalKind.CRASH_LOOP
    assert (loop.pod, loop.namespace, loop.container, loop.node) == (
        "deepseek-r1-distill-llama-8b-5cc594fd46-hg5rw",
        "default",
        "vllm-openai",
        "minikube",
    )
    assert loop.owner == ("ReplicaSet", "deepseek-r1-distill-llama-8b-5cc594fd46")
    assert loop.attrs["restart_count"] == 5 and loop.attrs["reason"] == "CrashLoopBackOff"
    assert loop.time == parse_iso8601("2025-05-06T17:37:06Z")  # the only time shown: Start Time


def test_corpus_ci_prefixed_yaml_last_state_137_error() -> None:
    """exitCode 137 reason Error is no OOM kill; without restartCount it is no restart either."""
    assert _one("k8s/pod_lastState_exit137_error_liveness_vllm_launcher.txt") == []


def test_corpus_yaml_container_statuses_fragment() -> None:
    (loop,) = _one("k8s/pod_status_containerStatuses_crashloop_yaml.txt")
    assert (loop.kind, loop.container, loop.pod) == (SignalKind.CRASH_LOOP, "app", None)
    assert loop.attrs == {
        "reason": "CrashLoopBackOff",
        "restart_count": 617,
        "last_reason": "Error",
        "exit_code": 1,
    }
    assert loop.time == parse_iso8601("2023-09-24T11:55:46Z")


def test_corpus_startup_probe_message_alone_is_rejected() -> None:
    # The file is one Event *message* without its reason, object or time: nothing says which
    # Event it was, so it cannot honestly become a signal (unhealthy_startup gives none anyway).
    (result,) = _corpus("k8s/event_message_startup_probe_vllm.txt")
    assert isinstance(result, ParseError) and result.reason == "unknown_format"


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("nvidia_smi_table_h100_550.txt", [(0, 1, 81559)]),
        ("nvidia_smi_table_legacy_375_quadro.txt", []),  # the excerpt ends above the GPU rows
        ("nvidia_smi_table_v100_near_full_535.txt", [(0, 31566, 32768), (1, 0, 32768)]),
        ("nvidia_smi_table_vllm_idle_a100_89pct.txt", [(0, 72591, 81920)]),
    ],
)
def test_corpus_nvidia_smi_tables(name: str, expect: list[tuple[int, int, int]]) -> None:
    signals = _one(f"gpu_metrics/{name}")
    assert {s.kind for s in signals} <= {SignalKind.GPU_MEMORY}
    got = [
        (s.attrs["gpu"], s.attrs["used_bytes"] // MIB, s.attrs["total_bytes"] // MIB)
        for s in signals
    ]
    assert got == expect
    assert all(s.attrs["uuid"] is None for s in signals)


def test_corpus_nvidia_smi_table_date_line() -> None:
    signals = _one("gpu_metrics/nvidia_smi_table_v100_near_full_535.txt")
    assert {s.time for s in signals} == {parse_iso8601("2024-06-24T15:48:31Z")}


def test_corpus_nvidia_smi_query_output_stays_unparsed() -> None:
    # ``nvidia-smi -q`` is not one of the formats read here (the brief covers the table); its
    # lines stay line records and each is rejected, never mistaken for GPU memory.
    results = _corpus("gpu_metrics/nvidia_smi_q_fb_memory_usage.txt")
    assert results and all(isinstance(r, ParseError) for r in results)


# --- never anything but ParseError ------------------------------------------------------------

_PIECES = [
    "Name: a",
    "Namespace: b",
    "Containers:",
    "  c:",
    "State: Waiting",
    "Last State: Terminated",
    "Reason: OOMKilled",
    "Exit Code: 137",
    "Exit Code: 99999999999",
    "Restart Count: 3",
    "Started: Mon, 02 Jan 2006 15:04:05 -0700",
    "Finished: Mon, 99 Jan 2006",
    "Events:",
    "  Warning  BackOff  1m (x2 over 2m)  kubelet  Back-off restarting failed container c",
    "NAME  READY  STATUS  RESTARTS  AGE",
    "p  0/1  CrashLoopBackOff  5 (1m ago)  3m",
    "containerStatuses:",
    "- name: x",
    "  restartCount: 2",
    "status: [",
    "kind: Pod",
    "Ready: True",
    "Labels: a=b",
    "x=y",
    "+------+",
    "| NVIDIA-SMI 550 |",
    "|   0  GPU  Off  |",
    "| N/A 1C P0 1W / 2W |  5MiB / 9MiB |",
    "Tue Jul 16 10:13:25 2024",
    "Tue Feb 31 10:13:25 2024",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(_PIECES) | st.text(max_size=30), max_size=14),
    st.sampled_from([None, SCRAPE]),
)
def test_kubectl_text_raises_only_parse_error(lines: list[str], default: float | None) -> None:
    text = "\n".join(lines)
    for parse in (signals_from_kubectl_text, signals_from_nvidia_smi_table):
        try:
            result = parse(text, SRC, default_time=default)
        except ParseError:
            continue
        assert all(isinstance(s, Signal) for s in result)
    with contextlib.suppress(ParseError):
        parse_record(text, SRC, default_time=default)
