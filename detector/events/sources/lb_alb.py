"""AWS Application Load Balancer access-log entries -> LB_RESPONSE attrs.

One space-separated entry per request::

    type time elb client:port target:port request_processing_time target_processing_time
    response_processing_time elb_status_code target_status_code received_bytes sent_bytes
    "request" "user_agent" ssl_cipher ssl_protocol target_group_arn "trace_id" "domain_name"
    "chosen_cert_arn" matched_rule_priority request_creation_time "actions_executed"
    "redirect_url" "error_reason" "target:port_list" "target_status_code_list" ...

``target`` and ``target_status_code`` are ``-`` when the load balancer never got a response
(502/503/504 of its own), processing times ``-1``. Later fields were added over the years and
are optional here. Source:
https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-access-logs.html
"""

from __future__ import annotations

import re

from detector.events.sources.lb_common import LbParse, client_host, lb_attrs, number_or_none
from detector.events.sources.timeparse import parse_iso8601

TYPES = ("http ", "https ", "h2 ", "grpcs ", "ws ", "wss ")

_QUOTED = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_ENTRY = re.compile(
    r"(?:https?|h2|grpcs|wss?) (\d{4}-\S+) \S+ (\S+) (\S+) (-?[\d.]+) (-?[\d.]+) (-?[\d.]+) "
    r"(\d{3}|-) (\d{3}|-)"
    r"(?: \S+ \S+ " + _QUOTED + " " + _QUOTED + r" \S+ \S+ (\S+)(?: (.*))?)?"
)
_TARGET_GROUP = re.compile(r"arn:[^:]+:elasticloadbalancing:[^/]*:targetgroup/([^/]+)/")
_TOKEN = re.compile(r'"[^"]*"|\S+')
_ERROR_REASON_AT = 7  # "trace" "domain" "cert" priority time "actions" "redirect" "error_reason"


def parse_entry(text: str) -> LbParse | None:
    """Parse an ALB access-log entry; None if it is not one or has no ``elb_status_code``.

    attrs: status (elb_status_code), upstream_status (target_status_code | None), upstream (the
    target group name from ``targetgroup/<name>/<id>``), upstream_addr (target:port | None),
    request_time_s (the three processing times summed; None when one is -1), error_reason,
    client (``client:port`` without the port).
    Format:
    https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-access-logs.html#access-log-entry-syntax
    """
    m = _ENTRY.match(text)
    if m is None or m.group(7) == "-":
        return None
    times = [number_or_none(m.group(i)) for i in (4, 5, 6)]
    target_status = m.group(8)
    arn = _TARGET_GROUP.match(m.group(9) or "")
    attrs = lb_attrs(
        int(m.group(7)),
        upstream=arn.group(1) if arn else None,
        upstream_status=int(target_status) if target_status != "-" else None,
        upstream_addr=m.group(3) if m.group(3) != "-" else None,
        request_time_s=round(sum(t for t in times if t is not None), 6)
        if None not in times
        else None,
        client=client_host(m.group(2)),
    )
    reason = _error_reason(m.group(10)) if attrs["status"] >= 400 else None  # set on errors
    if reason:
        attrs["error_reason"] = reason
    return LbParse(attrs, m.group(1), parse_iso8601)


def _error_reason(tail: str | None) -> str | None:
    """Return the ``error_reason`` field of the optional tail, or None."""
    if not tail:
        return None
    tokens = _TOKEN.findall(tail)
    if len(tokens) <= _ERROR_REASON_AT:
        return None
    reason = tokens[_ERROR_REASON_AT].strip('"')
    return reason if reason and reason != "-" else None
