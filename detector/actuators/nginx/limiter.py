"""Plain nginx gateway rate limit: write two include files, ``nginx -t``, then reload.

The step (runbook action ``enable_rate_limit``) answers excess requests with HTTP 429 at the
gateway in front of the workload. What it writes and how the operator wires it:
:mod:`detector.actuators.nginx.config`. One apply is one transaction
(:class:`detector.actuators.base.Actuator`): both files are replaced atomically, the whole
configuration is checked with ``nginx -t`` and only then reloaded with ``nginx -s reload``; a
configuration that fails the check is written back and never reloaded. The previous content
of both files is in the plan (``Change.before``), so ``revert(plan)`` restores it exactly.

When ``pid_file`` is given, the reload is confirmed: nginx's master answers SIGHUP by starting
new workers and telling the old ones to shut down gracefully, or, if the new configuration
fails to load, logs the error and keeps the old workers. So the reload counts as done only once
every worker still serving was started after it, read from ``/proc`` (Linux); where the
workers are not visible there (no ``/proc``, ``hidepid``) the check is skipped.
Sources: https://nginx.org/en/docs/control.html (changing configuration),
https://nginx.org/en/docs/switches.html (``-t``, ``-s``, ``-c``, ``-p``, ``-e``).

Every nginx command runs with argv (never a shell) under ``command_timeout_s``; failures
become ``ActuatorError`` codes: ``binary_missing``, ``timeout``, ``config_invalid``,
``reload_failed``, ``not_running``, ``locked``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from detector.actuators.base import ActivationRefused, Actuator, ActuatorError, Plan, Reason
from detector.actuators.nginx.config import (
    AdmissionRule,
    RateLimit,
    render_admission,
    render_http,
    render_location,
)

log = logging.getLogger(__name__)

PROC = Path("/proc")
_STDERR_TAIL_CHARS = 600
_CONFIRM_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class NginxGateway:
    """Where an nginx runs and how to drive it.

    ``conf_path`` is the main configuration (``-c``) that includes ``http_include`` inside
    ``http {}`` and ``location_include`` in a ``server {}`` or ``location {}``; ``prefix``
    (``-p``) and ``error_log`` (``-e``, nginx >= 1.19.5) are passed when set, so that
    ``nginx -t`` and ``nginx -s reload`` see what the running master sees. ``pid_file`` (the
    config's ``pid``) enables the running check and the reload confirmation. Seconds:
    ``command_timeout_s`` per nginx command, ``reload_confirm_s`` for the new workers.
    """

    conf_path: Path
    http_include: Path
    location_include: Path
    admission_include: Path | None = None
    prefix: Path | None = None
    pid_file: Path | None = None
    error_log: Path | None = None
    nginx_bin: str = "nginx"
    command_timeout_s: float = 10.0
    reload_confirm_s: float = 10.0

    def argv(self, *args: str) -> list[str]:
        """Return the nginx command line for ``args`` (``-t``, ``-s reload`` ...)."""
        argv = [self.nginx_bin]
        if self.prefix is not None:
            argv += ["-p", str(self.prefix)]
        argv += ["-c", str(self.conf_path)]
        if self.error_log is not None:
            argv += ["-e", str(self.error_log)]
        return [*argv, *args]


def serving_children(pid: int) -> frozenset[int] | None:
    """Return the pids of ``pid``'s children not titled "shutting down"; None without /proc.

    nginx retitles a worker ``nginx: worker process is shutting down`` once it stops accepting
    connections after a reload. Children that vanish while being read are left out.
    """
    if not (PROC / "self" / "stat").exists():
        return None
    children = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(pid) and b"shutting down" not in title:
            children.add(int(entry.name))
    return frozenset(children)


class NginxRateLimiter(Actuator):
    """Enable, change or lift an nginx ``limit_req`` rate limit through two include files."""

    action: ClassVar[str] = "enable_rate_limit"

    def __init__(self, gateway: NginxGateway) -> None:
        self.gateway = gateway
        self._files = {str(gateway.http_include), str(gateway.location_include)}

    @property
    def target(self) -> str:
        """Return ``nginx:<conf_path>``."""
        return f"nginx:{self.gateway.conf_path}"

    def plan(self, limit: RateLimit) -> Plan:
        """Return the plan that puts ``limit`` in force (both include files).

        Raises ActuatorError (``io_error``) when a file cannot be read.
        """
        return self.plan_contents(
            {
                str(self.gateway.http_include): render_http(limit),
                str(self.gateway.location_include): render_location(limit),
            },
            limit.describe(),
        )

    def plan_lift(self) -> Plan:
        """Return the plan that lifts any limit: both files hold comments only."""
        return self.plan_contents(
            {
                str(self.gateway.http_include): render_http(None),
                str(self.gateway.location_include): render_location(None),
            },
            "no rate limit",
        )

    def _path(self, target: str) -> Path:
        """Return the path of one of this actuator's include files; ActuatorError otherwise."""
        if target not in self._files:
            raise ActuatorError(
                Reason.INVALID_REQUEST, f"{target} is not an include file of {self.target}"
            )
        return Path(target)

    def read(self, target: str) -> str | None:
        """Return the include file's text, or None when it does not exist."""
        try:
            return self._path(target).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write(self, target: str, content: str | None) -> None:
        """Replace the include file atomically (temp file + rename); None removes it."""
        path = self._path(target)
        if content is None:
            path.unlink(missing_ok=True)
            return
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def validate(self) -> None:
        """Run ``nginx -t -q``; raise ActuatorError(``config_invalid``) when it fails."""
        self._run(Reason.CONFIG_INVALID, "-t", "-q")

    def activate(self) -> None:
        """Run ``nginx -s reload`` and, with a pid file, wait for the new workers.

        ``nginx -s reload`` parses the configuration, then signals the master; a non-zero exit
        means no signal was sent (ActivationRefused). Unconfirmed workers or a timeout leave
        the live state unknown (ActuatorError): the restore then reloads the old files.
        """
        master = self._master_pid() if self.gateway.pid_file is not None else None
        before = serving_children(master) if master is not None else None
        try:
            self._run(Reason.RELOAD_FAILED, "-s", "reload")
        except ActuatorError as exc:
            if exc.reason == Reason.TIMEOUT:
                raise  # the signal may have been sent: the restore reloads again
            raise ActivationRefused(exc.reason, exc.detail) from exc  # nginx was not signalled
        if master is not None and before:  # workers hidden (no /proc, hidepid): not checked
            self._await_new_workers(master, before)

    def preflight(self) -> None:
        """With a pid file, check the master runs: a limit for a stopped nginx lands nowhere."""
        if self.gateway.pid_file is not None:
            self._master_pid()

    def check_live(self) -> None:
        """With a pid file, check the master runs."""
        self.preflight()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold an exclusive flock on the include directory; ActuatorError(``locked``) if busy.

        The directory itself is locked, so no lock file is added next to the includes.
        """
        try:
            fd = os.open(self.gateway.http_include.parent, os.O_RDONLY)
        except FileNotFoundError:
            yield  # nothing to lock: the files cannot exist, writes will fail on their own
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise ActuatorError(
                    Reason.LOCKED, "another operation holds the include lock"
                ) from exc
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _run(self, reason: Reason, *args: str) -> None:
        argv = self.gateway.argv(*args)
        command = " ".join(argv)
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.gateway.command_timeout_s,
                check=False,
            )
        except FileNotFoundError as exc:
            raise ActuatorError(Reason.BINARY_MISSING, f"{argv[0]} not found") from exc
        except subprocess.TimeoutExpired as exc:
            limit = self.gateway.command_timeout_s
            raise ActuatorError(Reason.TIMEOUT, f"{command} ran over {limit:g} s") from exc
        except OSError as exc:
            raise ActuatorError(reason, f"{command} could not run: {exc}") from exc
        if done.returncode != 0:
            output = (done.stderr or done.stdout or "").strip()[-_STDERR_TAIL_CHARS:]
            raise ActuatorError(reason, f"{command} exited {done.returncode}: {output}")
        log.debug("nginx command ok command=%r", command)

    def _master_pid(self) -> int:
        pid_file = self.gateway.pid_file
        try:
            text = pid_file.read_text(encoding="ascii").strip() if pid_file else ""
            pid = int(text)
        except (OSError, ValueError) as exc:
            raise ActuatorError(Reason.NOT_RUNNING, f"no master pid in {pid_file}: {exc}") from exc
        try:
            os.kill(pid, 0)
        except ProcessLookupError as exc:
            raise ActuatorError(Reason.NOT_RUNNING, f"nginx master {pid} is not running") from exc
        except PermissionError:
            pass  # it runs, as another user
        return pid

    def _await_new_workers(self, master: int, before: frozenset[int]) -> None:
        """Wait until every serving worker is new; raise ActuatorError(``reload_failed``)."""
        deadline = time.monotonic() + self.gateway.reload_confirm_s
        while True:
            now = serving_children(master)
            if now is None or (now and now.isdisjoint(before)):
                return
            if time.monotonic() >= deadline:
                raise ActuatorError(
                    Reason.RELOAD_FAILED,
                    f"nginx master {master} still serves with workers from before the reload "
                    f"after {self.gateway.reload_confirm_s:g} s: it did not load the new "
                    "configuration (see its error log)",
                )
            time.sleep(_CONFIRM_POLL_S)


class NginxAdmission(NginxRateLimiter):
    """Put in force or remove the admission rule (``client_max_body_size``, 413) through the
    admission include; the same transaction, check, reload and lock as the rate limit."""

    action: ClassVar[str] = "quarantine_requests"

    def __init__(self, gateway: NginxGateway) -> None:
        if gateway.admission_include is None:
            raise ActuatorError(Reason.NOT_CONFIGURED, "nginx has no admission_include")
        super().__init__(gateway)
        self.include = gateway.admission_include
        self._files = {str(self.include)}

    def plan(self, rule: AdmissionRule) -> Plan:  # type: ignore[override]
        """Return the plan that puts ``rule`` in force. Raises ActuatorError (``io_error``)."""
        return self.plan_contents({str(self.include): render_admission(rule)}, rule.describe())

    def plan_lift(self) -> Plan:
        """Return the plan that removes any admission rule (comments only)."""
        return self.plan_contents({str(self.include): render_admission(None)}, "no admission rule")
