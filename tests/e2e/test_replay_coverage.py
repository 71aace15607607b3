"""The bundled cascade's signal coverage (issue 24): which of the four signals its workload saw,
and why each missing one is missing; "lb_errors no" is never silent.

Replayed as is, ``llm/vllm-llama`` saw all four. Without the access log, ``lb_errors`` is
missing for want of lines (the web frontend's own access lines in the container logs name no
upstream: no load balancer's, only noted). With the access lines' upstream renamed to one no
convention or mapping names (``vllm_backend``), the lines are there but not attributed, with
the hint that would tie them.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

from rich.console import Console

from detector.cli.report import render_report
from detector.config import Settings
from detector.pipeline import replay
from detector.report.document import ReplayResult, to_document

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
UPSTREAM = "llm-vllm-llama-8000"


def _replay(folder: Path, db: Path) -> ReplayResult:
    settings = Settings()
    settings.database.url = f"sqlite:///{db}"
    return replay([folder], settings)


def _coverage(result: ReplayResult) -> dict[str, dict[str, Any]]:
    (incident,) = to_document(result)["incidents"]
    assert incident["workload"] == "llm/vllm-llama"
    return {c["signal"]: c for c in incident["coverage"]}


def _variant(tmp: Path, name: str) -> Path:
    folder = tmp / name
    shutil.copytree(CASCADE, folder)
    return folder


def test_the_bundled_cascade_saw_all_four_signals(tmp_path: Path) -> None:
    cov = _coverage(_replay(CASCADE, tmp_path / "d.db"))
    assert list(cov) == ["gpu_oom", "crash_loop", "lb_errors", "gpu_memory"]
    for signal, entry in cov.items():
        assert entry["seen"] and entry["count"] > 0 and entry["evidence"], signal
        assert (entry["reason"], entry["hint"]) == ("", ""), signal


def test_without_the_access_log_lb_errors_has_no_lines(tmp_path: Path) -> None:
    folder = _variant(tmp_path, "no-access-log")
    (folder / "lb-access.jsonl").unlink()
    result = _replay(folder, tmp_path / "d.db")
    cov = _coverage(result)
    lb = cov["lb_errors"]
    assert (lb["seen"], lb["count"], lb["evidence"], lb["reason"]) == (False, 0, False, "no lines")
    assert "web server access lines name no upstream" in lb["detail"]
    assert "access log" in lb["hint"]
    assert all(cov[s]["seen"] for s in ("gpu_oom", "crash_loop", "gpu_memory"))
    out = io.StringIO()
    render_report(result, Console(file=out, width=100, color_system=None))
    text = " ".join(out.getvalue().split())  # rich wraps long lines
    assert "lb_errors no" in text
    assert "warning: lb_errors: missing (no lines): no load-balancer lines" in text


def test_access_lines_of_an_unknown_upstream_are_not_attributed(tmp_path: Path) -> None:
    folder = _variant(tmp_path, "unknown-upstream")
    access = folder / "lb-access.jsonl"
    text = access.read_text(encoding="utf-8")
    assert UPSTREAM in text
    access.write_text(text.replace(UPSTREAM, "vllm_backend"), encoding="utf-8")
    lb = _coverage(_replay(folder, tmp_path / "d.db"))["lb_errors"]
    assert (lb["seen"], lb["reason"]) == (False, "not attributed")
    assert "upstream matches no workload" in lb["detail"]
    assert "--workloads" in lb["hint"] and "upstreams:" in lb["hint"]
