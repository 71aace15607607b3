"""Replay the bundled cascade with its access log in ingress-nginx's JSON format: same incident.

The controller's 1,532 access lines are rewritten into the widely used JSON
``log-format-upstream`` (``tests/access_json.py``, every value kept) and placed as Fluent Bit
ships them: a string in ``log``, or merged into the record by the kubernetes filter's
``Merge_Log On`` at the top level or under ``Merge_Log_Key log_processed`` with ``Keep_Log
Off``. Each replay must find what the original finds: the same incident key, stage, victims and
``lb_errors`` evidence, every record read and no access line lost. Sources:
https://github.com/kubernetes/ingress-nginx/issues/9819 ,
https://docs.fluentbit.io/manual/pipeline/filters/kubernetes .
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from access_json import Placement, rewrite

from detector.config import Settings
from detector.pipeline import replay
from detector.report.document import ReplayResult, to_document

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
ACCESS_LINES = 1532


def _replay(folder: Path, db: Path) -> ReplayResult:
    settings = Settings()
    settings.database.url = f"sqlite:///{db}"
    return replay([folder], settings)


def _converted(tmp: Path, placement: Placement) -> Path:
    folder = tmp / placement
    shutil.copytree(CASCADE, folder)
    lines = rewrite(CASCADE / "lb-access.jsonl", folder / "lb-access.jsonl", placement)
    assert lines == ACCESS_LINES
    return folder


def _lb_errors(result: ReplayResult) -> list[tuple[Any, ...]]:
    """The incident's lb_errors evidence: time, summary, figures and the record's line."""
    (incident,) = result.incidents
    return [
        (e.time, e.summary, e.attrs, e.source.rsplit(":", 1)[-1])
        for e in incident.evidence
        if e.kind == "lb_errors"
    ]


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> ReplayResult:
    return _replay(CASCADE, tmp_path_factory.mktemp("original") / "d.db")


@pytest.mark.parametrize("placement", ["log", "top", "log_processed"])
def test_json_access_log_finds_the_same_incident(
    original: ReplayResult, placement: Placement, tmp_path: Path
) -> None:
    result = _replay(_converted(tmp_path, placement), tmp_path / "d.db")
    before, after = to_document(original), to_document(result)
    assert after["events"]["rejected"] == 0 and after["events"]["rejected_by_reason"] == {}
    for key in ("read", "parsed", "signals", "unattributed"):
        assert after["events"][key] == before["events"][key], key
    (inc_before,), (inc_after,) = before["incidents"], after["incidents"]
    for key in ("key", "workload", "stage", "pods", "signals"):
        assert inc_after[key] == inc_before[key], key
    assert "lb_errors" in inc_after["signals"]
    assert inc_after["coverage"] == inc_before["coverage"]  # the four signals, each seen
    assert [c["signal"] for c in inc_after["coverage"] if c["seen"]] == [
        "gpu_oom", "crash_loop", "lb_errors", "gpu_memory"
    ]  # fmt: skip
    evidence = _lb_errors(result)
    assert evidence and evidence == _lb_errors(original)
    assert [t["message"] for t in inc_after["timeline"]] == [
        t["message"] for t in inc_before["timeline"]
    ]
