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
    (tmp_path / "a").mkdir()
    for name in ("a", "b"):  # b: the folder is made
        proc = detector("postmortem", KEY, "--db", store.url, "-o", str(tmp_path / name / "pm.md"))
        assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["pm.md", "pressure.svg", "scaledobject-llm-vllm-llama.yaml", "traffic.svg"]
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


# --- every cited line shows what the postmortem says of it ----------------------------------

# A source is ``SourcePos`` as text (detector.events.model): ``path:line`` (1-based) for a file;
# a Kafka record reads ``topic[partition]@offset``; a figure the detector computed cites
# ``series: ...`` (no line shows an aggregate).
SOURCE_LINE = re.compile(r"^(?P<path>/.+):(?P<line>\d+)$")
# what a statement gives that a line must show: a number (with its unit), a time of day
FIGURE = re.compile(r"(?<![\w.,#-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?:\s?(%|[KMG]iB)(?!\w))?")
NOT_FIGURES = re.compile(
    r"https?://\S+|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z?|\d+(?:\.\d+)? s\b"
    r"|\b\d{2}:\d{2}:\d{2}\b"
)  # URLs, ISO times and times of day (checked apart), durations (computed: between two lines)
CLOCK = re.compile(r"\b(\d{2}:\d{2}:\d{2})\b|T(\d{2}:\d{2}:\d{2})")
POD = re.compile(r"\bpod ([a-z0-9][a-z0-9.-]*[a-z0-9])")
BYTES = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def cited_line(source: str) -> str | None:
    """Return the text of a cited file line; None for a source that is no line."""
    found = SOURCE_LINE.match(source)
    if found is None:
        assert source.startswith("series: "), f"neither a line nor a series: {source}"
        return None
    lines = Path(found["path"]).read_text().splitlines()
    return lines[int(found["line"]) - 1]


def figures(text: str) -> list[tuple[str, str]]:
    """Return the (number, unit) figures that ``text`` states, as written."""
    return FIGURE.findall(NOT_FIGURES.sub(" ", text))


def shows(line: str, number: str, unit: str) -> bool:
    """Whether ``line`` holds ``number unit`` at the precision it is written with (a GiB
    figure may be the line's MiB, a whole percentage the line's 98.4%)."""
    digits = len(number.partition(".")[2])
    want = float(number.replace(",", ""))
    for raw, has in FIGURE.findall(line):
        value = float(raw.replace(",", ""))
        if unit in BYTES and has in BYTES:
            value = value * BYTES[has] / BYTES[unit]
        elif has != unit and not (unit == "" and has in BYTES):
            continue
        if math.isclose(round(value, digits), want, abs_tol=1e-9):
            return True
    return False


def unshown(statement: str, time: str | None, sources: list[str]) -> list[str]:
    """Return what ``statement`` (made at ``time``) says that none of its cited lines show:
    each figure and time of day, and the pod and time in the first line (the one cited for
    the statement's own moment); [] when every source is a series."""
    lines = [line for line in map(cited_line, sources) if line is not None]
    if not lines:
        return []
    missing = [f"{n} {u}".strip() for n, u in figures(statement)
               if not any(shows(line, n, u) for line in lines)]  # fmt: skip
    clocks = [a or b for a, b in CLOCK.findall(statement)]
    missing += [c for c in clocks if not any(c in line for line in lines)]
    missing += [f"pod {p}" for p in POD.findall(statement)[:1] if p not in lines[0]]
    if time is not None and datetime.fromisoformat(time).strftime("%H:%M:%S") not in lines[0]:
        missing.append(f"time {time}")
    return missing


def test_every_cited_line_shows_what_the_postmortem_says_of_it(doc: dict[str, Any]) -> None:
    """Issue 24: a KV "80% -> 100% at 09:04:35" row cited a 09:03:49 line that read 91.0%."""
    wrong = {}
    for row in doc["causal_chain"]:
        if missing := unshown(row["text"], row["time"], row["sources"]):
            wrong[f"{row['link']} {row['time']} ({row['sources']})"] = missing
    for q in doc["questions"]:
        if q["evidence"] and (missing := unshown(q["evidence_shows"], None, [q["evidence"]])):
            wrong[f"question {q['question']} ({q['evidence']})"] = missing
    assert wrong == {}
    by_line = [r["link"] for r in doc["causal_chain"] if any(map(SOURCE_LINE.match,
               r["sources"]))]  # fmt: skip
    assert len(by_line) == len(doc["causal_chain"]) - 1  # all but the traffic shift (a series)
    assert [q for q in doc["questions"] if q["evidence"]] == doc["questions"]


def test_the_forecast_is_set_against_the_death_that_followed(store: Store, doc: Any) -> None:
    """Issue 24: the postmortem says, for each forecast, when it said and what happened."""
    proc = detector("show", KEY, "--json", "--db", store.url)
    assert proc.returncode == 0, proc.stderr
    timeline = json.loads(proc.stdout)["timeline"]
    said = [t for t in timeline if t["message"].startswith("next victim at risk: pod ")]
    assert len(said) == len(doc["forecasts"]) == 1
    (check,) = doc["forecasts"]
    pod = said[0]["message"].removeprefix("next victim at risk: pod ").split(",")[0]
    died = next(t["time"] for t in timeline if t["message"].startswith(f"victim #4: pod {pod} "))
    assert (check["pod"], check["eta_s"]) == (pod, 0.0)  # "at its ceiling now"
    assert check["died_at"] == died.replace("+00:00", "Z")
    assert check["off_s"] == pytest.approx(epoch(died) - epoch(said[0]["time"]), abs=0.05)
    assert check["off_s"] == 4.1 and "4 s later than forecast" in check["text"]


def test_the_429_limit_is_the_most_served_in_a_healthy_minute_of_access_lines(doc: Any) -> None:
    """Issue 24: sized from the requests measured, counted here from the access lines."""
    (item,) = [i for i in doc["action_items"] if "429 limit" in i["title"]]
    span = doc["impact"]["span"]
    lines, best = access_lines(), 0
    for start in range(int(epoch(span["start"])), int(epoch(span["end"])) - 59, int(BUCKET_S)):
        statuses = [s for t, s in lines if start <= t < start + 60]
        failed = sum(1 for s in statuses if 500 <= s <= 599)
        if statuses and failed / len(statuses) <= doc["impact"]["error_ratio_threshold"]:
            best = max(best, len(statuses) - failed - sum(1 for s in statuses if s in (413, 429)))
    assert item["sizing"]["limit_per_min"] == best == 131
    assert item["title"].startswith(f"Keep a 429 limit ready at the gateway: {best}/min")


def with_outbox(store: Store, tmp_path: Path, *, drill: bool, delay_s: float) -> str:
    """Return a copy of the store whose incident's Slack thread was delivered ``delay_s``
    after its first OOM, as the sender marks it (``detector.notify.outbox.mark_sent``)."""
    from datetime import timedelta

    from sqlalchemy import select

    from detector import db
    from detector.incidents.models import Incident, TimelineEntry
    from detector.notify.models import Notification, NotificationThread

    copy = tmp_path / f"outbox-{'drill' if drill else 'live'}.db"
    copy.write_bytes(Path(store.url.removeprefix("sqlite:///")).read_bytes())
    url = f"sqlite:///{copy}"
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as session:
            inc = session.scalars(select(Incident).where(Incident.key == KEY)).one()
            first = min(v.first_oom_at for v in inc.victims)
            session.add(NotificationThread(incident_id=inc.id, channel="#llm-oncall",
                                           ts="1741943020.000100", attempts=1, drill=drill,
                                           error=""))  # fmt: skip
            told = session.scalars(select(TimelineEntry).where(
                TimelineEntry.incident_id == inc.id, TimelineEntry.kind == "stage"))  # fmt: skip
            for i, entry in enumerate(told):
                sent = first + timedelta(seconds=delay_s + 30 * i)
                session.add(Notification(incident_id=inc.id, entry_id=entry.id, time=entry.time,
                                         batch=f"{inc.id}-{i}", sent_at=sent, ts=f"1.{i}",
                                         attempts=1, error=""))  # fmt: skip
            session.commit()
    finally:
        engine.dispose()
    return url


def test_the_first_notification_is_the_first_message_slack_got(
    store: Store, doc: Any, tmp_path: Path
) -> None:
    """Issue 24: "first notification" stayed "-" after Slack posted (sends are in the outbox)."""
    before = {d["milestone"]: d for d in doc["detection"]}["first notification"]
    assert before["time"] is None and "nothing was queued for Slack" in before["note"]
    live = with_outbox(store, tmp_path, drill=False, delay_s=3.25)
    proc = detector("postmortem", KEY, "--format", "json", "--db", live)
    assert proc.returncode == 0, proc.stderr
    found = {d["milestone"]: d for d in json.loads(proc.stdout)["detection"]}
    assert found["first notification"]["time"] == "2025-03-14T09:03:40.251850Z"
    assert found["first notification"]["delay_s"] == 3.25
    md = detector("postmortem", KEY, "--format", "md", "--db", live).stdout.decode()
    assert "| first notification | 09:03:40 | 3.2 s | -25.8 s |  |" in md  # before cascading
    replayed = with_outbox(store, tmp_path, drill=True, delay_s=3.25)  # sent on the wall clock
    proc = detector("postmortem", KEY, "--format", "json", "--db", replayed)
    found = {d["milestone"]: d for d in json.loads(proc.stdout)["detection"]}
    assert found["first notification"]["time"] is None
    assert found["first notification"]["note"].startswith(
        "a replay: first delivered to Slack #llm-oncall at 2025-03-14 09:03:40 UTC by the wall"
    )
