"""Every command path ends in one line: user errors exit 2, Ctrl-C exits 130, never a traceback.

The findings of issue 16 (a new user's walkthrough), one test each, through the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASCADE = REPO / "examples" / "cascade"
CONFIG = REPO / "tests" / "unit" / "fixtures" / "model_configs" / "llama-3.1-8b.json"
DETECTOR = [sys.executable, "-m", "detector"]
OOM_LINE = (
    "(EngineCore_0 pid=165) ERROR 03-14 09:01:00 [core.py:1131] torch.OutOfMemoryError: CUDA "
    "out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB\n"
)


def detector(*args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DETECTOR, *args],
        input=stdin,
        env={**os.environ, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """Assert exit 2 with exactly one ``error:`` line on stderr holding ``words``."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_incidents_on_a_new_path_creates_nothing_and_says_how_to_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    one_line_error(detector("incidents", "--db", url), "no incident store", "detector migrate --db")
    assert list(tmp_path.iterdir()) == []
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:  # a SQLite file that is no migrated store
        conn.execute("CREATE TABLE x (y INTEGER)")
    proc = detector("incidents", "--db", f"sqlite:///{other}")
    one_line_error(proc, "not migrated", f"detector migrate --db sqlite:///{other}")
    assert "SELECT" not in proc.stderr and "no such table" not in proc.stderr


def test_setting_errors_are_one_line_naming_the_variable() -> None:
    proc = detector("incidents", DETECTOR_CORRELATE__WINDOW_S="-1")
    one_line_error(proc, "DETECTOR_CORRELATE__WINDOW_S: Input should be greater than 0")
    assert "pydantic" not in proc.stderr


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ('{namespace: "", workload: vllm-llama}', ["upstreams.gw.namespace", "not a namespace"]),
        ("{namespace: llm}", ["upstreams.gw.workload: Field required"]),
        ("{namespace: llm, workload: Vllm_Llama}", ["not a workload name"]),
    ],
)
def test_a_bad_workload_mapping_is_one_line(tmp_path: Path, entry: str, words: list[str]) -> None:
    mapping = tmp_path / "workloads.yaml"
    mapping.write_text(f"upstreams:\n  gw: {entry}\n")
    for command in (["produce", "--topic", "lb-logs"], ["run"]):  # before any broker is asked
        args = [*command, "--workloads", str(mapping), "--bootstrap", "127.0.0.1:1"]
        proc = detector(*args, *([str(CASCADE)] if command[0] == "produce" else []))
        one_line_error(proc, "workload mapping", *words)
        assert "pydantic.dev" not in proc.stderr


def test_arm_names_the_form_it_needs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert detector("replay", "--json", "--db", url, str(CASCADE)).returncode == 0
    proc = detector("arm", "vllm-llama", "--force", "--db", url)
    one_line_error(proc, "NAMESPACE/WORKLOAD, e.g. llm/vllm-llama", "'vllm-llama'")
    assert "not_found" not in proc.stderr
    one_line_error(detector("disarm", "llm/", "--db", url), "e.g. llm/vllm-llama")


def test_ctrl_c_says_interrupted_and_exits_130() -> None:
    proc = subprocess.Popen(
        [*DETECTOR, "classify"],  # waits on its standard input
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(8)  # past the imports (slow on a loaded 2-core runner), in the command
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (130, "interrupted\n")


def test_run_against_a_dead_broker_fails_fast_in_one_line(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    proc = detector("run", "--bootstrap", address, "--db", f"sqlite:///{tmp_path / 's.db'}")
    assert time.monotonic() - started < 20  # the bootstrap wait is 5 s, not kafka-python's 30
    one_line_error(proc, f"no broker answered at {address}", "DETECTOR_KAFKA__BOOTSTRAP_SERVERS")
    produce = detector(
        "produce", "--topic", "lb-logs", str(CASCADE), DETECTOR_KAFKA__BOOTSTRAP_SERVERS=address,
        DETECTOR_KAFKA__BOOTSTRAP_TIMEOUT_MS="1000",
    )  # fmt: skip
    one_line_error(produce, f"no broker answered at {address} within 1 s")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--topic", "", "--rate", "5"], ["--topic: a topic name cannot be empty"]),
        (["--topic", "lb logs"], ["--topic: 'lb logs' is not a Kafka topic name"]),
        (["--topic", "lb-logs", "--rate", "-5"], ["--rate: records per second must be over 0"]),
        (["--topic", "lb-logs", "--rate", "0"], ["--rate"]),
        (["--topic", "lb-logs", "--bootstrap", ""], ["--bootstrap: bootstrap servers"]),
    ],
)
def test_produce_checks_its_options_before_the_broker(args: list[str], words: list[str]) -> None:
    one_line_error(detector("produce", *args, str(CASCADE)), "invalid option", *words)


def test_run_checks_its_topics() -> None:
    one_line_error(detector("run", "--topics", "k8s-logs,"), "--topics: a topic name cannot be")


def test_plain_text_without_a_pod_says_to_give_namespace_and_pod(tmp_path: Path) -> None:
    log = tmp_path / "vllm-0.log"
    log.write_text(OOM_LINE)
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = detector("replay", "--db", url, str(log))
    assert proc.returncode == 0, proc.stderr
    assert "unknown_format=1" in proc.stdout
    assert "hint: unknown_format:" in proc.stdout and "--namespace NS --pod POD" in proc.stdout
    letters = json.loads(detector("dead-letters", "--json", "--db", url).stdout)
    assert "replay --namespace NS --pod POD" in letters["dead_letters"][0]["detail"]
    given = detector("replay", "--db", url, "--namespace", "llm", "--pod", "vllm-0", str(log))
    assert "unknown_format" not in given.stdout and "1 incident(s)" in given.stdout


def test_serve_says_where_it_listens_and_what_is_not_configured(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert detector("migrate", "--db", url).returncode == 0
    port = free_port()
    with subprocess.Popen(
        [*DETECTOR, "serve", "--port", str(port), "--db", url],
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("DETECTOR_")},
    ) as proc:
        assert proc.stderr is not None
        lines: list[str] = []
        while not lines or "serving" not in lines[-1]:
            lines.append(proc.stderr.readline())
            assert lines[-1], lines  # it did not end before saying where it serves
        time.sleep(1.0)  # serving
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 130 and rest == "interrupted\n"
    said = "".join(lines)
    assert f"http://127.0.0.1:{port}" in lines[-1]
    for missing in ("DETECTOR_WEB__TOKENS", "DETECTOR_CONTAINMENT__APPROVERS", "slack: not config"):
        assert missing in said


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-len", "1"], ["--max-len 1: a request length is at least 16 tokens"]),
        (["--max-len", "200000"], ["--max-len 200000: over the model's context of 131,072"]),
        (["--tensor-parallel", "64"], ["--tensor-parallel 64", "1, 2, 4, 8, 16, 32"]),
        (["--dtype", "int4"], ["--dtype: unknown dtype 'int4'", "accepted: float32"]),
        (["--kv-cache-dtype", "int4"], ["--kv-cache-dtype: unknown dtype", "accepted: auto"]),
    ],
)
def test_ceilings_refuse_values_out_of_range(args: list[str], words: list[str]) -> None:
    proc = detector("ceilings", "--model-config", str(CONFIG), "--gpu-memory", "80GiB", *args)
    one_line_error(proc, *words)
    assert proc.stdout == "" and "KV cache: unknown" not in proc.stderr


def test_classify_and_replay_both_call_an_oversized_line_too_large(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    size = 2**20 + 10
    big.write_bytes(b"CUDA out of memory " + b"x" * (size - 19) + b"\n" + OOM_LINE.encode())
    rows = [json.loads(line) for line in detector("classify", str(big)).stdout.splitlines()]
    assert rows[0]["error"] == f"too_large: {size} bytes > {2**20}"
    assert rows[0]["gpu_oom"] is None and rows[1]["gpu_oom"] is True
    url = f"sqlite:///{tmp_path / 's.db'}"
    replayed = detector("replay", "--json", "--db", url, str(big))
    assert json.loads(replayed.stdout)["events"]["rejected_by_reason"]["too_large"] == 1


def test_the_same_records_in_another_file_add_nothing(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(CASCADE / "container-logs.jsonl", copy / "container-logs.jsonl")
    url = f"sqlite:///{tmp_path / 's.db'}"
    once = detector("replay", "--json", "--db", url, str(CASCADE))
    twice = detector("replay", "--json", "--db", url, str(CASCADE), str(copy))
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    together = detector("replay", "--json", "--db", fresh, str(CASCADE), str(copy))
    timelines = [json.loads(p.stdout)["incidents"][0]["timeline"] for p in (once, twice, together)]
    assert len(timelines[1]) == len(timelines[0]) == len(timelines[2])
    configs = [(e["time"], e["message"]) for e in timelines[1] if "engine_config" in e["message"]]
    assert len(configs) == len(set(configs)) == 20


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("replay", "--nope"), ("No such option: --nope", "replay --help")),
        (("simulate", "--containment", "maybe"), ("--containment", "simulate --help")),
        (("approve",), ("Missing argument", "approve --help")),
        (("ceilings", "--tensor-parallel", "x"), ("--tensor-parallel", "ceilings --help")),
    ],
)
def test_a_bad_flag_is_one_line_naming_the_commands_help(
    args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    one_line_error(detector(*args), *words)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("postgresql://u:secret@localhost:99999/db", ["port 99999 is not in 1-65535"]),
        ("postgresql://u:secret@[::1/db", ["cannot use database URL"]),
        ("sqlite:///x%00.db", ["NUL byte"]),
        ("postgresql://u:p@ss@w0rd@localhost/db", ["percent-encode", "%40"]),
    ],
)
@pytest.mark.parametrize("command", ["incidents", "migrate", "replay", "serve"])
def test_a_database_url_no_store_can_be_at_is_one_line(
    command: str, url: str, words: list[str]
) -> None:
    """Each crashed with a traceback (exit 1); the '@' case printed the password's tail."""
    args = [str(CASCADE)] if command == "replay" else []
    proc = detector(command, "--db", url, *args)
    one_line_error(proc, *words)
    assert "secret" not in proc.stderr and "w0rd" not in proc.stderr and "ss@" not in proc.stderr


def test_replay_into_an_in_memory_store(tmp_path: Path) -> None:
    """``--db sqlite://`` failed: every connection was a new, empty database."""
    proc = detector("replay", "--json", "--db", "sqlite://", str(CASCADE))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["incidents"][0]["stage"]


def test_a_file_name_that_is_not_utf8_is_replayed(tmp_path: Path) -> None:
    """A folder replay aborted (UnicodeEncodeError, exit 1) on a Latin-1 file name."""
    folder = tmp_path / "logs"
    folder.mkdir()
    data = (CASCADE / "container-logs.jsonl").read_bytes()
    (folder / os.fsdecode(b"caf\xe9.jsonl")).write_bytes(data)
    proc = detector("replay", "--json", "--db", "sqlite://", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["incidents"], proc.stdout[:500]
