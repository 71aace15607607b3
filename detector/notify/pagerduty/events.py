"""Build PagerDuty Events API v2 events from the read model (pure).

Format: https://developer.pagerduty.com/docs/events-API-v2/trigger-events/ (``routing_key``,
``event_action`` trigger/acknowledge/resolve, ``dedup_key`` up to 255 characters; a trigger's
``payload`` needs ``summary`` (up to 1024 characters), ``source`` and ``severity``
(critical/error/warning/info), and may carry ``timestamp``, ``component``, ``group``,
``class``, ``custom_details``; ``links`` and ``client``/``client_url`` beside it). The
acknowledge and resolve events carry only the key:
https://developer.pagerduty.com/docs/events-API-v2/acknowledge-events/ and
``.../resolve-events/``. Every input string is cut and stripped of control characters
(``detector.textsafe``): PagerDuty shows them in its app, e-mail and SMS.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from detector.textsafe import printable

CLIENT = "gpu-oom-cascade-detector"
MAX_SUMMARY_CHARS = 1024
MAX_DEDUP_KEY_CHARS = 255
DRILL = "[drill] "


def dedup_key(incident_key: str) -> str:
    """Return the incident's ``dedup_key``: its key, cut to PagerDuty's 255 characters."""
    return incident_key[:MAX_DEDUP_KEY_CHARS]


def event(
    action: str,
    inc: Mapping[str, Any],
    doc: Mapping[str, Any],
    *,
    routing_key: str,
    base_url: str = "",
    drill: bool = False,
) -> dict[str, Any]:
    """Return the event ``action`` (trigger, acknowledge, resolve) of the incident ``inc``
    (an ``IncidentOut`` JSON dump) and its document ``doc`` (``report.document``)."""
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": dedup_key(str(inc["key"])),
    }
    if action != "trigger":
        return body
    links = _links(inc, base_url)
    body["payload"] = {
        "summary": (DRILL if drill else "") + summary(inc, doc),
        "source": _text(_workload(inc), 255),
        "severity": "critical",
        "timestamp": inc["opened_at"],
        "component": _text(str(inc["workload"]), 255),
        "group": _text(str(inc["namespace"]), 255),
        "class": _text(str(inc.get("pattern") or "gpu_oom_cascade"), 255),
        "custom_details": custom_details(inc, doc, links),
    }
    body["client"] = CLIENT
    if links:
        body["client_url"] = links["page"]
        body["links"] = [
            {"href": links["page"], "text": "incident page"},
            {"href": links["postmortem"], "text": "postmortem draft"},
        ]
    return body


def summary(inc: Mapping[str, Any], doc: Mapping[str, Any]) -> str:
    """Return the one-line summary: the workload, the stage and how many pods died."""
    victims = len(doc.get("pods") or [])
    line = (
        f"GPU OOM cascade in {_workload(inc)}: {victims} pod{'s' if victims != 1 else ''} "
        f"died of GPU OOM ({inc['stage']})"
    )
    return _text(line, MAX_SUMMARY_CHARS - len(DRILL))


def custom_details(
    inc: Mapping[str, Any], doc: Mapping[str, Any], links: Mapping[str, str]
) -> dict[str, Any]:
    """Return the trigger's details: victims, signals (evidence kinds counted), the step
    waiting for a person, and the links."""
    signals = Counter(str(e["kind"]) for e in inc.get("evidence") or [])
    waiting = next((s for s in doc.get("steps") or [] if s.get("status") == "awaiting_approval"),
                   None)  # fmt: skip
    return {
        "incident": _text(str(inc["key"]), 255),
        "stage": inc["stage"],
        "victims": [_text(str(p), 255) for p in doc.get("pods") or []],
        "signals": dict(sorted(signals.items())),
        "waiting_step": None
        if waiting is None
        else {"position": waiting["position"], "title": _text(str(waiting["title"]), 255)},
        **links,
    }


def _links(inc: Mapping[str, Any], base_url: str) -> dict[str, str]:
    if not base_url:
        return {}
    page = f"{base_url.rstrip('/')}/incidents/{int(inc['id'])}"
    return {"page": page, "postmortem": f"{page}/postmortem.html"}


def _workload(inc: Mapping[str, Any]) -> str:
    cluster = f"{inc['cluster']}/" if inc.get("cluster") else ""
    return f"{cluster}{inc['namespace']}/{inc['workload']}"


def _text(value: str, limit: int) -> str:
    return printable(value, one_line=True)[:limit]
