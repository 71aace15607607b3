"""schemathesis against ``detector serve``'s own OpenAPI document, with and without a token:
no request it generates gets a 5xx. Bounded in time (``--max-time``), seeded to reproduce."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_helpers import serving
from recordings import awaiting_now

from detector.config import ContainmentSettings, DatabaseSettings, Settings, WebSettings
from detector.pipeline import replay

TOKEN = "alice-token-0123456789abcdef"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('st') / 'store.db'}"
    settings = Settings(
        database=DatabaseSettings(url=url),
        containment=ContainmentSettings(approvers=["alice"]),
        web=WebSettings(tokens={"alice": TOKEN}),  # type: ignore[dict-item]
    )
    replay([awaiting_now(tmp_path_factory.mktemp("rec") / "cascade")], settings)
    with serving(settings) as served:
        yield served


@pytest.mark.parametrize("headers", [[], ["-H", f"Authorization: Bearer {TOKEN}"]])
def test_no_generated_request_gets_a_server_error(
    base: str, headers: list[str], tmp_path: Path
) -> None:
    assert SCHEMATHESIS.exists() or shutil.which("schemathesis"), "pip install -e '.[dev]'"
    proc = subprocess.run(
        [str(SCHEMATHESIS), "run", f"{base}/api/openapi.json", "--checks", "not_a_server_error",
         "--max-examples", "15", "--max-time", "60", "--seed", "7", "--request-timeout", "10",
         *headers],
        capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Server error" not in proc.stdout
