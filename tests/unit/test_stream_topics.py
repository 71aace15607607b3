"""Which topic `detector produce` puts a recorded file on, told from its records' format."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.config import Settings
from detector.errors import ConfigError
from detector.events.detect import parse_record
from detector.events.model import SourcePos
from detector.events.streams import Stream, file_stream, stream_of
from detector.stream.app import file_topics, merged_records

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOPICS = ["logs", "events", "lb", "metrics"]


def _stream(line: str) -> Stream:
    (signal, *_) = parse_record(line, SourcePos("t", 1))
    return stream_of(signal)


@pytest.mark.parametrize(
    ("line", "stream"),
    [
        (  # a proxy's access line names its upstream: the load balancer's stream
            '10.0.0.1 - - [14/Mar/2025:09:00:16 +0000] "POST /v1/completions HTTP/1.1" 502 0 '
            '"-" "curl" 300 0.5 [llm-vllm-llama-8000] [] 10.0.1.21:8000 0 0.5 502 abc',
            Stream.LB,
        ),
        (  # a web server's own access line names none: that pod's log
            '10.0.3.10 - - [14/Mar/2025:09:00:16 +0000] "GET / HTTP/1.1" 200 5 "-" "curl" "-"',
            Stream.LOGS,
        ),
        ("DCGM_FI_DEV_FB_USED{pod=\"p\",namespace=\"llm\",gpu=\"0\"} 79000 1741942800000",
         Stream.METRICS),
    ],
)  # fmt: skip
def test_a_signal_tells_its_stream(line: str, stream: Stream) -> None:
    assert _stream(line) == stream


def test_most_records_decide_and_silent_records_do_not_vote() -> None:
    logs = parse_record((EXAMPLES / "cascade" / "container-logs.jsonl").read_text().split("\n")[0],
                        SourcePos("t", 1))  # fmt: skip
    assert file_stream([[], []]) is None
    oom = parse_record(
        '{"log": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", '
        '"kubernetes": {"pod_name": "vllm-0", "namespace_name": "llm"}, "@timestamp": 1.7e9}',
        SourcePos("t", 1),
    )
    assert logs == [] and file_stream([logs, oom, []]) is Stream.LOGS


def test_each_bundled_file_goes_to_its_stream_topic() -> None:
    cascade, host_oom = EXAMPLES / "cascade", EXAMPLES / "host-oom"
    placed = file_topics([cascade, host_oom / "k8s-pods.jsonl", host_oom / "container-logs.jsonl"],
                         TOPICS)  # fmt: skip
    assert {path.relative_to(EXAMPLES).as_posix(): topic for path, topic in placed.items()} == {
        "cascade/container-logs.jsonl": "logs",
        "cascade/gpu-metrics.jsonl": "metrics",
        "cascade/k8s-events.jsonl": "events",
        "cascade/lb-access.jsonl": "lb",  # Fluent Bit records of ingress-nginx's access log
        "host-oom/k8s-pods.jsonl": "events",
        "host-oom/container-logs.jsonl": "logs",  # a web frontend's own access lines
    }


def test_a_file_it_cannot_place_names_the_file_and_topic(tmp_path: Path) -> None:
    quiet = tmp_path / "quiet.log"
    quiet.write_text("just some text\nmore text\n")
    with pytest.raises(ConfigError, match=r"quiet\.log belongs to .*: give --topic"):
        file_topics([EXAMPLES / "cascade" / "k8s-events.jsonl", quiet], TOPICS)
    with pytest.raises(ConfigError, match=r"3 topics configured.*give --topic"):
        file_topics([EXAMPLES / "cascade" / "k8s-events.jsonl"], TOPICS[:3])


def test_files_are_merged_in_event_time_each_on_its_topic() -> None:
    cascade = EXAMPLES / "cascade"
    files = file_topics([cascade], TOPICS)
    merged = list(merged_records(files, Settings()))
    times = [ts for _, _, _, ts in merged]
    assert None not in times and times == sorted(times)
    for path, topic in files.items():
        assert [v for t, _, v, _ in merged if t == topic] == path.read_bytes().splitlines()
    keys = {key for topic, key, _, _ in merged if topic == "events" and key is not None}
    assert keys == {b"llm/vllm-llama"}
