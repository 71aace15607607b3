"""`detector produce` without --topic: a file it cannot place, and pacing options, are one-line
errors before any broker is asked (issue 16, item 1)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_cli_errors import CASCADE, detector, one_line_error

DEAD = "127.0.0.1:1"  # nothing listens: the errors come first


def produce(*args: str) -> subprocess.CompletedProcess[str]:
    return detector("produce", "--bootstrap", DEAD, *args)


def test_a_file_it_cannot_place_names_the_file_and_the_topic_option(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("deployed v2 at 09:00\n")
    proc = produce(str(CASCADE), str(notes))
    one_line_error(proc, f"cannot tell which topic {notes} belongs to", "give --topic")


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
    one_line_error(produce(*args, str(CASCADE)), "invalid option", *words)
