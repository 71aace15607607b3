"""The replay pipeline on the real store: bad records become dead letters, nothing is lost."""

from __future__ import annotations

import shutil
from pathlib import Path

from detector import db
from detector.config import Settings
from detector.incidents import service
from detector.pipeline import replay

REPO = Path(__file__).resolve().parents[2]
CASCADE = REPO / "examples" / "cascade"

GARBAGE = [
    b'{"log": "truncated',  # truncated JSON
    b"\xff\xfe\x00binary\x00bytes",  # not UTF-8
    b"plain text nobody knows",  # unknown format
    b'{"kubernetes": {}}',  # envelope without its line
    b'{"log": "' + b"A" * (2 * 2**20) + b'"}',  # a 2 MiB line
]


def _with_garbage(tmp_path: Path) -> Path:
    """Copy the cascade recording and splice bad records between its good ones."""
    out = tmp_path / "cascade"
    shutil.copytree(CASCADE, out)
    logs = out / "container-logs.jsonl"
    lines = logs.read_bytes().splitlines()
    spliced: list[bytes] = []
    for i, line in enumerate(lines):
        spliced.append(line)
        if i % 200 == 0:
            spliced.append(GARBAGE[(i // 200) % len(GARBAGE)])
    logs.write_bytes(b"\n".join(spliced) + b"\n")
    return out


def _settings(url: str) -> Settings:
    settings = Settings()
    settings.database.url = url
    return settings


def test_bad_records_are_dead_lettered_and_the_cascade_is_still_found(
    tmp_path: Path, sqlite_url: str
) -> None:
    clean = replay([CASCADE], _settings(f"sqlite:///{tmp_path / 'clean.db'}"))
    dirty = replay([_with_garbage(tmp_path)], _settings(sqlite_url))
    added = dirty.events.read - clean.events.read
    assert added > 0
    assert dirty.events.rejected == added
    assert dirty.events.parsed == clean.events.parsed
    assert len(dirty.incidents) == 1
    assert [v.pod for v in dirty.incidents[0].victims] == [
        v.pod for v in clean.incidents[0].victims
    ]
    engine = db.make_engine(sqlite_url)
    try:
        with db.session_factory(engine)() as session:
            assert service.count_dead_letters(session=session) == added
            reasons = {d.reason for d in service.list_dead_letters(session=session)}
    finally:
        engine.dispose()
    assert {"malformed_json", "unknown_format"} <= reasons


def test_replay_is_idempotent_on_postgresql(postgres_url: str) -> None:
    first = replay([CASCADE], _settings(postgres_url))
    second = replay([CASCADE], _settings(postgres_url))
    assert [i.id for i in first.incidents] == [i.id for i in second.incidents]
    assert len(second.incidents[0].timeline) == len(first.incidents[0].timeline)
    assert len(second.incidents[0].evidence) == len(first.incidents[0].evidence)


def test_a_record_from_the_far_future_does_not_stall_its_stream(
    tmp_path: Path, sqlite_url: str
) -> None:
    out = tmp_path / "cascade"
    shutil.copytree(CASCADE, out)
    logs = out / "container-logs.jsonl"
    lines = logs.read_bytes().splitlines()
    at = next(i for i, line in enumerate(lines) if b"non-default args" in line)
    wild = lines[at].replace(b'"@timestamp":17', b'"@timestamp":27', 1)  # 317 years ahead
    assert wild != lines[at]
    logs.write_bytes(b"\n".join([*lines[: at + 1], wild, *lines[at + 1 :]]) + b"\n")
    result = replay([out], _settings(sqlite_url))
    assert result.events.rejected_by_reason == {"timestamp_out_of_range": 1}
    assert len(result.incidents) == 1 and len(result.incidents[0].victims) == 4
