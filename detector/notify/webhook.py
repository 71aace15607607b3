"""POST one JSON event to a service beside Slack (httpx) and say what came of it.

For PagerDuty's ``/v2/enqueue`` (https://developer.pagerduty.com/docs/events-API-v2/overview/
#response-codes--retry-logic) and Grafana's ``/api/annotations``: 2xx accepted; 429 and 5xx
retried (after ``Retry-After`` when the answer gives one, else with back-off), as is no answer;
any other status is the event's fault (invalid, unauthorized) and not retried. The result is a
value, never an exception through the sender.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

RETRIED = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 3600.0


@dataclass(frozen=True, slots=True)
class Answer:
    """What one send did: ``sent``; else ``retry`` (worth another try), ``retry_after_s``
    (PagerDuty's ``Retry-After``, seconds, when given) and the ``error``."""

    sent: bool
    retry: bool = False
    retry_after_s: float | None = None
    error: str = ""


def send(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Answer:
    """POST ``body`` as JSON to ``url`` (with ``headers``); return the ``Answer``."""
    try:
        response = client.post(url, json=body, headers=headers)
    except httpx.HTTPError as exc:
        return Answer(False, retry=True, error=f"unreachable: {type(exc).__name__}")
    if 200 <= response.status_code < 300:
        return Answer(True)
    error = f"HTTP {response.status_code}: {_message(response)}"
    if response.status_code in RETRIED:
        return Answer(False, True, retry_after(response.headers.get("Retry-After")), error)
    return Answer(False, retry=False, error=error)


def retry_after(value: str | None) -> float | None:
    """Return a ``Retry-After`` header's seconds (delta-seconds form), None when absent or
    not a number; capped at an hour."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S) if seconds == seconds else None


def _message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return "no JSON answer"
    if isinstance(data, dict):
        parts = [str(data.get("message") or ""), *map(str, data.get("errors") or [])]
        return "; ".join(p for p in parts if p)[:300]
    return ""
