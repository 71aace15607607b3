"""The Alertmanager receiver behind a real uvicorn, over real HTTP, on SQLite and PostgreSQL.

The store holds the generated cascade of ``llm/vllm-llama`` (open, replayed near the wall
clock); the payload is ``tests/unit/fixtures/alertmanager_webhook_v4.json`` (its ``_source``
says where its shape and alerts come from): a crash loop of one of the workload's pods, an Xid
on another, and an alert naming no workload. The last test runs the real Alertmanager (Debian
``prometheus-alertmanager``, with ``amtool alert add``) against the receiver, basic auth.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from http_helpers import announce_oversized, serving
from recordings import awaiting_now
from sqlalchemy import func, select

from detector import db
from detector.config import DatabaseSettings, Settings, WebSettings
from detector.incidents.models import Alert, Evidence, TimelineEntry, Verdict
from detector.pipeline import replay

TOKEN = "alertmanager-token-0123456789"
PAYLOAD = json.loads(
    (Path(__file__).parents[1] / "unit/fixtures/alertmanager_webhook_v4.json").read_text()
)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    url: str = request.getfixturevalue(fixture)
    settings = Settings(
        database=DatabaseSettings(url=url),
        web=WebSettings(tokens={"alertmanager": TOKEN}),  # type: ignore[dict-item]
    )
    result = replay([awaiting_now(tmp_path / "cascade")], settings)
    incident = result.incidents[0]
    assert (incident.namespace, incident.workload) == ("llm", "vllm-llama")
    with serving(settings) as base:
        yield {"base": base, "url": url, "incident": incident.id}


def post(base: str, body: bytes, auth: str | None) -> tuple[int, Any, dict[str, str]]:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    req = urllib.request.Request(base + "/api/alertmanager", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def count(url: str, model: Any, *where: Any) -> int:
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine)() as s:
            return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)
    finally:
        engine.dispose()


def test_alerts_join_the_incident_once_and_an_xid_is_a_hardware_fault(
    server: dict[str, Any],
) -> None:
    body = json.dumps(PAYLOAD).encode()
    status, answer, _ = post(server["base"], body, f"Bearer {TOKEN}")
    assert status == 200, answer
    outcomes = [(a["signal"], a["outcome"]) for a in answer["alerts"]]
    assert outcomes == [
        ("crash_loop", "evidence"),
        ("hardware_fault", "verdict"),
        ("alert", "unattributed"),
    ]
    assert answer["alerts"][0]["incident"] is not None
    url, incident = server["url"], server["incident"]
    origin = Evidence.source_origin == "alertmanager"
    assert count(url, Evidence, Evidence.incident_id == incident, origin) == 2
    assert count(url, Verdict, Verdict.verdict == "hardware_fault") == 1

    # Alertmanager's HA peer (basic auth) sends the same group again: nothing new.
    status, again, _ = post(server["base"], body, basic("alertmanager", TOKEN))
    assert status == 200, again
    assert (again["new"], again["duplicates"]) == (0, 3)
    assert count(url, Alert) == 3
    assert count(url, Evidence, Evidence.incident_id == incident, origin) == 2
    assert count(url, Verdict, Verdict.verdict == "hardware_fault") == 1

    # send_resolved: the crash loop ended; a line on the timeline, no new evidence.
    resolved = copy.deepcopy(PAYLOAD)
    resolved["status"] = "resolved"
    resolved["alerts"] = [
        {**PAYLOAD["alerts"][0], "status": "resolved", "endsAt": "2026-12-08T00:45:00Z"}
    ]
    status, done, _ = post(server["base"], json.dumps(resolved).encode(), f"Bearer {TOKEN}")
    assert status == 200, done
    assert [a["outcome"] for a in done["alerts"]] == ["evidence"]
    lines = TimelineEntry.message.like("crash_loop: alert KubePodCrashLooping resolved%")
    assert count(url, TimelineEntry, TimelineEntry.incident_id == incident, lines) == 1
    assert count(url, Evidence, Evidence.incident_id == incident, origin) == 2


def test_concurrent_deliveries_store_each_alert_once(server: dict[str, Any]) -> None:
    body = json.dumps(PAYLOAD).encode()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(server["base"], body, f"Bearer {TOKEN}"),
                                range(8)))  # fmt: skip
    assert [a[0] for a in answers] == [200] * 8
    assert sum(a[1]["new"] for a in answers) == 3
    assert count(server["url"], Alert) == 3
    origin = Evidence.source_origin == "alertmanager"
    assert count(server["url"], Evidence, origin) == 2


BAD_CREDENTIALS = [
    None,
    "Bearer not-the-token-000000000",
    basic("alertmanager", "wrong-password-00000000"),
    basic("someone-else", TOKEN),
    "Basic %%%not-base64",
]
BAD_BODIES = [  # (body, what the answer says)
    (b"<xml>SECRET-IN-BODY</xml>", "not JSON"),
    (json.dumps({**PAYLOAD, "version": "SECRET-IN-BODY"}).encode(), "version 4"),
    (json.dumps({**PAYLOAD, "alerts": [{"status": "SECRET-IN-BODY"}]}).encode(), "version 4"),
    (b"[" * 100_000, "nested too deep"),
]


def test_without_valid_credentials_401(server: dict[str, Any]) -> None:
    for auth in BAD_CREDENTIALS:
        status, answer, headers = post(server["base"], json.dumps(PAYLOAD).encode(), auth)
        assert status == 401, (auth, answer)
        assert "Basic" in headers["www-authenticate"]
    assert count(server["url"], Alert) == 0


def test_a_bad_payload_is_400_with_the_reason_and_never_echoed(server: dict[str, Any]) -> None:
    for body, reason in BAD_BODIES:
        status, answer, _ = post(server["base"], body, f"Bearer {TOKEN}")
        assert status == 400, (reason, answer)
        assert reason in json.dumps(answer)
        assert "SECRET-IN-BODY" not in json.dumps(answer)
    assert count(server["url"], Alert) == 0


def test_a_body_over_the_bound_is_413(server: dict[str, Any]) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    status = announce_oversized(server["base"] + "/api/alertmanager", headers, 2 << 20)
    assert status == 413


ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.1)


def test_the_real_alertmanager_delivers_firing_duplicate_and_resolved_alerts(
    sqlite_url: str, tmp_path: Path
) -> None:
    if ALERTMANAGER is None or AMTOOL is None:  # make services installs it
        why = "the Debian package prometheus-alertmanager is not installed"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{why}; CI must run the real Alertmanager")
        pytest.skip(why)
    settings = Settings(
        database=DatabaseSettings(url=sqlite_url),
        web=WebSettings(tokens={"alertmanager": TOKEN}),  # type: ignore[dict-item]
    )
    result = replay([awaiting_now(tmp_path / "cascade")], settings)
    incident = result.incidents[0].id
    with serving(settings) as base:
        port = _free_port()
        config = tmp_path / "alertmanager.yml"
        config.write_text(
            "route:\n  receiver: detector\n  group_by: [namespace]\n  group_wait: 1s\n"
            "  group_interval: 1s\n  repeat_interval: 1h\n"
            "receivers:\n  - name: detector\n    webhook_configs:\n"
            f"      - url: {base}/api/alertmanager\n        send_resolved: true\n"
            f"        http_config:\n          basic_auth:\n            username: alertmanager\n"
            f"            password: {TOKEN}\n"
        )
        am = subprocess.Popen(
            [str(ALERTMANAGER), f"--config.file={config}", f"--storage.path={tmp_path / 'am'}",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            _wait(lambda: _ready(url), "alertmanager ready")
            labels = ["alertname=KubePodCrashLooping", "namespace=llm",
                      "pod=vllm-llama-7d9f8c6b5-x2x9q", "severity=critical"]  # fmt: skip
            amtool = [str(AMTOOL), f"--alertmanager.url={url}", "alert", "add", *labels,
                      "--annotation=summary=Pod is crash looping."]  # fmt: skip
            subprocess.run(amtool, check=True, capture_output=True, timeout=30)
            crash = Evidence.incident_id == incident, Evidence.kind == "crash_loop"
            origin = Evidence.source_origin == "alertmanager"
            _wait(lambda: count(sqlite_url, Evidence, *crash, origin) == 1, "the firing alert")
            subprocess.run(amtool, check=True, capture_output=True, timeout=30)  # again
            ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
            subprocess.run([*amtool, f"--end={ended}"], check=True, capture_output=True,
                           timeout=30)  # fmt: skip
            _wait(lambda: count(sqlite_url, Alert, Alert.status == "resolved") == 1,
                  "the resolved alert")  # fmt: skip
        finally:
            am.terminate()
            am.wait(timeout=10)
    assert count(sqlite_url, Alert, Alert.status == "firing") == 1
    assert count(sqlite_url, Evidence, *crash, origin) == 1


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_an_alert_of_a_workload_with_no_open_incident_is_kept_as_seen(
    server: dict[str, Any],
) -> None:
    other = copy.deepcopy(PAYLOAD)
    alert = other["alerts"][0]
    alert["labels"] = {**alert["labels"], "namespace": "batch", "pod": "embedder-5c9d7b8f6-q2w4e"}
    other["alerts"] = [alert]
    status, answer, _ = post(server["base"], json.dumps(other).encode(), f"Bearer {TOKEN}")
    assert status == 200, answer
    assert [(a["outcome"], a["incident"]) for a in answer["alerts"]] == [("seen", None)]
    assert (
        count(server["url"], Alert, Alert.workload == "embedder", Alert.incident_id.is_(None)) == 1
    )
    assert count(server["url"], Evidence, Evidence.source_origin == "alertmanager") == 0
