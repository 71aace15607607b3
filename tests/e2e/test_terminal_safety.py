"""No text output of the CLI carries a raw control character from its input.

The bundled cascade is replayed with one pod renamed to a name full of terminal controls:
ESC (a CSI that clears the screen), an OSC that sets the window title ended by BEL, a C1 CSI,
DEL and bidi overrides/isolates. The readable report, the ``incidents`` listing, ``classify``
and an error line must show them as escapes; the JSON documents stay JSON with the same value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASCADE = REPO / "examples" / "cascade"
DETECTOR = Path(sys.executable).with_name("detector")
POD = "vllm-llama-t4pz2q9s6-94dgz"
HOSTILE = POD + "\x1b[2J\x1b]0;pwned\x07\x9b31m\x7f\u202eevil\u2066x\u2069"
BIDI = {*range(0x202A, 0x202F), *range(0x2066, 0x206A)}


def raw_controls(text: str) -> list[str]:
    """Return the characters a terminal would act on: C0 but newline, DEL, C1, bidi controls."""
    return [
        ch
        for ch in text
        if (ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) <= 0x9F or ord(ch) in BIDI
    ]


def detector(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [str(DETECTOR), *args],
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
        check=False,
        env=env,
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a copy of the cascade recording with one pod's name full of controls."""
    folder = tmp_path_factory.mktemp("hostile")
    escaped = json.dumps(HOSTILE)[1:-1]  # as it stands inside a JSON string
    for src in CASCADE.iterdir():
        (folder / src.name).write_text(src.read_text("utf-8").replace(POD, escaped), "utf-8")
    return folder


@pytest.fixture(scope="module")
def store(hostile: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Replay the hostile recording once (readable report); return the URL and the report."""
    url = f"sqlite:///{tmp_path_factory.mktemp('store') / 's.db'}"
    proc = detector("replay", "--db", url, str(hostile))
    assert proc.returncode == 0, proc.stderr
    return url, proc.stdout


def test_the_replay_report_shows_controls_as_escapes(store: tuple[str, str]) -> None:
    _, report = store
    assert "incident(s)" in report
    assert raw_controls(report) == []
    assert "\\x1b[2J" in report and "\\x07" in report and "\\u202e" in report


def test_the_incident_document_keeps_the_name_as_json(store: tuple[str, str]) -> None:
    url, _ = store
    proc = detector("incidents", "--json", "--db", url)
    assert proc.returncode == 0, proc.stderr
    assert raw_controls(proc.stdout) == []
    pods = {pod for inc in json.loads(proc.stdout) for pod in inc["pods"]}
    assert HOSTILE in pods  # the value itself is kept; only its printing is escaped


def test_the_incidents_listing_shows_controls_as_escapes(store: tuple[str, str]) -> None:
    url, _ = store
    proc = detector("incidents", "--db", url)
    assert proc.returncode == 0, proc.stderr
    assert "llm/vllm-llama" in proc.stdout
    assert all(not line.startswith((" ", "\t")) or "waiting" in line or "expired" in line
               for line in proc.stdout.splitlines())  # fmt: skip
    assert raw_controls(proc.stdout) == []


def test_classify_output_and_errors_carry_no_raw_control(tmp_path: Path) -> None:
    line = f"torch.OutOfMemoryError: CUDA out of memory. pod {HOSTILE}\n"
    proc = detector("classify", stdin=line + json.dumps({"text": line, "id": HOSTILE}) + "\n")
    assert proc.returncode == 0, proc.stderr
    assert raw_controls(proc.stdout) == []
    rows = [json.loads(row) for row in proc.stdout.splitlines()]
    assert rows[1]["id"] == HOSTILE and rows[0]["gpu_oom"] is True
    multi = tmp_path / "pod.log"
    multi.write_text(line, "utf-8")
    proc = detector("classify", "--multiline", str(multi))
    assert proc.returncode == 0 and raw_controls(proc.stdout) == []
    assert HOSTILE in json.loads(proc.stdout)["excerpt"]
    missing = detector("classify", str(tmp_path / f"no-{HOSTILE}.log"))
    assert missing.returncode == 2 and "\\x1b[2J" in missing.stderr
    assert raw_controls(missing.stderr) == []
