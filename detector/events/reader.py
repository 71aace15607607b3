"""Read recorded streams from files and folders as (SourcePos, bytes) records.

One record per line (JSON Lines, exposition text, access logs), bytes as stored, without the
line ending; blank lines are skipped. A file whose first non-blank byte is ``{`` or ``[`` and
whose first line is not a complete JSON document is one pretty-printed JSON document (for
example ``kubectl get pods -o json``) and is yielded whole as one record at position 1; so is a
saved human-readable document: ``kubectl describe pod`` / ``kubectl get pods`` output, a
``kubectl get pod -o yaml`` document (or its status fragment) and an ``nvidia-smi`` table.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from detector.events.model import SourcePos
from detector.events.sources.kubectl_text import is_kubectl_text
from detector.events.sources.nvidia_smi_table import is_nvidia_smi_table

# A pretty-printed document larger than this is cut here; the parser then rejects it.
WHOLE_FILE_MAX_BYTES = 256 * 1024 * 1024
_HEAD_BYTES = 4096  # how much of a file tells a human-readable document


def read_records(paths: Iterable[str | Path]) -> Iterator[tuple[SourcePos, bytes]]:
    """Yield every record of the given files and folders, in order.

    Folders are walked recursively in sorted order, skipping hidden files and folders,
    ``README*`` and ``*.md``. ``SourcePos.origin`` is the file path, ``position`` the 1-based
    line number. Raises ``FileNotFoundError`` for a path that does not exist.
    """
    for path in iter_files(paths):
        yield from _read_file(path)


def total_bytes(paths: Iterable[str | Path]) -> int:
    """Return the total size in bytes of the files ``read_records`` would read (stat only).

    Meant as the total of a progress bar. Raises ``FileNotFoundError`` like ``read_records``.
    """
    return sum(path.stat().st_size for path in iter_files(paths))


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
    # which carries the pod identity (resolve() would follow it to a nameless file)
    origin = os.path.abspath(path)
    with path.open("rb") as f:
        if _is_json_document(f) or _is_text_document(f):
            f.seek(0)
            yield SourcePos(origin=origin, position=1), f.read(WHOLE_FILE_MAX_BYTES + 1)
            return
        f.seek(0)
        for line_no, line in enumerate(f, start=1):
            if line.endswith(b"\n"):
                line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
            if line and not line.isspace():  # blank: ASCII whitespace only, like strip()
                yield SourcePos(origin, line_no), line


def _is_json_document(f: Iterable[bytes]) -> bool:
    """Tell a pretty-printed JSON document: its first non-blank line is a lone ``{`` or ``[``.

    That is how ``kubectl get ... -o json`` and ``json.dumps(indent=...)`` start; a JSON-lines
    file whose first record is merely truncated stays a JSON-lines file.
    """
    for line in f:
        stripped = line.strip()
        if stripped:
            return stripped in (b"{", b"[")
    return False


def _is_text_document(f: BinaryIO) -> bool:
    """Tell a saved ``kubectl describe``/``get``/YAML output or ``nvidia-smi`` table.

    Formats: https://kubernetes.io/docs/reference/kubectl/generated/kubectl_describe/ ,
    https://docs.nvidia.com/deploy/nvidia-smi/index.html
    """
    f.seek(0)
    head = f.read(_HEAD_BYTES).decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if "\n" not in head:
        return False
    return is_nvidia_smi_table(head) or is_kubectl_text(head)
