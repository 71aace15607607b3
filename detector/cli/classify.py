"""``detector classify``: the GPU OOM classifier on log lines, log streams or a labelled corpus.

Input, from files or standard input (no PATH, or ``-``): one record per line, either a log line
or a JSON object with a ``text`` field (or a shipper's ``log`` / ``message``; optionally ``id``
and, for ``--report``, ``expect``).
Output: JSON lines on standard output, or one JSON document with ``--report``.

- default: one object per input line: ``file``, ``line``, ``id`` (if given), ``gpu_oom`` (true,
  false or "ambiguous"), ``verdict``, ``framework``, ``reason``, ``bytes_tried``,
  ``capacity_bytes``, ``free_bytes``, ``gpu_index`` (null where unknown), ``quoted`` when the OOM
  text is another component's HTTP error body, ``accelerator`` and ``sharing_layer`` when the
  line shows them; a malformed line gives ``error`` instead.
- ``--multiline``: each file is one log stream; one object per OOM event (its first OOM line,
  wrapped messages joined, repeats merged; see ``detector.events.multiline``) with ``excerpt``.
- ``--report``: precision and recall for gpu_oom and a confusion table over rows labelled with
  ``expect`` (labels of the shared corpus: gpu_oom, engine_dead_*, not_gpu_oom, ambiguous).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from detector.cli.exits import interruptible
from detector.events.classify import NUMBER_FIELDS, Classification, OomClass
from detector.events.detect import MAX_RECORD_BYTES
from detector.events.multiline import OomHit, classify_record, find_ooms_numbered
from detector.textsafe import printable, printable_json

MAX_LINE_BYTES = MAX_RECORD_BYTES  # a longer line is too_large, as replay and run say
EXCERPT_CHARS = 300  # --multiline prints this much of each OOM's text
TEXT_KEYS = ("text", "log", "message")  # a JSON record's line, in order of preference
MAX_MISMATCHES = 50  # --report lists at most this many misclassified rows
DEVICE_FIELDS = ("accelerator", "sharing_layer")  # given when the line shows them


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One input line: where it came from, its text, or why it could not be read."""

    file: str
    line: int
    text: str | None = None
    error: str | None = None
    ref: Any = None  # the JSON object's "id", echoed back
    expect: str | None = None  # the JSON object's "expect" label (--report)


@interruptible
def classify_cmd(
    paths: Annotated[
        list[str] | None, typer.Argument(help="log or JSON-lines files; none or - for stdin")
    ] = None,
    multiline: Annotated[
        bool, typer.Option("--multiline", help="read each file as one log stream")
    ] = False,
    report: Annotated[
        bool, typer.Option("--report", help="precision/recall over an 'expect'-labelled corpus")
    ] = False,
) -> None:
    """Classify log lines as GPU OOM or not; print JSON lines (or a report with --report).

    Known wordings (PyTorch, vLLM, TGI, SGLang, TensorRT, TensorFlow, JAX...)
    are read with their numbers. Any other line is a GPU/accelerator OOM by
    its shape, whatever the vendor: an allocation-failure phrase (out of
    memory, OOM, OutOfMemory, RESOURCE_EXHAUSTED, allocation failed, failed
    to allocate, cannot allocate, not enough space to allocate, insufficient
    memory, *_OUT_OF_DEVICE_MEMORY, *_ALLOCATION_FAILURE) together with
    evidence that the memory is an accelerator's: a device/DRAM/HBM/VRAM/pool
    word, a device index (GPU 0, CUDA0, device:DML:0), or an accelerator API
    or runtime (CUDA, ROCm/HIP, TPU/XLA, Gaudi/HPU, Ascend/NPU/CANN,
    Tenstorrent, Metal, Vulkan, SYCL/Level Zero, DirectML, OpenCL, TensorRT).
    An out-of-memory phrase without that evidence is "ambiguous", and so is
    a wrapper that re-raises an OOM whose cause is on another line (Ray's
    RayTaskError(OutOfMemoryError)). Host look-alikes (OOM killer,
    OOMKilled, Java/JavaScript heap, MemoryError, ENOMEM, Ray's node memory
    monitor, pinned host memory) and lines of a scheduler that recovers on
    its own (SGLang's retracted requests, a retried smaller batch, a skipped
    TensorRT tactic) are not GPU OOMs. A GPU OOM row also names the
    accelerator family and a GPU-sharing layer (HAMi) when the line shows one.
    """
    sources = paths or ["-"]
    out = sys.stdout
    try:
        with ExitStack() as stack:
            streams = [(name, _open(name, stack)) for name in sources]
            if report:
                doc = build_report(rec for name, f in streams for rec in read_records(name, f))
                out.write(json.dumps(doc, indent=2) + "\n")
                return
            for name, stream in streams:
                records = read_records(name, stream)
                rows = multiline_rows(name, records) if multiline else map(line_row, records)
                for row in rows:
                    # DEL, C1 and bidi controls as \uXXXX too: json.dumps leaves them raw
                    out.write(printable_json(json.dumps(row, ensure_ascii=False)) + "\n")
    except BrokenPipeError as exc:  # the reader went away (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(1) from exc
    except OSError as exc:
        typer.echo(printable(f"error: {exc}"), err=True)
        raise typer.Exit(2) from exc


def _open(name: str, stack: ExitStack) -> IO[bytes]:
    if name == "-":
        return sys.stdin.buffer
    return stack.enter_context(Path(name).open("rb"))


def read_records(name: str, stream: IO[bytes]) -> Iterator[InputRecord]:
    """Yield one ``InputRecord`` per line of ``stream``; bad lines carry ``error``, never raise.

    Errors: a line over ``MAX_LINE_BYTES`` without its line ending (``too_large: N bytes >
    MAX``, what ``replay`` and ``run`` call it; the line is counted, never held), binary (a NUL
    byte), invalid UTF-8, malformed JSON (a line starting with ``{``), a JSON object without a
    string ``text``.
    """
    line_no = 0
    while raw := stream.readline(MAX_LINE_BYTES + 2):  # room for the line and its \r\n
        line_no += 1
        size, last = len(raw), raw
        while not last.endswith(b"\n") and (rest := stream.readline(MAX_LINE_BYTES)):
            size, last = size + len(rest), rest  # count the rest of an oversized line
        ending = 2 if last.endswith(b"\r\n") else 1 if last.endswith(b"\n") else 0
        if size - ending > MAX_LINE_BYTES:
            too_large = f"too_large: {size - ending} bytes > {MAX_LINE_BYTES}"
            yield InputRecord(name, line_no, error=too_large)
        else:
            yield _record(name, line_no, raw[: len(raw) - ending])


def _record(name: str, line_no: int, raw: bytes) -> InputRecord:
    if b"\x00" in raw:
        return InputRecord(name, line_no, error="binary line (NUL byte)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return InputRecord(name, line_no, error=f"invalid UTF-8 at byte {exc.start}")
    if not text.lstrip().startswith("{"):
        return InputRecord(name, line_no, text=text)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return InputRecord(name, line_no, error=f"malformed JSON: {str(exc)[:120]}")
    body = _text_of(obj)
    if body is None:
        return InputRecord(name, line_no, error='JSON object without a string "text" field')
    ref = obj.get("id") if isinstance(obj.get("id"), str | int) else None
    expect = obj.get("expect") if isinstance(obj.get("expect"), str) else None
    return InputRecord(name, line_no, text=body, ref=ref, expect=expect)


def _text_of(obj: Any) -> str | None:
    """Return a JSON record's line: ``text``, else a shipper's ``log`` (Fluent Bit, Docker)
    or ``message`` (Vector), without a trailing newline; ``None`` when there is none.
    """
    if not isinstance(obj, dict):
        return None
    for key in TEXT_KEYS:
        value = obj.get(key)
        if isinstance(value, str):
            return value.removesuffix("\n").removesuffix("\r")
    return None


def line_row(record: InputRecord) -> dict[str, Any]:
    """Return the output object for one input line: its reference and its verdict."""
    if record.text is None:
        return {**_ref(record), "error": record.error, **_fields(None)}
    return {**_ref(record), **_fields(classify_record(record.text).classification)}


def multiline_rows(name: str, records: Iterator[InputRecord]) -> Iterator[dict[str, Any]]:
    """Read one file's records as a single log stream; yield one object per OOM event.

    A JSON record's text may hold several lines (they share its line number); an unreadable
    line is reported with ``error`` and read as an empty line of the stream.
    """
    errors: list[InputRecord] = []

    def lines() -> Iterator[tuple[int, str]]:
        for record in records:
            if record.text is None:
                errors.append(record)
            for part in (record.text or "").split("\n"):
                yield record.line, part

    for hit in find_ooms_numbered(lines()):
        yield from (line_row(bad) for bad in errors)
        errors.clear()
        yield _hit_row(name, hit)
    yield from (line_row(bad) for bad in errors)


def _hit_row(file: str, hit: OomHit) -> dict[str, Any]:
    excerpt = hit.text[:EXCERPT_CHARS]
    return {"file": file, "line": hit.line_no, **_fields(hit.classification), "excerpt": excerpt}


def _ref(record: InputRecord) -> dict[str, Any]:
    ref: dict[str, Any] = {"file": record.file, "line": record.line}
    if record.ref is not None:
        ref["id"] = record.ref
    return ref


def _fields(verdict: Classification | None) -> dict[str, Any]:
    if verdict is None:
        return {"gpu_oom": None, "verdict": None, "framework": None, "reason": None}
    fields: dict[str, Any] = {
        "gpu_oom": _gpu_oom_value(verdict.verdict),
        "verdict": verdict.verdict.value,
        "framework": verdict.framework,
        "reason": verdict.reason,
    }
    fields.update({key: getattr(verdict, key) for key in NUMBER_FIELDS})
    if verdict.quoted:
        fields["quoted"] = True
    for key in DEVICE_FIELDS:
        if getattr(verdict, key) is not None:
            fields[key] = getattr(verdict, key)
    return fields


def _gpu_oom_value(verdict: OomClass) -> bool | str:
    if verdict is OomClass.AMBIGUOUS:
        return "ambiguous"
    return verdict is OomClass.GPU_OOM


def label_group(expect: str) -> str | None:
    """Map a corpus ``expect`` label to the verdict it asks for; ``None`` if unknown.

    gpu_oom -> gpu_oom; engine_dead_* -> engine_dead; not_gpu_oom -> not_gpu_oom (satisfied by
    any verdict but gpu_oom); ambiguous -> ambiguous. Labels: shared corpus README.
    """
    if expect.startswith("engine_dead"):
        return OomClass.ENGINE_DEAD.value
    known = (OomClass.GPU_OOM, OomClass.NOT_GPU_OOM, OomClass.AMBIGUOUS)
    return expect if expect in {v.value for v in known} else None


def build_report(records: Iterator[InputRecord]) -> dict[str, Any]:
    """Score the classifier on labelled records: gpu_oom precision/recall and a confusion table.

    Rows labelled ``ambiguous`` are kept out of precision and recall (the line alone cannot
    decide) and shown in the table; ``label_agreement`` counts rows whose verdict satisfies the
    label. Unlabelled and unreadable rows are only counted.
    """
    confusion: dict[str, Counter[str]] = {}
    counts: Counter[str] = Counter()
    mismatches: list[dict[str, Any]] = []
    for record in records:
        group = label_group(record.expect) if record.expect else None
        if record.text is None or group is None:
            counts["errors" if record.text is None else "unlabelled"] += 1
            continue
        verdict = classify_record(record.text).classification.verdict.value
        confusion.setdefault(group, Counter())[verdict] += 1
        agrees = verdict == group or (group == "not_gpu_oom" and verdict != "gpu_oom")
        counts["rows"] += 1
        counts["agree"] += agrees
        if not agrees and len(mismatches) < MAX_MISMATCHES:
            mismatches.append({**_ref(record), "expect": record.expect, "verdict": verdict})
    return _report_doc(confusion, counts, mismatches)


def _report_doc(
    confusion: dict[str, Counter[str]], counts: Counter[str], mismatches: list[dict[str, Any]]
) -> dict[str, Any]:
    positives = confusion.get("gpu_oom", Counter())
    tp = positives["gpu_oom"]
    fn = sum(positives.values()) - tp
    fp = tn = 0
    for group, verdicts in confusion.items():
        if group not in ("gpu_oom", "ambiguous"):
            fp += verdicts["gpu_oom"]
            tn += sum(verdicts.values()) - verdicts["gpu_oom"]
    return {
        "rows": counts["rows"],
        "unlabelled": counts["unlabelled"],
        "errors": counts["errors"],
        "gpu_oom": {
            "precision": _ratio(tp, tp + fp),
            "recall": _ratio(tp, tp + fn),
            "recall_with_ambiguous": _ratio(tp + positives["ambiguous"], tp + fn),
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "tn": tn,
        },
        "label_agreement": _ratio(counts["agree"], counts["rows"]),
        "confusion": {group: dict(sorted(c.items())) for group, c in sorted(confusion.items())},
        "mismatches": mismatches,
    }


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None
