"""End to end: ``detector postmortem`` on the bundled recordings replayed into a SQLite store.

The figures are checked against independent counts: the failed requests against the 5xx
access lines of the workload's upstream in ``examples/cascade/lb-access.jsonl`` (parsed here),
the detection delays against the stage entries of ``detector show --json``, each step's
5xx rates against the access lines in its windows. The goldens are compared byte for byte
(``UPDATE_GOLDEN=1`` rewrites them). The replay stores each record's source as an absolute
path (``events.reader``), which the documents quote: it reads the examples through a symlink
at a fixed path (``EXAMPLES``, replaced atomically) so the bytes do not depend on where the
checkout is.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DETECTOR = Path(sys.executable).with_name("detector")
GOLDEN = Path(__file__).resolve().parent / "golden"
EXAMPLES = Path("/tmp/detector-postmortem-golden/examples")  # -> this checkout's examples/
KEY = "llm/vllm-llama@1741943017"
UPSTREAM = "llm-vllm-llama-8000"
BUCKET_S = 5.0
# ingress-nginx's upstreaminfo format: status after the request, the upstream name in brackets
# after request_length and request_time (https://kubernetes.github.io/ingress-nginx/
# user-guide/nginx-configuration/log-format/)
ACCESS = re.compile(
    r'^\S+ - \S+ \[[^\]]+\] "(?:[^"\\]|\\.)*" (?P<status>\d{3}) \d+ "(?:[^"\\]|\\.)*" '
    r'"(?:[^"\\]|\\.)*" \d+ \S+ \[(?P<upstream>[^\]]*)\]'
)


def detector(*args: str) -> subprocess.CompletedProcess[bytes]:
    cmd = [str(DETECTOR), *args]
    return subprocess.run(cmd, capture_output=True, timeout=300, check=False, cwd=REPO)


@dataclass
class Store:
    url: str
    replay: dict[str, Any]  # detector replay --json


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    tmp = tmp_path_factory.mktemp("postmortem")
    EXAMPLES.parent.mkdir(parents=True, exist_ok=True)
    link = EXAMPLES.parent / f".examples-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(REPO / "examples", target_is_directory=True)
    link.replace(EXAMPLES)  # atomic: a concurrent run sees the old link or this one
    url = f"sqlite:///{tmp / 'demo.db'}"
    replayed = detector("replay", "--json", "--db", url, str(EXAMPLES))
    assert replayed.returncode == 0, replayed.stderr
    return Store(url, json.loads(replayed.stdout))


def export(store: Store, ref: str, fmt: str, *extra: str) -> bytes:
    proc = detector("postmortem", ref, "--format", fmt, "--db", store.url, *extra)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def doc(store: Store) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(export(store, KEY, "json"))
    return found


def access_lines() -> list[tuple[float, int]]:
    """Return (epoch seconds, status) of the upstream's access lines, parsed independently."""
    out = []
    with (REPO / "examples/cascade/lb-access.jsonl").open() as lines:
        for line in lines:
            record = json.loads(line)
            found = ACCESS.match(record["log"]) if record.get("stream") == "stdout" else None
            if found and found["upstream"] == UPSTREAM:
                out.append((record["@timestamp"], int(found["status"])))
    return out


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def count_5xx(start: float, end: float) -> int:
    return sum(1 for t, status in access_lines() if start <= t < end and 500 <= status <= 599)


def test_failed_requests_are_the_5xx_access_lines_of_the_upstream(doc: dict[str, Any]) -> None:
    span = doc["impact"]["span"]
    assert doc["impact"]["failed_5xx"] == count_5xx(epoch(span["start"]), epoch(span["end"]))
    assert doc["impact"]["failed_5xx"] == 827
    assert doc["impact"]["pods_lost"] == 4


def test_detection_delays_are_the_stage_entries_differences(store: Store, doc: Any) -> None:
    proc = detector("show", KEY, "--json", "--db", store.url)
    assert proc.returncode == 0, proc.stderr
    timeline = json.loads(proc.stdout)["timeline"]
    first = next(epoch(t["time"]) for t in timeline if t["message"].startswith("victim #1"))
    stages = {}
    for t in timeline:
        if t["kind"] == "stage":
            stages.setdefault(t["message"].split(":")[0].split("-> ")[1], epoch(t["time"]))
    delays = {d["milestone"]: d["delay_s"] for d in doc["detection"]}
    assert delays["suspected"] == pytest.approx(stages["suspected"] - first, abs=1e-3)
    assert delays["cascading"] == pytest.approx(stages["cascading"] - first, abs=1e-3)
    assert delays["cascading"] == 29.0
    recover = doc["impact"]["time_to_recover_s"]
    assert recover == pytest.approx(stages["contained"] - first, abs=1e-3)


def test_each_steps_measured_5xx_rates_match_the_access_lines(doc: dict[str, Any]) -> None:
    measured = [s for s in doc["steps"] if s["measured"]]
    assert [s["position"] for s in measured] == [
        3
    ]  # the quarantine and the ceiling were passed over (load)
    for step in measured:
        at, w = epoch(step["applied_at"]), step["measured"]["window_s"]
        before_end = math.floor(at / BUCKET_S) * BUCKET_S
        after_start = math.ceil(at / BUCKET_S) * BUCKET_S
        before = count_5xx(before_end - w, before_end) / w
        after = count_5xx(after_start, after_start + w) / w
        assert step["measured"]["rate_5xx_before_per_s"] == round(before, 2)
        assert step["measured"]["rate_5xx_after_per_s"] == round(after, 2)
        assert step["mode"] == "dry_run" and "changed nothing" in step["effect"]
    withdrawn = next(s for s in doc["steps"] if s["position"] == 4)
    assert withdrawn["effect"].startswith("never applied")


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
def test_golden(store: Store, fmt: str) -> None:
    text = export(store, KEY, fmt)
    golden = GOLDEN / f"postmortem.{fmt}"
    if os.environ.get("UPDATE_GOLDEN") or not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        golden.write_bytes(text)
    assert text == golden.read_bytes()


def test_two_exports_are_the_same_bytes_with_their_plots(store: Store, tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        proc = detector("postmortem", KEY, "--db", store.url, "-o", str(tmp_path / name / "pm.md"))
        assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["pm.md", "pressure.svg", "traffic.svg"]
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    md = (tmp_path / "a" / "pm.md").read_text()
    assert "](traffic.svg)" in md and "](pressure.svg)" in md
    assert (tmp_path / "a" / "traffic.svg").read_text().lstrip().startswith("<?xml")


def test_the_html_is_one_self_contained_file(store: Store) -> None:
    html = export(store, KEY, "html").decode()
    assert html.count("<svg") >= 2 and "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)


@pytest.mark.parametrize(
    ("workload", "why"),
    [("batch/embedder", "host-RAM OOM"), ("shop/reranker", "failing upstream or dependency")],
)
def test_a_negative_recording_exports_why_it_was_not_this_pattern(
    store: Store, workload: str, why: str
) -> None:
    (verdict,) = [v for v in store.replay["verdicts"] if v["workload"] == workload]
    md = export(store, workload, "md").decode()
    assert md.startswith(f"# Not a GPU OOM cascade: {workload}\n")
    assert why in verdict["reason"] and why in md
    doc = json.loads(export(store, workload, "json"))
    assert doc["kind"] == "verdict" and doc["reason"] == verdict["reason"]
    assert "not a GPU OOM cascade" in doc["explanation"]
    assert "Not a GPU OOM cascade" in export(store, workload, "html").decode()


def test_errors_are_one_line_and_exit_2(store: Store, tmp_path: Path) -> None:
    unknown = detector("postmortem", "no/such@1", "--db", store.url)
    assert unknown.returncode == 2 and unknown.stderr.decode().count("\n") == 1
    assert b"no incident or verdict 'no/such@1'" in unknown.stderr
    missing = detector("postmortem", KEY, "--db", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 2 and b"no incident store" in missing.stderr
    assert not (tmp_path / "none.db").exists()


def test_the_web_app_serves_the_same_exports_and_links_them(store: Store) -> None:
    import httpx
    from http_helpers import serving

    from detector.config import DatabaseSettings, Settings, WebSettings

    token = "reader-token-0123456789abcdef"
    open_read = Settings(database=DatabaseSettings(url=store.url))
    with serving(open_read) as base, httpx.Client(base_url=base) as http:
        for fmt in ("md", "html", "json"):
            got = http.get(f"/incidents/{KEY}/postmortem.{fmt}")
            assert got.status_code == 200 and got.content == export(store, KEY, fmt)
        by_id = http.get("/incidents/1/postmortem.md")
        assert by_id.content == export(store, KEY, "md")
        assert "script-src" not in got.headers["content-security-policy"]  # no script at all
        page = http.get("/incidents/1").text
        assert 'href="/incidents/1/postmortem.html"' in page
        verdict = http.get("/incidents/batch/embedder/postmortem.md")
        assert verdict.status_code == 200 and b"host-RAM OOM" in verdict.content
        assert http.get("/incidents/1/postmortem.pdf").status_code == 404
        assert http.get("/incidents/no/such@1/postmortem.md").status_code == 404
    guarded = Settings(
        database=DatabaseSettings(url=store.url),
        web=WebSettings(host="0.0.0.0", tokens={"reader": token}),  # type: ignore[dict-item]
    )
    with serving(guarded) as base, httpx.Client(base_url=base) as http:
        anonymous = http.get("/incidents/1/postmortem.md")
        assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/login")
        form = re.search(r'name="csrf" value="([0-9a-f]+)"', http.get("/login").text)
        assert form is not None
        login = http.post("/login", data={"token": token, "csrf": form[1]})
        assert login.status_code == 303
        assert http.get("/incidents/1/postmortem.md").status_code == 200  # the session cookie
