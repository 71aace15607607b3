"""End to end through the CLI: `detector explain` names each record's format, signals or why not.

One test per supported format, each on real records: the unit fixtures of the source parsers
(their rows carry the public source they were taken from) written out as the file a shipper
would produce, or a file of the shared corpus as it was published; then `examples/`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from detector.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "unit" / "fixtures"
CORPUS = ROOT.parent / "shared" / "corpus"
EXAMPLES = ROOT / "examples"
RUNNER = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    """Run ``detector explain ARGS`` in a wide terminal; return (exit code, stdout, stderr)."""
    env = {"COLUMNS": "200", "DETECTOR_DATABASE__URL": "sqlite://"}
    result = RUNNER.invoke(app, ["explain", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def _rows(name: str) -> list[dict[str, Any]]:
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line]


def _lines(name: str, key: str, keep: Callable[[Any], bool] = bool) -> Callable[[Path], Path]:
    """Write each fixture row's ``key`` (a line, or an object as one JSON line) that ``keep``
    accepts to a file."""

    def write(tmp: Path) -> Path:
        out = tmp / f"{name}.log"
        values = [row[key] for row in _rows(name) if row.get(key) is not None]
        text = [v if isinstance(v, str) else json.dumps(v) for v in values if keep(v)]
        out.write_text("\n".join(text) + "\n", encoding="utf-8")
        return out

    return write


def _has(key: str) -> Callable[[Any], bool]:
    return lambda value: key in value


def _json_text(value: Any) -> bool:
    return str(value).startswith("{")


def _corpus(*parts: str) -> Callable[[Path], Path]:
    return lambda _tmp: CORPUS.joinpath(*parts)


POD = ("--namespace", "llm", "--pod", "vllm-0")
# (test id, input, format every record is read as, extra arguments, a signal kind it gives)
FORMATS: list[tuple[str, Callable[[Path], Path], str, tuple[str, ...], str | None]] = [
    ("cri", _lines("sources_cri_lines.jsonl", "text"), "CRI log line", POD, None),
    ("docker", _lines("sources_docker_json.jsonl", "record"), "Docker json-file", POD, None),
    ("fluentbit", _lines("sources_envelopes.jsonl", "record", _has("log")), "Fluent Bit", (), None),
    (
        "vector",
        _lines("sources_envelopes.jsonl", "record", _has("message")),
        "Vector kubernetes_logs",
        (),
        None,
    ),
    ("k8s_event", _lines("sources_k8s_events.jsonl", "event"), "Kubernetes Event", (), None),
    ("k8s_pod", _lines("sources_k8s_pods.jsonl", "pod"), "Kubernetes Pod", (), "crash_loop"),
    (
        "eventrouter",
        _corpus("k8s", "event_core_v1_openshift_eventrouter_envelope.jsonl"),
        "eventrouter envelope",
        (),
        None,
    ),
    (
        "ingress_nginx",
        _lines("sources_ingress_nginx_lines.jsonl", "text"),
        "access log line",
        (),
        "lb_response",
    ),
    (
        "ingress_nginx_json",
        _lines("sources_ingress_nginx_json.jsonl", "text"),
        "JSON line: load-balancer",
        (),
        "lb_response",
    ),
    ("dcgm", _lines("sources_dcgm_lines.jsonl", "text"), "Prometheus exposition", (), None),
    (
        "nvidia_smi_csv",
        _lines("sources_nvidia_smi.jsonl", "text"),
        "nvidia-smi CSV",
        POD,
        "gpu_memory",
    ),
    (
        "nvidia_smi_table",
        _corpus("gpu_metrics", "nvidia_smi_table_h100_550.txt"),
        "nvidia-smi table",
        POD,
        "gpu_memory",
    ),
    (
        "kubectl_text",
        _corpus("k8s", "get_pods_vllm_crashloop_and_describe_head.txt"),
        "kubectl describe/get output",
        ("--namespace", "llm"),
        None,
    ),
    (
        "kafka_adapter",
        _lines("sources_prom_kafka_adapter.jsonl", "record"),
        "prometheus-kafka-adapter",
        (),
        None,
    ),
    ("vector_metric", _lines("sources_vector_metrics.jsonl", "record"), "Vector metric", (), None),
    (
        "kubectl_prefix",
        _corpus("envelopes", "vector_kubernetes_logs_2020_kubectl_prefix.log"),
        "kubectl logs --prefix",
        (),
        None,
    ),
    (
        "plain_text",
        _lines("sources_raw_text.jsonl", "text", lambda v: not _json_text(v)),
        "plain text",
        POD,
        "gpu_oom",
    ),
    (
        "json_app_line",
        _lines("sources_raw_text.jsonl", "text", _json_text),
        "JSON line: application",
        POD,
        None,
    ),
]


@pytest.mark.parametrize(
    ("make", "fmt", "extra", "kind"),
    [pytest.param(*case[1:], id=case[0]) for case in FORMATS],
)
def test_each_supported_format(
    tmp_path: Path,
    make: Callable[[Path], Path],
    fmt: str,
    extra: tuple[str, ...],
    kind: str | None,
) -> None:
    path = make(tmp_path)
    code, out, err = run(str(path), "--json", *extra)
    assert code == 0, err
    doc = json.loads(out)
    records = doc["records"]
    assert records and doc["total"] == len(records)
    read = [r for r in records if "error" not in r]  # a record it rejects says why below
    assert read and all(r["format"].startswith(fmt) for r in read), [
        (r["line"], r["format"]) for r in records
    ]
    for record in records:  # a record gives signals, or says why it gives none
        assert record["signals"] or "error" in record or "note" in record
    if kind is not None:
        assert kind in {s["kind"] for r in records for s in r["signals"]}
    summed = {row["format"]: row for row in doc["summary"]}
    assert sum(row["records"] for row in summed.values()) == len(records)
    code, table, err = run(str(path), *extra)
    assert code == 0, err
    assert fmt in table and "summary per format" in table


def test_examples_table_and_json_agree() -> None:
    code, out, err = run(str(EXAMPLES), "--json", "--limit", "0")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["listed"] == doc["total"] == len(doc["records"]) > 1000
    oom = [s for r in doc["records"] for s in r["signals"] if s["kind"] == "gpu_oom"]
    assert oom and all(s["workload"] == "llm/vllm-llama" for s in oom[:3])
    unattributed = [s for r in doc["records"] for s in r["signals"] if not s["workload"]]
    assert all(s["unattributed"]["reason"] and s["unattributed"]["hint"] for s in unattributed)
    code, table, _ = run(str(EXAMPLES), "--limit", "0")
    assert code == 0
    for row in doc["summary"]:  # the table's summary carries the same counts
        cells = [row["format"], *(str(row[k]) for k in ("records", "signals", "attributed"))]
        assert any(all(cell in line for cell in cells) for line in table.splitlines()), row


def test_rejected_and_unknown_records_say_why(tmp_path: Path) -> None:
    path = tmp_path / "mixed.log"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"
    path.write_bytes(b'{"log": "unterminated\n' + oom.encode() + b"\n\x1b[31mred\x1b[0m\n")
    code, out, err = run(str(path), "--json")
    assert code == 0, err
    first, second, third = json.loads(out)["records"]
    assert (first["format"], first["error"]["reason"]) == ("unreadable", "malformed_json")
    assert second["error"]["reason"] == "unknown_format" and "--pod" in second["error"]["detail"]
    assert third["format"] == "unknown"
    code, table, _ = run(str(path))
    assert code == 0 and "\x1b" not in table  # input control codes never reach the terminal
    code, out, _ = run(str(path), "--json", *POD)
    signals = json.loads(out)["records"][1]["signals"]
    assert [(s["kind"], s["pod"]) for s in signals] == [("gpu_oom", "vllm-0")]


def test_an_unattributed_signal_names_what_would_attribute_it(tmp_path: Path) -> None:
    rows = _rows("sources_ingress_nginx_lines.jsonl")
    path = tmp_path / "access.log"
    path.write_text("\n".join(row["text"] for row in rows) + "\n", encoding="utf-8")
    code, out, err = run(str(path), "--json")
    assert code == 0, err
    signals = [s for r in json.loads(out)["records"] for s in r["signals"]]
    missing = [s for s in signals if not s["workload"]]
    assert missing and all("--workloads" in s["unattributed"]["hint"] or "upstream" in
                           s["unattributed"]["hint"] for s in missing)  # fmt: skip


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    code, _, err = run(str(tmp_path / "nope.log"))
    assert code == 2 and "nope.log" in err
