"""End to end through the CLI: `detector show` and `detector dead-letters` on a replayed store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DETECTOR = Path(sys.executable).with_name("detector")
KEY = "llm/vllm-llama@1741943017"


def detector(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(DETECTOR), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)


@dataclass
class Store:
    url: str
    report: str  # the text report of the replay that filled it
    incidents: list[dict[str, Any]]  # detector incidents --json


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    url = f"sqlite:///{tmp_path_factory.mktemp('show') / 'demo.db'}"
    replayed = detector("replay", "--db", url, str(EXAMPLES))
    assert replayed.returncode == 0, replayed.stderr
    listed = detector("incidents", "--json", "--db", url)
    assert listed.returncode == 0, listed.stderr
    return Store(url, replayed.stdout, json.loads(listed.stdout))


def test_show_by_key_prints_the_replay_report_of_the_incident(store: Store) -> None:
    proc = detector("show", KEY, "--db", store.url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("─") and "incident #" in proc.stdout
    assert proc.stdout in store.report  # the same section, line for line
    (inc,) = store.incidents
    flat = "".join(proc.stdout.split())  # the victims line wraps at the console's width
    assert "".join(" -> ".join(inc["pods"]).split()) in flat
    assert "containment runbook" in proc.stdout and "timeline" in proc.stdout


def test_show_by_id_is_show_by_key(store: Store) -> None:
    (inc,) = store.incidents
    by_id = detector("show", str(inc["id"]), "--db", store.url)
    by_key = detector("show", KEY, "--db", store.url)
    assert by_id.returncode == 0, by_id.stderr
    assert by_id.stdout == by_key.stdout


def test_show_json_is_the_incidents_json_entry(store: Store) -> None:
    proc = detector("show", "--json", KEY, "--db", store.url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == next(i for i in store.incidents if i["key"] == KEY)


@pytest.mark.parametrize("value", ["llm/vllm-llama", "llm/vllm-lama@1741943017", "999"])
def test_an_unknown_incident_is_one_line_naming_the_close_keys(store: Store, value: str) -> None:
    proc = detector("show", value, "--db", store.url)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: no incident ")
    if value != "999":
        assert f"did you mean {KEY}?" in proc.stderr


def test_an_unknown_incident_is_escaped(store: Store) -> None:
    proc = detector("show", "llm/\x1b]0;x\x07vllm", "--db", store.url)
    assert proc.returncode == 2
    assert "\x1b" not in proc.stderr and "\\x1b" in proc.stderr


@pytest.mark.parametrize("command", [["show", KEY], ["dead-letters"]])
def test_a_missing_store_is_an_error_and_is_not_created(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "typo.db"
    proc = detector(*command, "--db", f"sqlite:///{missing}")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no incident store" in proc.stderr
    assert not missing.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def rejected(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A store fed a file of one good line and three bad ones: broken JSON, ANSI, NUL."""
    folder = tmp_path_factory.mktemp("dead")
    good = (EXAMPLES / "cascade" / "container-logs.jsonl").read_bytes().splitlines()[0]
    recorded = folder / "bad.jsonl"
    recorded.write_bytes(
        good
        + b'\n{"time": "2025-03-14T09:00:00Z", broken\n'
        + b"\x1b[2J\x1b]0;pwned\x07 hello\n"
        + b'{"a":"nul\x00byte"}\n'
    )
    url = f"sqlite:///{folder / 'dead.db'}"
    proc = detector("replay", "--db", url, str(recorded))
    assert proc.returncode == 0, proc.stderr
    return url, recorded


def test_dead_letters_are_listed_newest_first_with_the_counts(rejected: tuple[str, Path]) -> None:
    url, recorded = rejected
    proc = detector("dead-letters", "--db", url)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "3 dead letter(s) by reason: malformed_json=2, unknown_format=1"
    heads = [line for line in lines if line.startswith("#")]
    assert [h.split()[4] for h in heads] == [f"{recorded}:{n}" for n in (4, 3, 2)]
    assert [h.split()[5] for h in heads] == ["malformed_json", "unknown_format", "malformed_json"]
    assert "  raw: \\x1b[2J\\x1b]0;pwned\\x07 hello" in lines
    assert '  raw: {"a":"nul\\x00byte"}' in lines


def test_no_raw_byte_reaches_the_terminal(rejected: tuple[str, Path]) -> None:
    url, _ = rejected
    for extra in ([], ["--json"]):
        proc = detector("dead-letters", "--db", url, *extra)
        assert proc.returncode == 0, proc.stderr
        assert "\x1b" not in proc.stdout and "\x00" not in proc.stdout
        assert "\x07" not in proc.stdout


def test_dead_letters_json_and_reason_filter(rejected: tuple[str, Path]) -> None:
    url, recorded = rejected
    proc = detector("dead-letters", "--json", "--db", url, "--reason", "malformed_json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["total"] == 3 and doc["matched"] == 2
    assert doc["by_reason"] == {"malformed_json": 2, "unknown_format": 1}
    rows = doc["dead_letters"]
    assert [r["reason"] for r in rows] == ["malformed_json", "malformed_json"]
    assert [r["source"] for r in rows] == [f"{recorded}:4", f"{recorded}:2"]
    assert rows[0]["raw_preview"] == '{"a":"nul\\x00byte"}'
    assert rows[0]["raw_size_bytes"] == 16 and rows[0]["detail"]
    limited = json.loads(detector("dead-letters", "--json", "--db", url, "--limit", "1").stdout)
    assert [r["source"] for r in limited["dead_letters"]] == [f"{recorded}:4"]


@pytest.mark.parametrize("command", [["show", KEY], ["dead-letters"]])
def test_a_bad_setting_is_one_line(store: Store, command: list[str]) -> None:
    env = os.environ | {"DETECTOR_CONTAINMENT__APPROVERS": "not-json"}
    proc = detector(*command, "--db", store.url, env=env)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "invalid DETECTOR_* setting" in proc.stderr
