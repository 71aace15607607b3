"""POST one JSON event to a service beside Slack (httpx) and say what came of it.

For PagerDuty's ``/v2/enqueue`` (https://developer.pagerduty.com/docs/events-API-v2/overview/
#response-codes--retry-logic) and Grafana's ``/api/annotations``: 2xx accepted; 429 and 5xx
retried (after ``Retry-After`` when the answer gives one, else with back-off), as is no answer;
any other status is the event's fault (invalid, unauthorized) and not retried, as is a URL
that is not http(s) or not a URL at all (nothing is sent to it). The answer's body is read up
to ``MAX_ANSWER_BYTES`` and for at most ``MAX_ANSWER_S`` seconds (a server that answers
without end holds neither memory nor the sender); its message reaches the error with control
characters shown as escapes (``detector.textsafe``) and every secret of ``redact`` (the
routing key, the token) replaced by ``[redacted]``: the error goes to the log and the store.
The result is a value, never an exception through the sender.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from detector.textsafe import printable

RETRIED = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 3600.0
MAX_ANSWER_BYTES = 64 * 1024  # PagerDuty's and Grafana's error answers are a few hundred
MAX_ANSWER_S = 30.0
MAX_ERROR_CHARS = 300
SCHEMES = frozenset({"http", "https"})
REDACTED = "[redacted]"


@dataclass(frozen=True, slots=True)
class Answer:
    """What one send did: ``sent``; else ``retry`` (worth another try), ``retry_after_s``
    (PagerDuty's ``Retry-After``, seconds, when given) and the ``error``."""

    sent: bool
    retry: bool = False
    retry_after_s: float | None = None
    error: str = ""


def send(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    redact: Iterable[str] = (),
) -> Answer:
    """POST ``body`` as JSON to ``url`` (with ``headers``); return the ``Answer``. The
    strings of ``redact`` never appear in its error."""
    wrong = url_problem(url)
    if wrong:
        return Answer(False, retry=False, error=f"{wrong}; nothing sent")
    try:
        with client.stream("POST", url, json=body, headers=headers) as response:
            status, raw = response.status_code, _head(response)
            after = response.headers.get("Retry-After")
    except httpx.InvalidURL:
        return Answer(False, retry=False, error="the URL is not a valid URL; nothing sent")
    except httpx.HTTPError as exc:
        return Answer(False, retry=True, error=f"unreachable: {type(exc).__name__}")
    if 200 <= status < 300:
        return Answer(True)
    error = _redacted(f"HTTP {status}: {_message(raw)}", redact)[:MAX_ERROR_CHARS]
    if status in RETRIED:
        return Answer(False, True, retry_after(after), error)
    return Answer(False, retry=False, error=error)


def url_problem(url: str) -> str:
    """Return what keeps ``url`` from being an http(s) URL with a host and a port of 1 to
    65535, "" when nothing does."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "the URL is not a valid URL"
    if parsed.scheme not in SCHEMES or not parsed.host:
        return "the URL is not an http(s) URL with a host"
    if parsed.port is not None and not 0 < parsed.port < 65536:
        return "the URL's port is out of range"
    return ""


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Return a ``Retry-After`` header's seconds from ``now`` (wall clock when None), None when
    absent or neither form of RFC 9110 section 10.2.3 (delta-seconds, HTTP-date); at least 0
    (a date past), at most an hour."""
    if value is None:
        return None
    seconds: float | None
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = _until(value, now or datetime.now(UTC))
    if seconds is None or seconds != seconds:  # absent, or NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _until(value: str, now: datetime) -> float | None:
    """Return the seconds from ``now`` to the HTTP-date ``value``, None when it is none."""
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, said so by RFC 5322
        when = when.replace(tzinfo=UTC)
    return (when - now).total_seconds()


def _head(response: httpx.Response) -> bytes:
    """Return the answer's body, at most ``MAX_ANSWER_BYTES`` read within ``MAX_ANSWER_S``
    (b"" when cut: a cut body is no JSON)."""
    chunks: list[bytes] = []
    size, deadline = 0, time.monotonic() + MAX_ANSWER_S
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES or time.monotonic() > deadline:
            return b""
        chunks.append(chunk)
    return b"".join(chunks)


def _message(raw: bytes) -> str:
    """Return the answer's ``message`` and ``errors`` (PagerDuty, Grafana), one line."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return "no JSON answer"
    if isinstance(data, dict):
        errors = data.get("errors")
        parts = [str(data.get("message") or ""),
                 *map(str, errors if isinstance(errors, list) else [])]  # fmt: skip
        return printable("; ".join(p for p in parts if p), one_line=True)
    return ""


def _redacted(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text
