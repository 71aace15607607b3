"""The detector's own health: the Prometheus rules and the Grafana dashboard in deploy/.

``promtool`` (Debian package ``prometheus``, installed by ``make services``) checks the rules and
runs their unit tests on synthetic series (deploy/prometheus/detector-rules.test.yaml). Every
``detector_*`` name the rules and the dashboard use must be exported by the real ``/metrics`` of
``detector run``, scraped while it consumes the bundled cascade from the test broker.
Without promtool the promtool tests skip, except under CI (env ``CI`` set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from kafka_helpers import (
    CASCADE,
    STREAMS,
    produce,
    start_detector,
    stop,
    unique_prefix,
    wait_committed,
)
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "detector-rules.yaml"
RULES_TEST = REPO / "deploy" / "prometheus" / "detector-rules.test.yaml"
DASHBOARDS = sorted((REPO / "deploy" / "grafana").glob("*.json"))
METRIC = re.compile(r"\bdetector_[a-z0-9_]+\b")
# the series names a metric family of each type exposes
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("_sum", "_count", "_created"),
}


def _unavailable(message: str) -> NoReturn:
    """Skip, or fail under CI (env ``CI`` set), when promtool is missing."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; CI must run the rule tests (make services installs prometheus)")
    pytest.skip(message)


def _promtool(*args: str) -> str:
    tool = shutil.which("promtool")
    if tool is None:
        _unavailable("promtool is not installed")
    done = subprocess.run([tool, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_checks_the_rules() -> None:
    assert "SUCCESS: 7 rules found" in _promtool("check", "rules", str(RULES))


def test_promtool_unit_tests_fire_each_alert_where_it_should() -> None:
    _promtool("test", "rules", str(RULES_TEST))
    tested = {
        t["alertname"]
        for case in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert tested == alerts


def _rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def _targets(dashboard: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield from panel.get("targets", [])


def _dashboard_expressions() -> list[str]:
    exprs = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        exprs += [t["expr"] for t in _targets(dashboard)]
        exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def test_the_dashboard_is_importable_json_on_a_chosen_prometheus() -> None:
    assert DASHBOARDS
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids))
        for target in _targets(dashboard):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert METRIC.search(target["expr"]), target["expr"]


def exported_names(exposition: str) -> set[str]:
    """Return every series name a ``/metrics`` exposition offers (also of a labelled family
    with no series yet: its HELP/TYPE lines name it)."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_every_metric_the_rules_and_the_dashboard_use_is_on_metrics(
    kafka_bootstrap: str, sqlite_url: str, tmp_path: Path
) -> None:
    prefix, log, port = unique_prefix(), tmp_path / "run.log", _free_port()
    expected = {
        f"{prefix}-{suffix}": produce(kafka_bootstrap, f"{prefix}-{suffix}", CASCADE / name)
        for name, suffix in STREAMS.items()
    }
    proc = start_detector(
        kafka_bootstrap, prefix, sqlite_url, log, extra=("-v", "--metrics-port", str(port))
    )
    try:
        wait_committed(kafka_bootstrap, prefix, expected, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            exposition = answer.read().decode()
    finally:
        assert stop(proc) == 0, log.read_text()
    exported = exported_names(exposition)
    used = {m for e in [*_rule_expressions(), *_dashboard_expressions()] for m in METRIC.findall(e)}
    assert len(used) >= 10
    assert sorted(used - exported) == []
    assert "detector_store_up 1.0" in exposition  # the health probe reached the store


def test_the_name_check_sees_a_missing_name() -> None:
    exposition = (
        "# HELP detector_batch_failures_total Batches\n"
        "# TYPE detector_batch_failures_total counter\n"
        "# HELP detector_store_up Up\n# TYPE detector_store_up gauge\ndetector_store_up 1.0\n"
    )
    names = exported_names(exposition)
    assert {"detector_batch_failures_total", "detector_store_up"} <= names
    assert "detector_consumer_lag" not in names
