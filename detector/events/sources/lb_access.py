"""Load-balancer access and error lines other than ingress-nginx's access log."""

from __future__ import annotations

from typing import Any

from detector.events.model import LogLine, Signal, SourcePos


def signal_from_lb_line(line: LogLine, source: SourcePos) -> Signal | None:
    """Return the LB_RESPONSE signal of a proxy log line inside a container log, or None."""
    return None


def signal_from_raw_lb_line(
    text: str, source: SourcePos, default_time: float | None = None
) -> Signal | None:
    """Return the LB_RESPONSE signal of a bare load-balancer log line, or None."""
    return None


def signals_from_lb_json(obj: dict[str, Any], source: SourcePos) -> list[Signal] | None:
    """Return the signals of a JSON load-balancer log record, or None if it is not one."""
    return None
