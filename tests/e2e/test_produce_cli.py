"""`detector produce` without --topic: a file it cannot place, and pacing options, are one-line
errors before any broker is asked (issue 16, item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
DEAD = "127.0.0.1:1"  # nothing listens: the errors come first


def produce(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detector", "produce", "--bootstrap", DEAD, *args],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_line(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)


def test_a_file_it_cannot_place_names_the_file_and_the_topic_option(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("deployed v2 at 09:00\n")
    proc = produce(str(CASCADE), str(notes))
    assert_one_line(proc, f"cannot tell which topic {notes} belongs to", "give --topic")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--speed", "0"], ["--speed: a factor over 0"]),
        (["--speed", "nan"], ["--speed"]),
        (["--speed", "10", "--rate", "5"], ["--rate and --speed"]),
        (["--partitions", "0"], ["--partitions"]),
    ],
)
def test_pacing_and_partitions_are_checked(args: list[str], words: list[str]) -> None:
    assert_one_line(produce(*args, str(CASCADE)), "invalid option", *words)
