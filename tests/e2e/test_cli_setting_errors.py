"""Bad settings and options end in one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "model_configs"
CONFIG = CONFIGS / "llama-3.1-8b.json"


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detector", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["incidents"], {"DETECTOR_CONTAINMENT__APPROVERS": "alice"}, "mappings are JSON"),
        (["incidents"], {"DETECTOR_KAFKA__TOPICS": "k8s-logs"}, "lists and mappings are JSON"),
        (["run", "--max-poll-records", "0"], {}, "--max-poll-records: Input should be greater"),
        (["run", "--fetch-max-wait-ms", "-5"], {}, "--fetch-max-wait-ms: Input should be greater"),
        (["ceilings", "--model-config", str(CONFIG), "--gpu-memory", "80"], {}, "give a unit"),
        (["serve", "--port", "70000"], {}, "--port"),
    ],
)
def test_bad_setting_is_one_clear_line(args: list[str], env: dict[str, str], expected: str) -> None:
    done = _run(args, env)
    assert done.returncode == 2
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
