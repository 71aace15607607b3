"""Fuzz the record parsers and the replay stream: no crash, and nothing good lost.

For each input family, real records (the bundled recordings and the test fixtures of real
lines) are mutated at random — bytes flipped, cut, spliced with binary junk, JSON leaves
replaced by values of the wrong type or size, fields dropped — and then:

1. every mutant goes through ``parse_record``, which may only raise ``ParseError``;
2. the mutants are interleaved with the real records in one stream through
   ``parse_stream``, and every real record must still give exactly the signals it gives
   alone ("nothing good lost").

Run: ``python -m detector.lab.fuzz --records 100000`` (records per family).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detector.errors import ParseError
from detector.events.detect import parse_record
from detector.events.model import Signal, SourcePos
from detector.pipeline import parse_stream

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "unit" / "fixtures"

WEIRD_VALUES: tuple[Any, ...] = (
    None, True, -1, 0, 2**63, -(2**70), 1e308, float("nan"), "", "x" * 70_000, "\ud800",
    "\x00\x01", [], {}, [[[[[]]]]], {"a": {"b": {"c": None}}}, "2099-13-45T99:99:99Z", "-",
)  # fmt: skip


@dataclass
class FamilyResult:
    """What fuzzing one input family found."""

    family: str
    seeds: int
    mutants: int = 0
    rejected: int = 0
    crashes: list[str] = field(default_factory=list)
    good_lost: int = 0
    seconds: float = 0.0


def families() -> dict[str, list[bytes]]:
    """Return the real seed records per input family."""

    def lines(*globs: str) -> list[bytes]:
        out: list[bytes] = []
        for pattern in globs:
            for path in sorted(EXAMPLES.glob(pattern)):
                out += [line for line in path.read_bytes().splitlines() if line.strip()]
        return out

    def fixture(name: str, key: str) -> list[bytes]:
        path = FIXTURES / name
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        values = [row[key] for row in rows if key in row]
        return [v.encode() if isinstance(v, str) else json.dumps(v).encode() for v in values]

    events = lines("*/k8s-events.jsonl") + fixture("sources_k8s_events.jsonl", "event")
    pods = lines("*/k8s-pods.jsonl") + fixture("sources_k8s_pods.jsonl", "pod")
    samples = lines("*/gpu-metrics.jsonl") + fixture("sources_prom_kafka_adapter.jsonl", "record")
    found = {
        "fluent-bit container logs": lines("*/container-logs.jsonl"),
        "ingress-nginx access (in fluent-bit)": lines("*/lb-access.jsonl"),
        "kubernetes events": events,
        "kubernetes pods": pods,
        "prometheus-kafka-adapter": samples,
        "vector / other envelopes": fixture("sources_envelopes.jsonl", "record"),
        "bare ingress-nginx lines": fixture("sources_ingress_nginx_lines.jsonl", "text"),
        "exposition lines": fixture("sources_dcgm_lines.jsonl", "text"),
        "envoy, istio, alb, gcp, haproxy lines": fixture("sources_lb_lines.jsonl", "text"),
        "prometheus 5xx counters": fixture("sources_lb_prometheus.jsonl", "text"),
        "cri lines": fixture("sources_cri_lines.jsonl", "text"),
        "docker json-file": fixture("sources_docker_json.jsonl", "record"),
        "nvidia-smi csv": fixture("sources_nvidia_smi.jsonl", "text"),
        "engine /metrics": fixture("sources_engine_metrics.jsonl", "text"),
    }
    return {name: seeds for name, seeds in found.items() if seeds}


def mutate(raw: bytes, rng: random.Random) -> bytes:
    """Return one random mutant of ``raw``."""
    return rng.choice(_MUTATORS)(raw, rng)


def _flip(raw: bytes, rng: random.Random) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def _cut(raw: bytes, rng: random.Random) -> bytes:
    return raw[: rng.randrange(len(raw))]


def _splice(raw: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(raw) + 1)
    junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return raw[:at] + junk + raw[at:]


def _json_leaf(raw: bytes, rng: random.Random) -> bytes:
    try:
        obj = json.loads(raw)
    except ValueError:
        return _flip(raw, rng)
    for _ in range(rng.randint(1, 3)):
        obj = _replace_random(obj, rng)
    return json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")


def _drop_token(raw: bytes, rng: random.Random) -> bytes:
    parts = raw.split(b" ")
    if len(parts) > 1:
        del parts[rng.randrange(len(parts))]
    return b" ".join(parts)


_MUTATORS: tuple[Callable[[bytes, random.Random], bytes], ...] = (
    _flip, _cut, _splice, _json_leaf, _json_leaf, _drop_token,
)  # fmt: skip


def _replace_random(node: Any, rng: random.Random, depth: int = 0) -> Any:
    if isinstance(node, dict) and node and depth < 8:
        key = rng.choice(list(node))
        if rng.random() < 0.15:
            return {k: v for k, v in node.items() if k != key}  # drop a field
        return {**node, key: _replace_random(node[key], rng, depth + 1)}
    if isinstance(node, list) and node and depth < 8:
        i = rng.randrange(len(node))
        return [*node[:i], _replace_random(node[i], rng, depth + 1), *node[i + 1 :]]
    return rng.choice(WEIRD_VALUES)


def fuzz_family(name: str, seeds: list[bytes], records: int, seed: int) -> FamilyResult:
    """Fuzz one family with ``records`` mutants; check crashes and lost good records."""
    rng = random.Random(f"{name}/{seed}")
    result = FamilyResult(name, len(seeds))
    # The real records go up and down in event time (a stream with late records, never a
    # wrap-around jump of years), so the stream clock sees real streams.
    seeds = sorted(seeds, key=_first_time)
    seeds += seeds[::-1]
    alone = [_signals_alone(raw) for raw in seeds]
    started = time.perf_counter()
    stream: list[tuple[SourcePos, bytes]] = []
    for i in range(records):
        good = i % len(seeds)
        mutant = mutate(seeds[good], rng)
        stream.append((SourcePos("good", good), seeds[good]))
        stream.append((SourcePos("mutant", i), mutant))
        result.mutants += 1
        try:
            parse_record(mutant, SourcePos("mutant", i))
        except ParseError:
            result.rejected += 1
        except Exception as exc:  # the finding we are looking for
            result.crashes.append(f"{type(exc).__name__}: {exc!s:.200} <- {mutant[:300]!r}")
    intact = 0
    for parsed in _stream(stream):
        if parsed.source.origin == "good" and parsed.error is None:
            intact += _key(parsed.signals) == alone[parsed.source.position]
    result.good_lost = sum(alone[i % len(seeds)] is not None for i in range(records)) - intact
    result.seconds = time.perf_counter() - started
    return result


def _stream(records: list[tuple[SourcePos, bytes]]) -> Iterator[Any]:
    try:
        yield from parse_stream(records)
    except Exception as exc:
        raise AssertionError(f"the stream itself crashed: {exc!r}") from exc


def _signals_alone(raw: bytes) -> list[tuple[Any, ...]] | None:
    try:
        return _key(parse_record(raw, SourcePos("good", 0)))
    except ParseError:
        return None  # a seed that is itself rejected (a truncated real sample) is not "good"


def _first_time(raw: bytes) -> float:
    try:
        signals = parse_record(raw, SourcePos("good", 0))
    except ParseError:
        return 0.0
    return signals[0].time if signals else 0.0


def _key(signals: list[Signal]) -> list[tuple[Any, ...]]:
    return [(s.kind, s.time, s.pod, repr(sorted(s.attrs.items()))) for s in signals]


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer over every family and print one line per family; 1 on any finding."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="mutants per family")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    failed = False
    print(f"{'family':<40} {'seeds':>6} {'mutants':>9} {'rejected':>9} {'crashes':>8} "
          f"{'good lost':>9} {'seconds':>8}")  # fmt: skip
    for name, seeds in families().items():
        r = fuzz_family(name, seeds, args.records, args.seed)
        print(f"{r.family:<40} {r.seeds:>6} {r.mutants:>9,} {r.rejected:>9,} "
              f"{len(r.crashes):>8} {r.good_lost:>9} {r.seconds:>8.1f}")  # fmt: skip
        for crash in r.crashes[:5]:
            print(f"    crash: {crash}")
        failed |= bool(r.crashes or r.good_lost)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
