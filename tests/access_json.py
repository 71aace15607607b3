"""Rewrite a recorded ingress-nginx access log into the JSON format, as Fluent Bit ships it.

The text lines of the controller's default ``upstreaminfo`` format become the widely used JSON
``log-format-upstream`` (ingress-nginx issue #9819's format plus the upstream variables, under
``log-format-escape-json: "true"``), every value kept: nginx writes ``""`` for a variable that
is not set. ``rewrite`` places the line as Fluent Bit's kubernetes filter would: a string in
``log`` (``Merge_Log Off``), or merged into the record (``Merge_Log On``) at the top level or
under ``Merge_Log_Key log_processed``, with ``log`` kept or removed (``Keep_Log``). Merged keys
follow the record's own (filter_kubernetes ``pack_map_content``), so a key of both (``time``)
is the line's when the record is decoded. Sources:
https://github.com/kubernetes/ingress-nginx/issues/9819 ,
https://docs.fluentbit.io/manual/pipeline/filters/kubernetes .
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

Placement = Literal["log", "top", "top_keep", "log_processed", "log_processed_keep"]

_Q = r'"((?:[^"\\]|\\.)*)"'
_LINE = re.compile(
    r"(\S+) - (\S+) \[([^\]]+)\] " + _Q + r" (\d{3}) (\d+) " + _Q + " " + _Q
    + r" (\d+) (\S+) \[([^\]]*)\] \[([^\]]*)\] (.*) (\S+)$"
)  # fmt: skip


def json_access_line(text: str) -> dict[str, Any] | None:
    """Return an ``upstreaminfo`` text line as the JSON object nginx would log; None if none."""
    m = _LINE.match(text)
    if m is None:
        return None
    client, user, time_local, request, status, body, referer, agent = m.groups()[:8]
    length, request_time, upstream, alternative, rest, req_id = m.groups()[8:]
    # $upstream_addr $upstream_response_length $upstream_response_time $upstream_status,
    # each "a, b : c" after retries
    fields = rest.replace(", ", ",").replace(" : ", ";").split(" ")
    addr, up_length, up_time, up_status = (
        "" if f == "-" else f.replace(",", ", ").replace(";", " : ") for f in fields
    )
    method, _, tail = request.partition(" ")
    uri, _, proto = tail.rpartition(" ")
    path, _, query = uri.partition("?")
    namespace, _, service = upstream.partition("-")
    return {
        "time": datetime.strptime(time_local, "%d/%b/%Y:%H:%M:%S %z").isoformat(),
        "remote_addr": client,
        "x_forwarded_for": client,
        "request_id": req_id,
        "remote_user": "" if user == "-" else user,
        "bytes_sent": int(body),
        "request_time": float(request_time),
        "status": int(status),
        "vhost": "api.example.com",
        "request_proto": proto,
        "path": path,
        "request_query": query,
        "request_length": int(length),
        "duration": float(request_time),
        "method": method,
        "http_referrer": "" if referer == "-" else referer,
        "http_user_agent": agent,
        "upstream_addr": addr,
        "upstream_status": up_status,
        "upstream_response_time": up_time,
        "upstream_response_length": up_length,
        "proxy_upstream_name": upstream,
        "proxy_alternative_upstream_name": alternative,
        "namespace": namespace,
        "ingress_name": service.rsplit("-", 1)[0],
        "service_name": service.rsplit("-", 1)[0],
    }


def rewrite(src: Path, dst: Path, placement: Placement) -> int:
    """Write ``src`` (Fluent Bit records) to ``dst`` with its access lines in the JSON format.

    Returns the number of access lines rewritten; other records are copied unchanged.
    """
    count = 0
    out: list[str] = []
    for raw in src.read_text(encoding="utf-8").splitlines():
        record = json.loads(raw)
        line = json_access_line(record["log"].rstrip("\n"))
        if line is not None:
            count += 1
            place(record, line, placement)
        out.append(json.dumps(record, separators=(",", ":")))
    dst.write_text("\n".join(out) + "\n", encoding="utf-8")
    return count


def place(record: dict[str, Any], line: dict[str, Any], placement: Placement) -> None:
    """Put a JSON access line into a Fluent Bit record as ``placement`` says (in place)."""
    text = json.dumps(line, separators=(", ", ": "))
    if placement == "log":
        record["log"] = text + "\n"
        return
    if placement.endswith("_keep"):
        record["log"] = text  # Merge_Log_Trim: the line without its newline
    else:
        del record["log"]
    if placement.startswith("top"):
        for key in line:  # a key of both: the merged one is decoded last
            record.pop(key, None)
        record.update(line)
    else:
        record["log_processed"] = line
