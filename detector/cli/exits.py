"""How a command ends: one line on stderr and the exit code, never a traceback.

Exit codes of every command: 0 done; 1 refused or not done (the command says which); 2 a
user error (bad option or setting, no such store, an unreachable broker, input that needs
more options), said in one line; 130 interrupted (Ctrl-C), said as ``interrupted``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NoReturn, ParamSpec, TypeVar

import typer

from detector.textsafe import printable

P = ParamSpec("P")
R = TypeVar("R")
INTERRUPTED = 130  # 128 + SIGINT, as shells report a process ended by Ctrl-C


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` as one safe line on stderr and exit with ``code``."""
    typer.echo(printable(f"error: {message}", one_line=True), err=True)
    raise typer.Exit(code)


def interruptible(command: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command so that Ctrl-C ends it with ``interrupted`` on stderr and exit 130.

    Typer turns KeyboardInterrupt into exit 130 without a word; this says what happened.
    """

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(INTERRUPTED) from None

    return wrapper
