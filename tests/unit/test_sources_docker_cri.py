"""CRI log lines, Docker json-file lines and the kubelet log paths that name their pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import LogLine, SignalKind, SourcePos
from detector.events.reader import read_records
from detector.events.sources.cri import identity_from_log_path, parse_cri_line
from detector.events.sources.docker_json import parse_docker_record
from detector.events.sources.raw_text import LogIdentity
from detector.events.sources.timeparse import parse_iso8601

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
POD_LOG = (
    "/var/log/pods/llm_vllm-llama-7d9f8b6c5d-x2kqz_32283a8b-c42f-4552-90e0-fe3cc13564d4/vllm/0.log"
)
SYMLINK = (
    "/var/log/containers/vllm-llama-7d9f8b6c5d-x2kqz_llm_vllm-"
    "c4ce823e84a7c2a55add12c97bfd0fc921167161d5dc358336ac1eb6b7cb42ab.log"
)
IDENTITY = ("llm", "vllm-llama-7d9f8b6c5d-x2kqz", "vllm")
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 1.02 GiB is free."
)


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def _identity(line: LogLine) -> tuple[str | None, str | None, str | None]:
    return line.namespace, line.pod, line.container


# --- CRI ---------------------------------------------------------------------------------


@pytest.mark.parametrize("row", _rows("sources_cri_lines.jsonl"), ids=lambda r: r["text"][:40])
def test_real_cri_lines(row: dict[str, Any]) -> None:
    expect = row["expect"]
    line = parse_cri_line(row["text"].strip(), POD_LOG)
    assert line is not None
    assert line.text == expect["text"]
    assert line.stream == expect["stream"]
    assert line.time == pytest.approx(parse_iso8601(expect["time"]), abs=1e-6)
    assert _identity(line) == IDENTITY


@pytest.mark.parametrize("row", _rows("sources_cri_lines.jsonl"), ids=lambda r: r["text"][:40])
def test_real_cri_lines_through_detect(row: dict[str, Any]) -> None:
    """A bare CRI line is a known format, with or without an identity in its path."""
    with_path = parse_record(row["text"].encode(), SourcePos(POD_LOG, 1))
    without = parse_record(row["text"].encode(), SourcePos("containers-topic", 1))
    assert [s.kind for s in with_path] == [s.kind for s in without]
    assert SignalKind.GPU_OOM not in [s.kind for s in with_path]
    assert all((s.namespace, s.pod) == IDENTITY[:2] for s in with_path)
    assert all(s.pod is None for s in without)


@pytest.mark.parametrize(
    ("origin", "identity"),
    [
        (POD_LOG, IDENTITY),
        (SYMLINK, IDENTITY),
        (POD_LOG + ".20240501-100000", IDENTITY),  # rotated by the kubelet
        ("containers", (None, None, None)),  # a Kafka topic: the line names no pod
    ],
)
def test_cri_oom_line_identity_from_the_path(origin: str, identity: tuple[str | None, ...]) -> None:
    (sig,) = parse_record(f"2024-05-01T10:00:00.123456789Z stderr F {OOM}", SourcePos(origin, 3))
    assert sig.kind is SignalKind.GPU_OOM
    assert (sig.namespace, sig.pod, sig.container) == identity
    assert sig.time == pytest.approx(parse_iso8601("2024-05-01T10:00:00.123456Z"))
    assert sig.text == OOM


def test_cri_line_without_path_identity_takes_the_given_identity() -> None:
    given_identity = LogIdentity("llm", "vllm-0", "vllm", workload="StatefulSet/vllm")
    line = f"2024-05-01T10:00:00Z stderr F {OOM}"
    (sig,) = parse_record(line, SourcePos("topic", 1), identity=given_identity)
    assert (sig.namespace, sig.pod, sig.owner) == ("llm", "vllm-0", ("StatefulSet", "vllm"))
    (sig,) = parse_record(line, SourcePos(POD_LOG, 1), identity=given_identity)
    assert (sig.namespace, sig.pod) == IDENTITY[:2]  # the kubelet's path wins


def test_partial_fragments_stay_lines_of_their_own() -> None:
    """The parser is per record: a P fragment is not joined with the F line that ends it."""
    head, tail = OOM[:40], OOM[40:]
    first = parse_cri_line(f"2024-05-01T10:00:00Z stderr P {head}", POD_LOG)
    last = parse_cri_line(f"2024-05-01T10:00:00Z stderr F {tail}", POD_LOG)
    assert first is not None and last is not None
    assert (first.text, last.text) == (head, tail)


@pytest.mark.parametrize(
    "text",
    [
        "2024-05-01T10:00:00Z stdin F x",  # not a stream
        "2024-05-01 10:00:00 stderr F x",  # not RFC 3339
        "2024-05-01T10:00:00Z INFO started",  # kubectl logs --timestamps
        "2024-05-01T10:00:00 stderr F x",  # no offset
        "10.0.0.9 - - [17/Dec/2024:10:00:01 +0000] GET",
    ],
)
def test_not_cri_lines(text: str) -> None:
    assert parse_cri_line(text, POD_LOG) is None


def test_cri_line_with_an_impossible_date() -> None:
    with pytest.raises(ParseError) as err:
        parse_cri_line("2024-13-45T10:00:00Z stderr F x", POD_LOG)
    assert err.value.reason == "bad_timestamp"


def test_corpus_cri_file() -> None:
    """The corpus's CRI lines parse (no signal: nginx debug/error lines), position by position."""
    path = CORPUS / "envelopes" / "cri_log_lines.log"
    if not path.exists():
        pytest.skip(f"corpus not found at {CORPUS}")
    records = list(read_records([path]))
    assert len(records) == 2
    for source, raw in records:
        line = parse_cri_line(raw.decode(), source.origin)
        assert line is not None and line.stream == "stderr" and line.pod is None
        assert line.text.startswith("2024/03/26 15:21:04 [")
        kinds = [s.kind for s in parse_record(raw, source)]  # nginx lines: LB hooks may count
        assert set(kinds) <= {SignalKind.LB_RESPONSE}


# --- kubelet paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row", _rows("sources_kubelet_paths.jsonl"), ids=lambda r: r["path"].rsplit("/", 1)[-1][:40]
)
def test_real_kubelet_paths(row: dict[str, Any]) -> None:
    assert identity_from_log_path(row["path"]) == tuple(row["expect"])


@pytest.mark.parametrize(
    ("path", "identity"),
    [
        ("C:\\var\\log\\pods\\llm_vllm-0_uid\\vllm\\0.log", ("llm", "vllm-0", "vllm")),
        ("/tmp/copy/llm_vllm-0_uid/vllm/12.log.gz", ("llm", "vllm-0", "vllm")),
        ("/var/log/pods/llm_vllm-0/vllm/0.log", (None, None, None)),  # no uid part
        ("/var/log/pods/llm_vllm-0_uid/vllm/notes.txt", (None, None, None)),
        ("", (None, None, None)),
        ("/" * 5000, (None, None, None)),
    ],
)
def test_kubelet_path_edge_cases(path: str, identity: tuple[str | None, ...]) -> None:
    assert identity_from_log_path(path) == identity


# --- Docker json-file ---------------------------------------------------------------------


@pytest.mark.parametrize("row", _rows("sources_docker_json.jsonl"), ids=lambda r: r["source"][19:])
def test_real_docker_json_lines(row: dict[str, Any]) -> None:
    expect = row["expect"]
    line = parse_docker_record(json.loads(row["record"]), SYMLINK)
    assert (line.text, line.stream) == (expect["text"], expect["stream"])
    assert line.time == pytest.approx(parse_iso8601(expect["time"]), abs=1e-6)
    assert _identity(line) == IDENTITY
    signals = parse_record(row["record"], SourcePos(SYMLINK, 1))
    assert [s.kind.value for s in signals] == expect["kinds"]


@pytest.mark.parametrize(
    ("origin", "record", "identity"),
    [
        (SYMLINK, {}, IDENTITY),
        (POD_LOG, {}, IDENTITY),
        ("/var/lib/docker/containers/c4ce/c4ce-json.log", {}, (None, None, None)),
        ("topic", {"file": POD_LOG}, IDENTITY),  # Fluent Bit Path_Key / Vector "file"
        ("topic", {"path": SYMLINK}, IDENTITY),
        (
            "topic",
            {
                "attrs": {
                    "io.kubernetes.pod.name": "vllm-llama-7d9f8b6c5d-x2kqz",
                    "io.kubernetes.pod.namespace": "llm",
                    "io.kubernetes.container.name": "vllm",
                }
            },
            IDENTITY,
        ),  # docker --log-opt labels=io.kubernetes.pod.name,...
        ("topic", {"attrs": {"tag": "orders"}}, (None, None, None)),
        ("topic", {"attrs": "x", "file": 5}, (None, None, None)),
    ],
)
def test_docker_identity_sources(
    origin: str, record: dict[str, Any], identity: tuple[str | None, ...]
) -> None:
    record = {"log": OOM + "\n", "stream": "stderr", "time": "2024-05-01T10:00:00Z", **record}
    (sig,) = parse_record(json.dumps(record), SourcePos(origin, 1))
    assert sig.kind is SignalKind.GPU_OOM
    assert (sig.namespace, sig.pod, sig.container) == identity


def test_fluent_bit_records_keep_their_metadata() -> None:
    """A real Fluent Bit record names its pod itself; its path-like fields do not override."""
    k8s = {"pod_name": "vllm-0", "namespace_name": "llm", "container_name": "vllm", "host": "n1"}
    record = {"@timestamp": 1.5, "log": OOM, "kubernetes": k8s, "file": POD_LOG}
    (sig,) = parse_record(json.dumps(record), SourcePos(SYMLINK, 1))
    assert (sig.namespace, sig.pod, sig.container, sig.node) == ("llm", "vllm-0", "vllm", "n1")
    assert sig.time == 1.5


def test_docker_line_without_identity_falls_back_to_the_given_one() -> None:
    record = json.dumps({"log": OOM, "stream": "stderr", "time": "2024-05-01T10:00:00Z"})
    (sig,) = parse_record(record, SourcePos("x", 1), identity=LogIdentity("llm", "vllm-0"))
    assert (sig.namespace, sig.pod) == ("llm", "vllm-0")
    (sig,) = parse_record(record, SourcePos(SYMLINK, 1), identity=LogIdentity("llm", "vllm-0"))
    assert sig.pod == IDENTITY[1]


# --- any input: ParseError or a result, never another exception ---------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet="0123456789-:.TZ+ stdoutrerPF\r", max_size=80), st.text(max_size=40))
def test_cri_any_text(text: str, origin: str) -> None:
    try:
        line = parse_cri_line(text, origin)
    except ParseError as exc:
        assert exc.reason == "bad_timestamp"
        return
    assert line is None or isinstance(line.time, float)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="/\\_-.abc0123456789fl", max_size=120))
def test_kubelet_path_any_text(path: str) -> None:
    identity = identity_from_log_path(path)
    assert len(identity) == 3 and all(v is None or isinstance(v, str) for v in identity)


_VALUES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_RECORDS = st.dictionaries(
    st.sampled_from(["log", "stream", "time", "@timestamp", "attrs", "file", "path", "date"]),
    _VALUES | st.dictionaries(st.text(max_size=30), _VALUES, max_size=3),
    max_size=6,
)


@settings(max_examples=400, deadline=None)
@given(_RECORDS, st.sampled_from([SYMLINK, "topic", ""]), st.sampled_from([None, 1.0]))
def test_docker_any_record(record: dict[str, Any], origin: str, default: float | None) -> None:
    try:
        line = parse_docker_record(record, origin, default_time=default)
    except ParseError as exc:
        assert exc.reason in ("missing_field", "bad_timestamp")
        return
    assert isinstance(line.text, str) and isinstance(line.time, float)
