"""HTTP admin APIs behind the actuator interface: one client, one error mapping, one write rule.

Each HTTP actuator (Kong, Envoy, Triton, Ray Serve) sees its system as a few *targets*, each
one API object rendered as canonical JSON text (sorted keys, two-space indent, so the plan's
unified diff reads line by line). ``read`` is a GET; ``write`` is a fresh GET then one mutating
call. There is no separate activation: a change is live when the API answers.

Timeouts and retries (``AdminApi``): every call has a timeout; only idempotent calls are
retried, with a growing pause. A GET is retried after a connection failure, a timeout or a
502/504. An idempotent mutation (it sets absolute values: PUT, DELETE, a PATCH of whole fields,
Envoy's ``runtime_modify``) is resent only when no connection could be made, so nothing was
sent: after a timeout it may be on its way, and a second copy could land after an undo. A call
that creates something (Kong ``POST``) or is costly to repeat (Triton's model load) is sent
once.

A mutating call that fails *in doubt* (timeout after sending, connection dropped, 5xx) may
still land. ``HttpActuator.write`` then reads the object back for ``settle_s`` seconds: if the
change landed it is undone and the write fails (``restored``); if it did not land by then the
write fails with the previous content in place (a late landing shows as drift in ``verify``);
if the object cannot be read or the undo fails, the result says the previous state was NOT
restored. Sources: https://www.python-httpx.org/advanced/timeouts/ ,
https://www.rfc-editor.org/rfc/rfc9110#section-9.2.2 (idempotent methods).

``ActuatorError`` reasons added here (``HttpCallError``): ``unreachable`` (no connection, nothing
sent), ``timeout``, ``bad_request`` (400, 422), ``forbidden`` (401, 403), ``not_found`` (404),
``not_allowed`` (405), ``conflict`` (409), ``throttled`` (429), ``http_error`` (other 4xx),
``server_error`` (5xx), ``bad_response`` (an answer that is not the expected JSON); the
actuators add their own (``read_only``, ``no_admin_layer``, ``explicit_mode_required``,
``not_declarative``, ``deploy_failed``).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from abc import abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from detector.actuators.base import ActionResult, Actuator, ActuatorError, Plan, Reason, Status

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({502, 504})
READ_METHODS = frozenset({"GET", "HEAD"})
_MESSAGE_CHARS = 300
_REASONS = {
    400: Reason.BAD_REQUEST,
    401: Reason.FORBIDDEN,
    403: Reason.FORBIDDEN,
    404: Reason.NOT_FOUND,
    405: Reason.NOT_ALLOWED,
    409: Reason.CONFLICT,
    422: Reason.BAD_REQUEST,
    429: Reason.THROTTLED,
}


def reason_for_status(status: int) -> Reason:
    """Return the ``Reason`` of an HTTP error status (400-599)."""
    if status >= 500:
        return Reason.SERVER_ERROR
    return _REASONS.get(status, Reason.HTTP_ERROR)


def render_json(value: Any) -> str | None:
    """Return ``value`` as canonical JSON text (sorted keys, indent 2, newline); None stays None."""
    if value is None:
        return None
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def parse_json(text: str | None, what: str) -> Any:
    """Return the value of JSON ``text`` (None for None); ActuatorError(``invalid_request``)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ActuatorError(Reason.INVALID_REQUEST, f"{what} is not JSON: {exc}") from exc


@dataclass(frozen=True, slots=True)
class AdminApi:
    """One HTTP admin endpoint and how to call it.

    ``base_url``: ``http(s)://host:port`` plus any path prefix (a Kong workspace); ``timeout_s``:
    per attempt (connect, read, write); ``retries``: extra attempts for idempotent calls;
    ``backoff_s``: the pause before the first retry, doubled each time; ``headers``: sent with
    every call (e.g. ``Kong-Admin-Token``), left out of ``repr``; ``verify_tls``: False, True
    or a CA bundle path. Proxy variables from the environment are ignored (``trust_env`` off):
    admin calls go straight to the endpoint. Raises ActuatorError(``invalid_request``).
    """

    base_url: str
    timeout_s: float = 5.0
    retries: int = 2
    backoff_s: float = 0.2
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    verify_tls: bool | str = True

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ActuatorError(Reason.INVALID_REQUEST, f"not an http(s) URL: {self.base_url!r}")
        if not self.timeout_s > 0 or self.retries < 0 or self.backoff_s < 0:
            raise ActuatorError(
                Reason.INVALID_REQUEST,
                f"timeout_s must be > 0, retries and backoff_s >= 0 ({self.base_url})",
            )

    @property
    def name(self) -> str:
        """Return ``host:port`` plus any path prefix: the endpoint's name in target names."""
        parts = urlsplit(self.base_url)
        return f"{parts.netloc}{parts.path.rstrip('/')}"


class HttpCallError(ActuatorError):
    """An admin API call failed; ``in_doubt`` when the request may have been applied anyway.

    ``status`` is the HTTP status (None without an answer) and ``message`` the API's own error
    text (``message`` or ``error`` of a JSON body, else the body), cut to 300 characters.
    """

    def __init__(
        self,
        reason: Reason,
        detail: str,
        *,
        status: int | None = None,
        message: str = "",
        in_doubt: bool = False,
    ) -> None:
        super().__init__(reason, detail)
        self.status = status
        self.message = message
        self.in_doubt = in_doubt


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:_MESSAGE_CHARS]
    if isinstance(body, dict):
        for key in ("message", "error", "detail"):
            if isinstance(body.get(key), str):
                return body[key][:_MESSAGE_CHARS]
    return json.dumps(body)[:_MESSAGE_CHARS]


class HttpApi:
    """Call one admin API: JSON in and out, timeouts, retries for idempotent calls.

    ``transport`` replaces the network (``httpx.MockTransport`` in tests). Every failure is an
    HttpCallError whose detail names the method, URL and the object (``what``).
    """

    def __init__(self, api: AdminApi, transport: httpx.BaseTransport | None = None) -> None:
        self.api = api
        verify: bool | ssl.SSLContext  # a CA bundle path becomes a context
        if isinstance(api.verify_tls, str):
            verify = ssl.create_default_context(cafile=api.verify_tls)
        else:
            verify = api.verify_tls
        self._client = httpx.Client(
            base_url=api.base_url,
            timeout=api.timeout_s,
            headers=dict(api.headers),
            verify=verify,
            trust_env=False,
            transport=transport,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        what: str,
        idempotent: bool,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Send one request; return the answer's JSON, its text when not JSON, None when empty.

        ``body`` is sent as JSON when not None; ``timeout_s`` overrides the endpoint's for this
        call. Retries (``AdminApi.retries``) only an ``idempotent`` call: a GET after any
        connection failure, timeout or 502/504; a mutation only when nothing was sent (no
        connection), so at most one copy of a mutation is ever in flight. Raises HttpCallError.
        """
        url = f"{self.api.base_url.rstrip('/')}{path}"
        label = f"{method} {url} ({what})"
        timeout = self.api.timeout_s if timeout_s is None else timeout_s
        attempts = 1 + (self.api.retries if idempotent else 0)
        read = method in READ_METHODS
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            try:
                response = self._client.request(
                    method, path, params=params, json=body, timeout=timeout
                )
            except httpx.TransportError as exc:
                error = _transport_error(exc, label, timeout, attempt)
                if last or (error.in_doubt and not read):
                    raise error from exc
                self._pause(attempt, label, error)
                continue
            if response.status_code in RETRY_STATUSES and read and not last:
                self._pause(attempt, label, f"answered {response.status_code}")
                continue
            return _answer(response, label)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _pause(self, attempt: int, label: str, why: object) -> None:
        log.warning("admin call retried call=%r attempt=%d why=%s", label, attempt, why)
        time.sleep(self.api.backoff_s * 2 ** (attempt - 1))


def _transport_error(
    exc: httpx.TransportError, label: str, timeout_s: float, attempts: int
) -> HttpCallError:
    tries = f" ({attempts} attempts)" if attempts > 1 else ""
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return HttpCallError(
            Reason.TIMEOUT, f"{label} could not connect within {timeout_s:g} s{tries}"
        )
    if isinstance(exc, httpx.TimeoutException):
        return HttpCallError(
            Reason.TIMEOUT, f"{label} got no answer within {timeout_s:g} s{tries}", in_doubt=True
        )
    if isinstance(exc, httpx.ConnectError):
        return HttpCallError(Reason.UNREACHABLE, f"{label} could not connect: {exc}{tries}")
    return HttpCallError(
        Reason.UNREACHABLE, f"{label} lost the connection: {exc}{tries}", in_doubt=True
    )


def _answer(response: httpx.Response, label: str) -> Any:
    status = response.status_code
    if status >= 400:
        message = _error_message(response)
        raise HttpCallError(
            reason_for_status(status),
            f"{label} answered {status}: {message}",
            status=status,
            message=message,
            in_doubt=status >= 500,
        )
    if not response.content.strip():
        return None
    try:
        return response.json()
    except ValueError:
        return response.text


def expect_dict(value: Any, label: str) -> dict[str, Any]:
    """Return ``value`` when it is a JSON object; else ActuatorError(``bad_response``)."""
    if not isinstance(value, dict):
        raise ActuatorError(
            Reason.BAD_RESPONSE, f"{label}: expected a JSON object, got {value!r:.200}"
        )
    return value


class HttpActuator(Actuator):
    """An actuator whose targets are objects behind HTTP admin APIs (see the module docstring).

    Subclasses give ``fetch`` (GET the raw state of a target), ``render`` (raw state -> the
    JSON text compared and diffed, None when absent) and ``send`` (the one mutating call that
    gives a target new content). ``settle_s``: how long an in-doubt write is read back.
    """

    poll_s: float = 0.05

    def __init__(self, *, settle_s: float) -> None:
        self.settle_s = settle_s
        self._mutex = threading.Lock()
        self._unsettled: list[str] = []
        self._clients: list[HttpApi] = []

    def connect(self, api: AdminApi) -> HttpApi:
        """Return a client for ``api``, closed by ``close``."""
        http = HttpApi(api)
        self._clients.append(http)
        return http

    def close(self) -> None:
        """Close every client's connections."""
        for http in self._clients:
            http.close()

    @abstractmethod
    def fetch(self, target: str) -> Any:
        """Return the raw API state behind ``target`` (GET); raise ActuatorError."""

    @abstractmethod
    def render(self, target: str, state: Any) -> str | None:
        """Return the content of ``target`` in ``state`` as JSON text, None when absent."""

    @abstractmethod
    def send(self, target: str, state: Any, content: str | None) -> None:
        """Make the one mutating call that turns ``state`` into ``content``; raise on failure."""

    def read(self, target: str) -> str | None:
        """Return the target's current content (GET, rendered)."""
        return self.render(target, self.fetch(target))

    def write(self, target: str, content: str | None) -> None:
        """Give ``target`` its content: GET it, then one mutating call; settle when in doubt.

        Raises the call's HttpCallError when it was refused (nothing changed) or in doubt
        (after reading back: undone when it landed, see the module docstring).
        """
        state = self.fetch(target)
        before = self.render(target, state)
        if before == content:
            return
        try:
            self.send(target, state, content)
        except HttpCallError as exc:
            if not exc.in_doubt:
                raise
            raise self._settle(target, before, content, exc) from exc

    def _settle(
        self, target: str, before: str | None, content: str | None, exc: HttpCallError
    ) -> ActuatorError:
        """Read ``target`` back after an in-doubt write; undo it if it landed; return the error."""
        deadline = time.monotonic() + self.settle_s
        now: str | None = before
        readable = True
        while True:
            try:
                now, readable = self.read(target), True
            except ActuatorError as read_exc:
                readable = False
                log.warning("read-back failed target=%s error=%s", target, read_exc)
            if readable and now == content:
                return self._undo(target, before, exc)
            if time.monotonic() >= deadline:
                break
            time.sleep(self.poll_s)
        if readable and now == before:
            return HttpCallError(
                exc.reason,
                f"{exc.detail}; read back for {self.settle_s:g} s: not applied (should it land "
                "later, verify reports the drift)",
                status=exc.status,
                message=exc.message,
            )
        state = "could not be read" if not readable else "holds neither the old nor new content"
        self._unsettled.append(f"{target} {state} after an in-doubt write")
        return exc

    def _undo(self, target: str, before: str | None, exc: HttpCallError) -> ActuatorError:
        log.warning("in-doubt write landed, undoing target=%s", target)
        try:
            state = self.fetch(target)
            self.send(target, state, before)
            if self.read(target) != before:
                raise ActuatorError(Reason.DRIFT, f"{target} did not take its previous content")
        except ActuatorError as undo_exc:
            self._unsettled.append(f"{target}: undoing a late write failed: {undo_exc}")
            return exc
        return HttpCallError(
            exc.reason,
            f"{exc.detail}; it landed late and was undone",
            status=exc.status,
            message=exc.message,
        )

    def validate(self) -> None:
        """Check nothing: each API validated its object when it accepted the write."""
        return None

    def activate(self) -> None:
        """Do nothing: a write is live once the API has answered."""
        return None

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Serialize operations of this actuator object; ActuatorError(``locked``) if busy."""
        if not self._mutex.acquire(blocking=False):
            raise ActuatorError(Reason.LOCKED, f"another operation on {self.target} is running")
        try:
            yield
        finally:
            self._mutex.release()

    def apply(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Apply ``plan`` (see ``Actuator.apply``); an unsettled in-doubt write: not restored."""
        self._unsettled = []
        return self._settled(super().apply(plan, dry_run=dry_run))

    def revert(self, plan: Plan, *, dry_run: bool = True) -> ActionResult:
        """Revert ``plan`` (see ``Actuator.revert``); an unsettled in-doubt write: not restored."""
        self._unsettled = []
        return self._settled(super().revert(plan, dry_run=dry_run))

    def _settled(self, result: ActionResult) -> ActionResult:
        if result.status is not Status.FAILED or not self._unsettled:
            return result
        note = "; ".join(self._unsettled)
        return replace(result, restored=False, error=f"{result.error}; {note}")
