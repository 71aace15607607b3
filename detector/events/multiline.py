"""Find GPU OOM events in a log stream or in one multi-line record, one hit per event.

A stream (a file of one container's log) and a record that carries a whole multi-line message
(a Fluent Bit multiline-filter record, a Docker record joined by a shipper: a Python traceback
whose last line is the OOM) are read line by line with ``classify_line``. Three things make
one OOM event look like several lines, or like none:

- wrapping: a message hard-wrapped at a fixed column, even mid-word ("... (4.26 GiB KV cach" /
  "e is needed, which is larger than ..."), or split by the runtime's 16 KiB line limit, so a
  line is also classified joined to the next one when the next does not start a new record;
- repetition: the same OOM printed by the worker, then re-logged by the engine a few lines
  later (vLLM's "Inspect the stacktrace to find the original error: OutOfMemoryError(...)"),
  or one failure reported over adjacent lines (NCCL "Cuda failure 'out of memory'" then
  "Failed to CUDA calloc N bytes"; TensorFlow retrying with smaller sizes);
- continuation lines that carry the numbers: PyTorch's cudaMallocAsync report puts
  "Requested : 512.00 KiB" and "Device limit : 15.99 GiB" on the lines after "Allocation on
  device 0 would exceed allowed memory" (https://github.com/EvilBT/ComfyUI_SLK_joy_caption_two/issues/28);
- a device named after the OOM: TensorFlow 0.x/1.x print "Ran out of memory trying to allocate"
  or "OOM when allocating tensor" without the device, then the op's node with its ``_device``
  on a following line; an AMBIGUOUS event whose following line names a GPU is a GPU OOM.

Hits at most ``MERGE_GAP_LINES`` apart form one event (unless they name different GPUs); an
event with the fingerprint of one emitted within ``DEDUP_WINDOW_LINES`` is a copy and dropped.
Each line is classified on its first ``MAX_LINE_CHARS`` characters; a record longer than twice
``MAX_BLOCK_WINDOW_CHARS`` is scanned on its head and tail windows only, bounding the cost.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from detector.events.classify import (
    NUMBER_FIELDS,
    Classification,
    OomClass,
    classify_line,
    line_numbers,
)

MAX_LINE_CHARS = 16384  # each line is classified on this prefix
MAX_BLOCK_WINDOW_CHARS = 65536  # a longer record is scanned on this head and this tail
WRAP_MIN_CHARS = 60  # a shorter line ended on purpose: never joined to the next
MERGE_GAP_LINES = 2  # hits this close (a blank line between allowed) are one event
ENRICH_LINES = 6  # lines after a hit whose numbers (sizes, GPU) fill the event's gaps
DEDUP_WINDOW_LINES = 50  # a same-fingerprint event this soon after another is a re-logged copy

_OOM_VERDICTS = (OomClass.GPU_OOM, OomClass.AMBIGUOUS)
_OTHER_VERDICTS = (OomClass.ENGINE_DEAD, OomClass.HOST_OOM)
# A line that starts a record of its own: indentation (traceback frames), a timestamp or
# counter, a bracket or parenthesis prefix, a level word, a klog/glog header, "Name:" labels,
# an exception name ("torch.OutOfMemoryError: ...").
_NEW_RECORD = re.compile(
    r"\s\s|\t|[\d\[(<{|]|(?:INFO|WARN(?:ING)?|ERROR|DEBUG|CRITICAL|FATAL|TRACE)\b"
    r"|[IWEF]\d{4} |Traceback |[A-Z][\w.]*:|[\w.]*(?:Error|Exception|Warning)\b"
    r"|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
)


# The device of the failing op in a TensorFlow 0.x/1.x error block, on a line after the OOM:
# "[[Node: conv6/... = Const[..., _device="/job:localhost/replica:0/task:0/gpu:0"]()]]" (the first
# _device= is the op's own). Sources: https://github.com/simonmeister/UnFlow/issues/32,
# https://github.com/bourdakos1/Custom-Object-Detection/issues/12
_NODE_DEVICE = re.compile(r'_device="[^"]{0,120}?/(?:device:)?(GPU|gpu|CPU|cpu):(\d{1,4})"')


@dataclass(frozen=True, slots=True)
class OomHit:
    """One GPU OOM event: the 1-based number of its first line, its text, the verdict.

    ``classification.verdict`` is GPU_OOM, or AMBIGUOUS when no line of the event decides;
    sizes the event's other lines stated fill the fields its own line left unknown.
    """

    line_no: int
    text: str
    classification: Classification


@dataclass(slots=True)
class _Event:
    """One event being collected: its line span, the line that first proved it, the most
    telling hit, the wrapped message if one was joined, the numbers its lines stated.
    """

    start: int
    end: int
    best: OomHit
    first_line: int | None = None  # the first line that is an OOM on its own
    wrapped: str | None = None  # the first joined (wrapped) message of the event
    numbers: dict[str, int] = field(default_factory=dict)

    def absorb(self, start: int, end: int, hit: OomHit, *, joined: bool) -> None:
        """Merge a hit of this event: keep the most telling one, pool the numbers."""
        self.start, self.end = min(self.start, start), max(self.end, end)
        if not joined and self.first_line is None:
            self.first_line = start
        if joined and self.wrapped is None:
            self.wrapped = hit.text
        if _rank(hit) > _rank(self.best):
            self.best = hit
        self.fill(_numbers_of(hit.classification))

    def fill(self, numbers: dict[str, int]) -> None:
        """Take the numbers this event does not know yet."""
        for key, value in numbers.items():
            self.numbers.setdefault(key, value)

    def name_device(self, text: str) -> None:
        """Decide an AMBIGUOUS event whose device a following line names (TensorFlow's
        ``[[Node: ... _device="/job:localhost/replica:0/task:0/gpu:0"](...)]]``): GPU_OOM on
        that GPU; a CPU device leaves it AMBIGUOUS.
        """
        verdict = self.best.classification
        if verdict.verdict is not OomClass.AMBIGUOUS or "_device=" not in text:
            return
        device = _NODE_DEVICE.search(text)
        if device is None or device.group(1).lower() != "gpu":
            return
        decided = replace(
            verdict,
            verdict=OomClass.GPU_OOM,
            reason=f"{verdict.reason}+device_line",
            gpu_index=int(device.group(2)) if verdict.gpu_index is None else verdict.gpu_index,
        )
        self.best = OomHit(self.best.line_no, self.best.text, decided)

    def hit(self) -> OomHit:
        """Return the event as one hit: its OOM line, its message, the pooled numbers."""
        known = {**self.numbers, **_numbers_of(self.best.classification)}
        line_no = self.start if self.first_line is None else self.first_line
        text = self.best.text if self.wrapped is None else self.wrapped
        verdict = replace(
            self.best.classification,
            bytes_tried=known.get("bytes_tried"),
            capacity_bytes=known.get("capacity_bytes"),
            free_bytes=known.get("free_bytes"),
            gpu_index=known.get("gpu_index"),
        )
        return OomHit(line_no, text, verdict)


def find_ooms(lines: Iterable[str]) -> Iterator[OomHit]:
    """Yield one ``OomHit`` per GPU OOM event in a stream of log lines (numbered from 1).

    Wrapped messages are joined, repeated reports of one event merged, re-logged copies
    dropped; ambiguous events (no line decides) are yielded with the AMBIGUOUS verdict.
    Formats and sources: see the module docstring.
    """
    return find_ooms_numbered(enumerate(lines, start=1))


def find_ooms_numbered(lines: Iterable[tuple[int, str]]) -> Iterator[OomHit]:
    """Yield the OOM events of ``(line_no, text)`` pairs; several texts may share a number."""
    scanner = _Scanner()
    for line_no, text in lines:
        yield from scanner.feed(line_no, text)
    yield from scanner.close()


def record_findings(text: str) -> list[OomHit]:
    """Return what one log record says: at most one hit per verdict, in the order found.

    A single line is classified on its first ``MAX_LINE_CHARS`` characters and, when longer,
    on its last ones too; a multi-line record line by line, so a hint or a ``raise`` source line
    elsewhere in the block cannot veto the OOM line. Verdicts: the first GPU OOM event (else the
    first ambiguous one), the first ENGINE_DEAD line, the first HOST_OOM line.
    """
    if "\n" not in text:
        verdict = classify_long_line(text)
        return [] if verdict.verdict is OomClass.NOT_GPU_OOM else [OomHit(1, text, verdict)]
    scanner = _Scanner()
    events = [hit for line_no, line in _block_lines(text) for hit in scanner.feed(line_no, line)]
    events += scanner.close()
    found = [hit for hit in events if hit.classification.verdict is OomClass.GPU_OOM][:1]
    found = found or events[:1]
    return found + list(scanner.others.values())


def classify_record(text: str) -> OomHit:
    """Return the one verdict a record's text carries (GPU OOM first, then engine dead, host
    OOM, ambiguous), or NOT_GPU_OOM with the first look-alike reason found; see
    ``record_findings``.
    """
    found = record_findings(text)
    order = (OomClass.GPU_OOM, OomClass.ENGINE_DEAD, OomClass.HOST_OOM, OomClass.AMBIGUOUS)
    for wanted in order:
        for hit in found:
            if hit.classification.verdict is wanted:
                return hit
    if "\n" not in text:
        return OomHit(1, text, classify_long_line(text))
    for line_no, line in _block_lines(text):
        verdict = classify_line(line[:MAX_LINE_CHARS])
        if verdict.reason:
            return OomHit(line_no, line, verdict)
    return OomHit(1, text, Classification(OomClass.NOT_GPU_OOM))


def classify_long_line(text: str) -> Classification:
    """Classify one line on its first ``MAX_LINE_CHARS`` characters and, if longer and not
    already a GPU OOM, on its last ones (an OOM at the end of a giant line).
    """
    verdict = classify_line(text[:MAX_LINE_CHARS])
    if len(text) <= MAX_LINE_CHARS or verdict.verdict is OomClass.GPU_OOM:
        return verdict
    tail = classify_line(text[-MAX_LINE_CHARS:])
    if tail.verdict is OomClass.GPU_OOM or verdict.verdict is OomClass.NOT_GPU_OOM:
        return tail if tail.verdict is not OomClass.NOT_GPU_OOM else verdict
    return verdict


class _Scanner:
    """The streaming state behind ``find_ooms``: the open event, the previous line, recent
    fingerprints; ``others`` keeps the first ENGINE_DEAD and HOST_OOM hits for records.
    """

    def __init__(self) -> None:
        self.event: _Event | None = None
        self.prev: tuple[int, str] | None = None
        self.recent: deque[tuple[int, Classification]] = deque()
        self.others: dict[OomClass, OomHit] = {}

    def feed(self, line_no: int, text: str) -> Iterator[OomHit]:
        """Take one line; yield the events that can no longer grow."""
        text = text[:MAX_LINE_CHARS].rstrip("\r")
        hits = self._hits(line_no, text)
        if self.event is not None and line_no - self.event.end > ENRICH_LINES:
            yield from self._emit()
        for start, joined, hit in hits:
            yield from self._add(start, line_no, hit, joined=joined)
        if not hits and self.event is not None and text:
            self.event.name_device(text)
            sizes = line_numbers(text)
            sizes.pop("gpu_index", None)  # a later line's GPU may be another rank's
            self.event.fill(sizes)
        self.prev = (line_no, text)

    def close(self) -> list[OomHit]:
        """Flush the open event at the end of the stream."""
        return list(self._emit())

    def _hits(self, line_no: int, text: str) -> list[tuple[int, bool, OomHit]]:
        """Classify a line, and its join with the previous one when that may be a wrap."""
        hits: list[tuple[int, bool, OomHit]] = []
        if self.prev is not None and _may_wrap(self.prev[1], text):
            joined = self.prev[1] + text
            verdict = classify_line(joined[: 2 * MAX_LINE_CHARS])
            if verdict.verdict is OomClass.GPU_OOM:
                hits.append((self.prev[0], True, OomHit(self.prev[0], joined, verdict)))
        verdict = classify_line(text)
        if verdict.verdict in _OOM_VERDICTS:
            hits.append((line_no, False, OomHit(line_no, text, verdict)))
        elif verdict.verdict in _OTHER_VERDICTS:
            self.others.setdefault(verdict.verdict, OomHit(line_no, text, verdict))
        return hits

    def _add(self, start: int, end: int, hit: OomHit, *, joined: bool) -> Iterator[OomHit]:
        """Merge a hit into the open event, or emit that one and open a new event."""
        event = self.event
        if event is None or start - event.end > MERGE_GAP_LINES or not _same_gpu(event, hit):
            yield from self._emit()
            event = self.event = _Event(start, end, hit)
        event.absorb(start, end, hit, joined=joined)

    def _emit(self) -> Iterator[OomHit]:
        """Close the open event; yield it unless it re-reports a recent one."""
        event, self.event = self.event, None
        if event is None:
            return
        hit = event.hit()
        while self.recent and self.recent[0][0] < event.start - DEDUP_WINDOW_LINES:
            self.recent.popleft()
        if any(_is_copy(seen, hit.classification) for _, seen in self.recent):
            return
        self.recent.append((event.end, hit.classification))
        yield hit


def _block_lines(text: str) -> Iterator[tuple[int, str]]:
    """Number a record's lines; a giant record gives its head and tail windows only."""
    if len(text) <= 2 * MAX_BLOCK_WINDOW_CHARS:
        yield from enumerate(text.split("\n"), start=1)
        return
    head = text[:MAX_BLOCK_WINDOW_CHARS].split("\n")
    yield from enumerate(head, start=1)
    gap = len(head) + DEDUP_WINDOW_LINES + 1  # the windows never merge with each other
    yield from enumerate(text[-MAX_BLOCK_WINDOW_CHARS:].split("\n"), start=gap)


def _may_wrap(prev: str, text: str) -> bool:
    """Tell whether ``text`` may continue ``prev`` cut at a fixed width (not a new record)."""
    if len(prev) < WRAP_MIN_CHARS or not text or prev.startswith("  "):
        return False  # short, or a traceback frame / source line: ended on purpose
    if _NEW_RECORD.match(text):
        return False
    return not (len(text) >= 10 and prev[:10] == text[:10])  # the same log prefix: a new record


def _rank(hit: OomHit) -> tuple[bool, int, int]:
    """Order hits by how much they tell: a GPU OOM verdict, known numbers, then length."""
    verdict = hit.classification
    known = sum(getattr(verdict, key) is not None for key in NUMBER_FIELDS)
    return verdict.verdict is OomClass.GPU_OOM, known, len(hit.text)


def _numbers_of(verdict: Classification) -> dict[str, int]:
    found = {key: getattr(verdict, key) for key in NUMBER_FIELDS}
    return {key: value for key, value in found.items() if value is not None}


def _same_gpu(event: _Event, hit: OomHit) -> bool:
    known = event.numbers.get("gpu_index", event.best.classification.gpu_index)
    other = hit.classification.gpu_index
    return known is None or other is None or known == other


def _is_copy(seen: Classification, new: Classification) -> bool:
    """Tell whether ``new`` re-reports ``seen``: the same allocation size, or the same wording
    and framework with no number that contradicts it.
    """
    if seen.bytes_tried is not None and new.bytes_tried is not None:
        same = seen.bytes_tried == new.bytes_tried
    else:
        same = (seen.verdict, seen.reason, seen.framework) == (
            new.verdict,
            new.reason,
            new.framework,
        )
    return same and all(
        getattr(seen, key) is None
        or getattr(new, key) is None
        or getattr(seen, key) == getattr(new, key)
        for key in NUMBER_FIELDS
    )
