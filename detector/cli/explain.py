"""``detector explain``: how the detector reads each record of a user's own files.

For each record: the format it was read as, the signals it gave (kind, pod, workload and the
figures the parser took), or why it gave none (rejected with the parser's reason, a record
that says nothing, a signal that names no workload with the flag or mapping that would name
one); then a summary per format. A table on the terminal or one JSON document (``--json``).

The records are read and parsed by the path ``detector replay`` uses
(``reader.read_records`` -> ``pipeline.parse_stream`` -> ``detect.parse_record``), one file
at a time in its own order; workloads are named by the correlator's ``WorkloadResolver``
with the same workload mapping, and what names none is explained by
``correlate.unattributed.why_unattributed``. The format is named from the record's outer
shape and the signals it gave, never from the file name.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from detector.cli.exits import fail, interruptible
from detector.cli.options import Container, Namespace, Owner, Pod, WorkloadsFile
from detector.cli.settings import cli_settings
from detector.config import load_workload_map
from detector.correlate.identity import WorkloadResolver
from detector.correlate.unattributed import why_unattributed
from detector.errors import DetectorError
from detector.events.model import Signal
from detector.events.reader import iter_files, read_records
from detector.events.record_format import record_format
from detector.events.sources.raw_text import LogIdentity
from detector.pipeline import Parsed, parse_stream
from detector.textsafe import printable, printable_json

DEFAULT_LIMIT = 500  # records listed (all are counted in the summary); 0 lists every one
# attrs shown as a signal's figures, in this order (detector.events.model.Signal)
FIGURES = (
    "framework", "accelerator", "sharing_layer", "bytes_tried", "free_bytes", "capacity_bytes",
    "gpu_index", "ambiguous", "quoted", "reason", "exit_code", "restart_count", "status",
    "upstream", "upstream_addr", "count", "used_bytes", "total_bytes", "gpu", "engine",
    "kv_cache_usage", "requests_waiting", "requests_running", "preemptions", "max_num_seqs",
    "max_model_len", "gpu_memory_utilization", "cause", "metric", "pod_ip",
)  # fmt: skip
SILENT = "the record says nothing the detector uses (e.g. a healthy log line)"


@dataclass
class RecordView:
    """What one record gave: its place, its format, its signals, or why none."""

    file: str
    line: int
    format: str
    signals: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, str] | None = None  # the parser's reason and detail

    def as_dict(self) -> dict[str, Any]:
        """Return the record's JSON object (``--json``)."""
        out: dict[str, Any] = {"file": self.file, "line": self.line, "format": self.format}
        if self.error is not None:
            out["error"] = self.error
        elif not self.signals:
            out["note"] = SILENT
        out["signals"] = self.signals
        return out


@interruptible
def explain_cmd(
    paths: Annotated[list[Path], typer.Argument(help="recorded files or folders")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    workloads: WorkloadsFile = None,
    namespace: Namespace = None,
    pod: Pod = None,
    container: Container = None,
    workload: Owner = None,
    limit: Annotated[
        int, typer.Option(min=0, help="records listed (the summary counts all); 0: every one")
    ] = DEFAULT_LIMIT,
) -> None:
    """Show how each record is read: its format, its signals, or why it gave none.

    Check a shipper's output before going live: each record's format, the signals it gave
    (kind, pod, workload, figures) or the reason it gave none (rejected and why, nothing to
    say, or not attributed and the flag or mapping that would attribute it), then a summary
    per format. Plain-text logs need --namespace and --pod, as with replay.
    """
    try:
        settings = cli_settings(None, workloads)
        resolver = WorkloadResolver(load_workload_map(settings.workloads_file), settings.cluster)
        identity = None
        if namespace or pod:
            identity = LogIdentity(namespace, pod, container, workload, settings.cluster)
        views = explain_files(paths, resolver, identity)
        listed, summary, total = _collect(views, limit)
    except (DetectorError, FileNotFoundError) as exc:
        fail(str(exc))
    if as_json:
        doc = {
            "records": [view.as_dict() for view in listed],
            "listed": len(listed),
            "total": total,
            "summary": summary,
        }
        typer.echo(printable_json(json.dumps(doc, indent=2, ensure_ascii=False, default=str)))
        return
    _render(Console(), listed, summary, total)


def explain_files(
    paths: list[Path], resolver: WorkloadResolver, identity: LogIdentity | None
) -> Iterator[RecordView]:
    """Yield a ``RecordView`` per record of ``paths``, file by file, each in its own order.

    Raises FileNotFoundError for a path that does not exist.
    """
    now = time.time()
    for path in iter_files(paths):
        start = min(path.stat().st_mtime, now)
        stream = parse_stream(
            read_records([path]), max_time=now + 86400.0, start_time=start, identity=identity
        )
        for parsed in stream:
            yield _view(parsed, resolver)


def _view(parsed: Parsed, resolver: WorkloadResolver) -> RecordView:
    source = parsed.source
    fmt = record_format(parsed.raw, parsed.signals, parsed.error)
    view = RecordView(source.origin, source.position, fmt)
    if parsed.error is not None:
        view.error = {"reason": parsed.error.reason, "detail": parsed.error.detail}
        return view
    view.signals = [_signal(sig, resolver) for sig in parsed.signals]
    return view


def _signal(sig: Signal, resolver: WorkloadResolver) -> dict[str, Any]:
    """Return a signal's kind, identity, workload (or why none) and figures."""
    out: dict[str, Any] = {"kind": sig.kind.value, "namespace": sig.namespace, "pod": sig.pod}
    ref = resolver.resolve(sig)
    if ref is not None:
        out["workload"] = ref.label
    else:
        reason, hint = why_unattributed(sig)
        out["workload"] = None
        out["unattributed"] = {"reason": reason, "hint": hint}
    out["figures"] = {key: sig.attrs[key] for key in FIGURES if key in sig.attrs}
    return out


def _collect(
    views: Iterator[RecordView], limit: int
) -> tuple[list[RecordView], list[dict[str, Any]], int]:
    """Keep the first ``limit`` views (0: all), count every one per format."""
    listed: list[RecordView] = []
    counts: dict[str, Counter[str]] = {}
    total = 0
    for view in views:
        total += 1
        if not limit or len(listed) < limit:
            listed.append(view)
        tally = counts.setdefault(view.format, Counter())
        tally["records"] += 1
        if view.error is not None:
            tally["rejected"] += 1
        elif not view.signals:
            tally["silent"] += 1
        for sig in view.signals:
            tally["signals"] += 1
            tally["attributed" if sig["workload"] else "unattributed"] += 1
    keys = ("records", "signals", "attributed", "unattributed", "silent", "rejected")
    summary = [{"format": fmt, **{k: c[k] for k in keys}} for fmt, c in counts.items()]
    return listed, summary, total


def _render(
    console: Console, listed: list[RecordView], summary: list[dict[str, Any]], total: int
) -> None:
    """Print the records table, then the summary per format (input text made printable)."""
    table = Table("record", "format", "signals", "workload, or why none", show_lines=True)
    for view in listed:
        where = f"{Path(view.file).name}:{view.line}"
        table.add_row(_text(where), _text(view.format), *_cells(view))
    console.print(table)
    if len(listed) < total:
        console.print(f"listed {len(listed)} of {total} records (--limit 0 lists all)")
    sums = Table("format", "records", "signals", "attributed", "unattributed", "silent",
                 "rejected", title="summary per format")  # fmt: skip
    for row in summary:
        sums.add_row(_text(row["format"]), *(str(v) for k, v in row.items() if k != "format"))
    console.print(sums)


def _cells(view: RecordView) -> tuple[Text, Text]:
    if view.error is not None:
        return _text("-"), _text(f"rejected: {view.error['reason']}: {view.error['detail']}")
    if not view.signals:
        return _text("-"), _text(SILENT)
    kinds, whys = [], []
    for sig in view.signals:
        figures = " ".join(f"{k}={v}" for k, v in sig["figures"].items())
        kinds.append(f"{sig['kind']} pod={sig['pod'] or '-'} {figures}".rstrip())
        if sig["workload"]:
            whys.append(sig["workload"])
        else:
            why = sig["unattributed"]
            whys.append(f"not attributed: {why['reason']}; {why['hint']}")
    return _text("\n".join(kinds)), _text("\n".join(whys))


def _text(value: str) -> Text:
    """Return ``value`` as rich Text: control characters escaped, no markup read."""
    return Text("\n".join(printable(part, one_line=True) for part in value.split("\n")))
