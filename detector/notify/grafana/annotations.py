"""Which timeline entries become Grafana annotations, and their bodies (pure).

Annotated: every stage change (``stage:<stage>:...``) and every step that acted or was
lifted (``step:<step>:applied``, ``restarted``, ``rolled_back``, ``removed``, ``lifted``,
``lift:<n>``). The body, as Grafana's annotations API takes it
(https://grafana.com/docs/grafana/latest/developers/http_api/annotations/#create-annotation):
``time`` (epoch milliseconds), ``tags`` (strings), ``text``, and ``dashboardUID`` when
configured. Tags: the configured ones, then ``namespace:<ns>``, ``workload:<name>``,
``incident:<key>`` and ``stage:<stage>`` or ``step:<action>``, so a dashboard's annotation
query can pick one workload's incidents. Text is stripped of control characters and its
``&``, ``<`` and ``>`` escaped: Grafana's annotation tooltip renders ``text`` as (sanitized)
HTML (``AnnotationTooltipBody``, ``dangerouslySetInnerHTML`` of ``textUtil.sanitize``), where a
person's resolve reason would otherwise become a link or an image on the team's dashboards.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from detector.textsafe import printable

TARGET = "grafana"
ACTED = ("applied", "restarted", "rolled_back", "removed", "lifted")
MAX_TEXT_CHARS = 2000
MAX_TAG_CHARS = 100
DRILL = "[drill] "


def tag_of(dedupe_key: str) -> str | None:
    """Return the tag of the timeline entry of ``dedupe_key`` when it becomes an annotation
    (``stage:<stage>``, ``step:<step id>``), else None."""
    parts = dedupe_key.split(":")
    if parts[0] == "stage" and len(parts) >= 2:
        return f"stage:{parts[1]}"
    if parts[0] == "step" and len(parts) >= 3 and (parts[2] in ACTED or parts[2] == "lift"):
        return f"step:{parts[1]}"
    return None


def body(
    entry: Mapping[str, Any],
    inc: Mapping[str, Any],
    what: str,
    *,
    tags: Sequence[str],
    dashboard_uid: str = "",
    drill: bool = False,
) -> dict[str, Any]:
    """Return the annotation of one timeline entry (a ``TimelineEntryOut`` JSON dump: ``time``
    ISO 8601, ``message``) of the incident ``inc`` (``IncidentOut`` dump); ``what`` is its
    tag (``tag_of``)."""
    found = [
        *tags,
        f"namespace:{inc['namespace']}",
        f"workload:{inc['workload']}",
        f"incident:{inc['key']}",
        what,
    ]
    text = ((DRILL if drill else "") + printable(str(entry["message"])))[:MAX_TEXT_CHARS]
    out: dict[str, Any] = {
        "time": time_ms(str(entry["time"])),
        "tags": [printable(t, one_line=True)[:MAX_TAG_CHARS] for t in found],
        "text": html.escape(text, quote=False),
    }
    if dashboard_uid:
        out["dashboardUID"] = dashboard_uid
    return out


def time_ms(iso: str) -> int:
    """Return epoch milliseconds of an ISO 8601 time (``Z`` or an offset)."""
    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)
