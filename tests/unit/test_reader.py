"""Recorded files and folders -> (SourcePos, bytes) records."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import SourcePos
from detector.events.reader import LINE_MAX_BYTES, iter_files, read_records, total_bytes


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_lines_positions_blank_lines_and_line_endings(tmp_path: Path) -> None:
    path = _write(tmp_path / "logs.jsonl", b'{"a": 1}\n\n  \r\nsecond\r\nthird')
    records = list(read_records([path]))
    assert records == [
        (SourcePos(str(path), 1), b'{"a": 1}'),
        (SourcePos(str(path), 4), b"second"),
        (SourcePos(str(path), 5), b"third"),
    ]


def test_binary_safe(tmp_path: Path) -> None:
    raw = b"\x00\xff\xfe garbage \x1b[31m\n\x80\x81\n"
    path = _write(tmp_path / "bin.log", raw)
    assert [r for _, r in read_records([path])] == [b"\x00\xff\xfe garbage \x1b[31m", b"\x80\x81"]


@pytest.mark.parametrize(
    "document",
    [
        {"apiVersion": "v1", "kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "a"}}]},
        [{"kind": "Pod"}, {"kind": "Pod"}],
    ],
)
def test_pretty_printed_document_is_one_record(tmp_path: Path, document: object) -> None:
    text = "\n\n" + json.dumps(document, indent=4) + "\n"
    path = _write(tmp_path / "pods.json", text.encode())
    ((source, raw),) = list(read_records([path]))
    assert source == SourcePos(str(path), 1)
    assert json.loads(raw) == document


def test_json_lines_stay_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "events.json", b'{"a": 1}\n{"b": 2}\n')
    assert len(list(read_records([path]))) == 2


def test_truncated_single_json_line_is_one_record(tmp_path: Path) -> None:
    path = _write(tmp_path / "cut.txt", b'{"@timestamp":"2022-09-30T09:27:40Z","log":"at org')
    ((source, raw),) = list(read_records([path]))
    assert source.position == 1
    with pytest.raises(ParseError) as err:
        parse_record(raw, source)
    assert err.value.reason == "malformed_json"


def test_folders_are_walked_sorted_and_filtered(tmp_path: Path) -> None:
    for name in (
        "b/2.log",
        "b/1.log",
        "a.prom",
        "c/d/e.jsonl",
        ".hidden.log",
        ".git/config",
        "README",
        "README.txt",
        "notes.md",
        "x.README.txt",
    ):
        _write(tmp_path / name, b"line\n")
    files = [p.relative_to(tmp_path).as_posix() for p in iter_files([tmp_path])]
    assert files == ["a.prom", "b/1.log", "b/2.log", "c/d/e.jsonl"]
    origins = [s.origin for s, _ in read_records([tmp_path])]
    assert origins == [str(tmp_path / f) for f in files]


def test_files_given_explicitly_are_read_even_if_a_folder_walk_would_skip_them(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "README.md", b"x\n")
    assert [r for _, r in read_records([path])] == [b"x"]


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        list(read_records([missing]))
    with pytest.raises(FileNotFoundError):
        total_bytes([missing])


def test_size_hint(tmp_path: Path) -> None:
    _write(tmp_path / "a.log", b"12345\n")
    _write(tmp_path / "sub" / "b.log", b"123\n")
    _write(tmp_path / "README.md", b"ignored")
    assert total_bytes([tmp_path]) == 10
    assert total_bytes([str(tmp_path)]) == 10


def test_empty_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "empty.log", b"")
    assert list(read_records([path])) == []


def test_a_truncated_first_record_does_not_swallow_the_file(tmp_path: Path) -> None:
    path = tmp_path / "logs.jsonl"
    path.write_bytes(b'{"log": "cut off\n{"log": "a"}\n{"log": "b"}\n')
    records = list(read_records([path]))
    assert [pos.position for pos, _ in records] == [1, 2, 3]
    assert records[0][0].origin == str(path.absolute())


@pytest.mark.parametrize(
    "text",
    [
        "Name:         vllm-0\nNamespace:    llm\nStatus:       Running\n",
        "$ kubectl get pods\nNAME   READY   STATUS   RESTARTS   AGE\n"
        "vllm-0   0/1   Running   0   1m\n",
        "  Warning  BackOff  1s  kubelet  Back-off restarting failed container\n"
        "  Normal  X  1s  k  m\n",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n",
        "  containerStatuses:\n    - name: app\n",
        "Tue Jul 16 10:13:25 2024\n+-----+\n"
        "| NVIDIA-SMI 550.67   Driver Version: 550.67 |\n+---+\n",
        "| NVIDIA-SMI 375.82   Driver Version: 375.82 |\n|---+\n",
    ],
)
def test_human_readable_documents_are_one_record(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path / "paste.txt", ("\n" + text).encode())
    ((source, raw),) = list(read_records([path]))
    assert source == SourcePos(os.path.abspath(path), 1)
    assert raw == ("\n" + text).encode()


@pytest.mark.parametrize(
    "text",
    [
        "Name: a\nsecond line\n",  # Name: without Namespace: is no describe
        "+------+------+\n| col  | col  |\n+------+------+\n",  # an ASCII table, not nvidia-smi
        "status: ok\n",  # one line only
        "2024-01-01T00:00:00Z stdout F hello\n2024-01-01T00:00:01Z stdout F world\n",
    ],
)
def test_other_text_stays_line_based(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path / "log.txt", text.encode())
    assert len(list(read_records([path]))) == text.count("\n")


def test_gzip_files_are_read_as_their_text_whatever_the_name(tmp_path: Path) -> None:
    text = b'{"a": 1}\n\n  \r\nsecond\r\nthird'
    plain = list(read_records([_write(tmp_path / "plain.log", text)]))
    for name in ("rotated.log.gz", "0.log.20240101-000000.gz", "no-suffix.log"):
        path = _write(tmp_path / "gz" / name, gzip.compress(text))
        got = list(read_records([path]))
        assert got == [(SourcePos(str(path), pos.position), raw) for pos, raw in plain]


def test_a_gzipped_document_is_one_record(tmp_path: Path) -> None:
    doc = b'{\n  "kind": "PodList",\n  "items": []\n}\n'
    path = _write(tmp_path / "pods.json.gz", gzip.compress(doc))
    assert list(read_records([path])) == [(SourcePos(str(path), 1), doc)]


def test_a_gzip_file_cut_short_yields_its_lines_up_to_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = [f"line {i} {'x' * 40}".encode() for i in range(2000)]
    whole = gzip.compress(b"\n".join(lines) + b"\n")
    path = _write(tmp_path / "cut.log.gz", whole[: len(whole) // 2])
    got = [raw for _, raw in read_records([path])]
    assert 0 < len(got) < len(lines) and got == lines[: len(got)]
    assert "cut short" in caplog.text


def test_total_bytes_counts_the_text_of_a_gzip_file(tmp_path: Path) -> None:
    text = b"hello world\n" * 1000
    _write(tmp_path / "a.log.gz", gzip.compress(text))
    assert total_bytes([tmp_path]) == len(text)


def test_a_line_over_the_limit_is_cut_and_rejected_without_being_held(tmp_path: Path) -> None:
    long = b"x" * (LINE_MAX_BYTES * 3 + 5)
    path = _write(tmp_path / "long.log.gz", gzip.compress(b"first\n" + long + b"\nlast\n"))
    records = list(read_records([path]))
    assert [(pos.position, len(raw)) for pos, raw in records] == [
        (1, 5),
        (2, LINE_MAX_BYTES),
        (3, 4),
    ]
    with pytest.raises(ParseError) as err:
        parse_record(records[1][1], records[1][0])
    assert err.value.reason == "too_large"
