"""End to end: a real vLLM log without years, copied today, plain and gzipped, replayed.

The lines: https://github.com/noonghunna/club-3090/issues/16 (vLLM V1 engine,
``tests/unit/fixtures/vllm_yearless_oom.log``); their ``05-01`` has no year.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from calendar import timegm
from datetime import UTC, datetime
from pathlib import Path

import pytest

from detector.events.sources.timeparse import ZONE_SLACK_S

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "unit" / "fixtures" / "vllm_yearless_oom.log"
DETECTOR = Path(sys.executable).with_name("detector")


def _true_date(mtime: float) -> str:
    """The OOM line's date as of ``mtime``: this year's 05-01 if not ahead of it, else last."""
    year = datetime.fromtimestamp(mtime, UTC).year
    if timegm((year, 5, 1, 14, 39, 6)) > mtime + ZONE_SLACK_S:
        year -= 1
    return f"{year}-05-01T14:39:06Z"


@pytest.mark.parametrize("name", ["vllm.log", "vllm.log.gz"])
def test_a_fresh_copy_keeps_its_date_and_opens_the_incident(tmp_path: Path, name: str) -> None:
    data = FIXTURE.read_bytes()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)  # mtime: now
    cmd = [str(DETECTOR), "replay", "--json", "--db", f"sqlite:///{tmp_path / 't.db'}"]
    cmd += ["--namespace", "llm", "--pod", "vllm-0", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["events"]["read"] == len(data.splitlines())
    assert doc["events"]["rejected"] == 0, doc["events"]["rejected_by_reason"]
    (incident,) = doc["incidents"]
    assert incident["pods"] == ["vllm-0"]
    assert incident["opened_at"] == _true_date(os.stat(path).st_mtime)
