"""The incident page shows its workload's signal coverage, every value escaped.

The store holds the bundled cascade replayed with its access lines' upstream renamed to one
that names no workload (``vllm_backend``): ``lb_errors`` is missing, "not attributed", with
the hint that would tie the lines. A detail holding markup is shown as text.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
from http_helpers import serving
from sqlalchemy import select

from detector import db
from detector.config import DatabaseSettings, Settings
from detector.incidents.models import Incident
from detector.pipeline import replay

CASCADE = Path(__file__).resolve().parents[2] / "examples" / "cascade"
HOSTILE = "<script>alert(1)</script>"


def _set_detail(url: str, signal: str, detail: str) -> None:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            incident = session.scalars(select(Incident)).one()
            assert incident.coverage is not None
            incident.coverage = [
                entry | {"detail": detail} if entry["signal"] == signal else entry
                for entry in incident.coverage
            ]
            session.commit()
    finally:
        engine.dispose()


def test_the_page_shows_the_coverage_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "unknown-upstream"
    shutil.copytree(CASCADE, folder)
    access = folder / "lb-access.jsonl"
    access.write_text(
        access.read_text(encoding="utf-8").replace("llm-vllm-llama-8000", "vllm_backend"),
        encoding="utf-8",
    )
    settings = Settings(database=DatabaseSettings(url=f"sqlite:///{tmp_path / 'store.db'}"))
    (incident,) = replay([folder], settings).incidents
    with serving(settings) as base, httpx.Client(base_url=base) as web:
        page = web.get(f"/incidents/{incident.id}").text
        assert "Signal coverage" in page
        assert "<code>gpu_oom</code>" in page and "<code>gpu_memory</code>" in page
        assert "<strong>missing</strong> (not attributed):" in page
        assert "upstream matches no workload" in page
        assert "to bring it in: add the upstream to a workloads file" in page
        doc = web.get(f"/api/incidents/{incident.id}").json()
        lb = next(c for c in doc["coverage"] if c["signal"] == "lb_errors")
        assert (lb["seen"], lb["reason"]) == (False, "not attributed")
        _set_detail(settings.database.url, "lb_errors", HOSTILE)
        page = web.get(f"/incidents/{incident.id}").text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert HOSTILE not in page
