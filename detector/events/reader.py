"""Read recorded streams from files and folders as (SourcePos, bytes) records.

One record per line (JSON Lines, exposition text, access logs), bytes as stored, without the
line ending; blank lines are skipped. A file whose first non-blank byte is ``{`` or ``[`` and
whose first line is not a complete JSON document is one pretty-printed JSON document (for
example ``kubectl get pods -o json``) and is yielded whole as one record at position 1; so is a
saved human-readable document: ``kubectl describe pod`` / ``kubectl get pods`` output, a
``kubectl get pod -o yaml`` document (or its status fragment) and an ``nvidia-smi`` table.

A gzip file (told by its magic bytes, whatever its name: a rotated ``*.log.gz`` or kubelet's
``0.log.<time>.gz``) is read as the text it holds, line by line as it is decompressed, so
memory stays bounded by ``LINE_MAX_BYTES``: a longer line is yielded cut to that length (the
parser rejects it as too large) and the rest of it is skipped. A gzip stream that
is cut short or corrupt ends its file's records there, with a warning.
Format: https://www.rfc-editor.org/rfc/rfc1952 (gzip).
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path

from detector.events.model import SourcePos
from detector.events.sources.kubectl_text import is_kubectl_text
from detector.events.sources.nvidia_smi_table import is_nvidia_smi_table

log = logging.getLogger(__name__)

# A pretty-printed document larger than this is cut here; the parser then rejects it.
WHOLE_FILE_MAX_BYTES = 256 * 1024 * 1024
# A line longer than this is cut here (above the parser's 1 MiB record limit, so it is still
# rejected as too large); the rest of it is skipped, never held in memory.
LINE_MAX_BYTES = 1024 * 1024 + 1
_HEAD_BYTES = 4096  # how much of a file tells a human-readable document
_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def read_records(paths: Iterable[str | Path]) -> Iterator[tuple[SourcePos, bytes]]:
    """Yield every record of the given files and folders, in order.

    Folders are walked recursively in sorted order, skipping hidden files and folders,
    ``README*`` and ``*.md``. ``SourcePos.origin`` is the file path, ``position`` the 1-based
    line number. Raises ``FileNotFoundError`` for a path that does not exist.
    """
    for path in iter_files(paths):
        yield from _read_file(path)


def total_bytes(paths: Iterable[str | Path]) -> int:
    """Return the total size in bytes of the text ``read_records`` would read.

    Meant as the total of a progress bar: a file's size, or for a gzip file the size of its
    text as its trailer gives it (ISIZE, modulo 2**32; RFC 1952 section 2.3.1), so no file is
    decompressed. Raises ``FileNotFoundError`` like ``read_records``.
    """
    return sum(_text_size(path) for path in iter_files(paths))


def _text_size(path: Path) -> int:
    size = path.stat().st_size
    with path.open("rb") as f:
        if size < 18 or f.read(2) != _GZIP_MAGIC:  # 18: the smallest gzip file
            return size
        f.seek(-4, os.SEEK_END)
        return max(int.from_bytes(f.read(4), "little"), size)


def iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Yield the files named by ``paths`` in reading order: files as given, folders walked.

    Folders are walked recursively in sorted order, skipping hidden entries, ``README*`` and
    ``*.md``. Raises ``FileNotFoundError`` for a path that does not exist.
    """
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from _walk(path)
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")


def _walk(root: Path) -> Iterator[Path]:
    files: list[Path] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files.extend(Path(folder, name) for name in names if _wanted(name))
    files.sort()
    yield from (f for f in files if f.is_file())


def _wanted(name: str) -> bool:
    """Skip hidden files, READMEs (``README*``, ``*.README.*``) and Markdown."""
    return not (name.startswith((".", "README")) or ".README" in name or name.endswith(".md"))


def _read_file(path: Path) -> Iterator[tuple[SourcePos, bytes]]:
    # one spelling per file, so re-deliveries dedupe; abspath keeps the kubelet symlink's name,
    # which carries the pod identity (resolve() would follow it to a nameless file); a name
    # that is not UTF-8 keeps its bytes as \xNN escapes (the store and Slack take only UTF-8)
    origin = os.fsencode(os.path.abspath(path)).decode("utf-8", "backslashreplace")
    with _open(path) as f:
        try:
            if _is_json_document(f) or _is_text_document(f):
                f.seek(0)
                yield SourcePos(origin=origin, position=1), f.read(WHOLE_FILE_MAX_BYTES + 1)
                return
            f.seek(0)
            read = partial(f.readline, LINE_MAX_BYTES)
            # a file's own lines are read as stored (the fast C loop); a gzip file's are cut
            # at LINE_MAX_BYTES, so a line decompressed from a few bytes cannot fill memory
            lines = iter(read, b"") if isinstance(f, gzip.GzipFile) else f
            for line_no, line in enumerate(lines, start=1):
                if line.endswith(b"\n"):
                    line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
                elif len(line) == LINE_MAX_BYTES:  # too long: keep its head, skip the rest
                    while (rest := read()) and not rest.endswith(b"\n"):
                        pass
                if line and not line.isspace():  # blank: ASCII whitespace only, like strip()
                    yield SourcePos(origin, line_no), line
        except _GZIP_ERRORS as exc:  # raised only by a gzip file's decompression
            log.warning(
                "gzip file cut short or corrupt, read up to there path=%s error=%s", path, exc
            )


def _open(path: Path) -> io.BufferedIOBase:
    """Open ``path`` for reading bytes, decompressing it when it is gzip (by content)."""
    with path.open("rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")
    return path.open("rb")


def _is_json_document(f: io.BufferedIOBase) -> bool:
    """Tell a pretty-printed JSON document: its first non-blank line is a lone ``{`` or ``[``.

    That is how ``kubectl get ... -o json`` and ``json.dumps(indent=...)`` start; a JSON-lines
    file whose first record is merely truncated stays a JSON-lines file.
    """
    for line in iter(partial(f.readline, LINE_MAX_BYTES), b""):
        stripped = line.strip()
        if stripped:
            return stripped in (b"{", b"[")
    return False


def _is_text_document(f: io.BufferedIOBase) -> bool:
    """Tell a saved ``kubectl describe``/``get``/YAML output or ``nvidia-smi`` table.

    Formats: https://kubernetes.io/docs/reference/kubectl/generated/kubectl_describe/ ,
    https://docs.nvidia.com/deploy/nvidia-smi/index.html
    """
    f.seek(0)
    head = f.read(_HEAD_BYTES).decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if "\n" not in head:
        return False
    return is_nvidia_smi_table(head) or is_kubectl_text(head)
