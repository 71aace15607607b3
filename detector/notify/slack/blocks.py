"""Block Kit messages of an incident, built from the read model only (pure, table-tested).

``root_message`` is the one message per incident, updated in place: workload and stage first,
the victims in order, the four signals with their key figures, the survivor at risk, the
runbook steps with their state and, on a step waiting for approval, its blast radius and the
Approve/Deny buttons (each with a confirmation). ``reply_message`` is one thread reply telling
a group of timeline entries. Input: the incident's ``IncidentOut`` JSON dump (``inc``) and
its document (``detector.report.document.incident_document``). Every value from input goes
through ``detector.notify.slack.mrkdwn``. Block Kit reference:
https://api.slack.com/reference/block-kit/blocks (limits: 50 blocks, 3000 characters a
section, 150 a header; a confirmation's text 300).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from detector.notify.slack import lifecycle
from detector.notify.slack.mrkdwn import code, code_block, cut, text
from detector.report.document import decidable, past_expiry
from detector.report.now import StateNow

STAGE_EMOJI = {"suspected": "⚠️", "cascading": "🔥", "contained": "🛡️", "resolved": "✅"}
STATE_EMOJI = {
    "planned": "⏸️",
    "awaiting_approval": "⏳",
    "approved": "👍",
    "applying": "⚙️",
    "verifying": "🔎",
    "verified": "✅",
    "escalated": "⤴️",
    "withdrawn": "↩️",
    "denied": "🚫",
    "failed": "❌",
    "lifted": "🔓",
    "rolled_back": "⏪",
    "expired": "⌛",
}
DRILL = "🧪 DRILL (replay) · "
SECTION_LIMIT = 2900
MAX_VICTIMS = 12
METADATA_EVENT = "gpu_oom_incident"  # Slack message metadata event type of root messages
REPLY_EVENT = "gpu_oom_incident_reply"


class ActionId(StrEnum):
    """The buttons' action ids."""

    APPROVE = "approve_step"
    DENY = "deny_step"
    LIFECYCLE = lifecycle.ACTION_ID  # the on-call menu: acknowledge, snooze, resolve


@dataclass(frozen=True, slots=True)
class Message:
    """A message to post: fallback ``text`` (notifications), ``blocks`` and ``metadata``."""

    text: str
    blocks: list[dict[str, Any]]
    metadata: dict[str, Any] = field(default_factory=dict)
    broadcast: bool = False  # a reply also sent to the channel


@dataclass(frozen=True, slots=True)
class Options:
    """What the builders need beyond the read model: the web page's base URL, the pressure
    ceilings (used/total ratios, ``CorrelateSettings``), the wall clock (approval expiry) and
    whether this is a drill (``detector replay --notify``)."""

    base_url: str = ""
    memory_ceiling: float = 0.95
    kv_cache_ceiling: float = 0.95
    now: datetime | None = None
    drill: bool = False  # a replay posted for a drill or a demo: labelled, mentions no one


def root_message(
    inc: Mapping[str, Any],
    doc: Mapping[str, Any],
    options: Options,
    now: StateNow | None = None,
) -> Message:
    """Return the incident's root message (see the module doc); ``now``
    (``detector.report.now.state_now``) adds the state of now and keeps dead pods' readings
    out of the memory row."""
    stage = doc["stage"]
    emoji = STAGE_EMOJI.get(stage, "❔")
    drill = DRILL if options.drill else ""
    title = f"{drill}{emoji} {stage.upper()} · GPU OOM cascade · {doc['workload']}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": cut(title, 150)}},
        _section(_summary(inc, doc)),
        lifecycle.block(inc, options.now),
    ]
    if now is not None:
        blocks.append(_section(_now(now)))
    blocks += [_section(_victims(inc)), _section(_signals(inc, now))]
    risk = at_risk(inc, options)
    if risk:
        blocks.append(_section(f"*Next victim at risk:* {risk}"))
    oom = _first_oom_text(inc)
    if oom:
        blocks.append(_section(f"*First OOM, as logged:*\n{code_block(oom)}"))
    blocks += _steps(doc, options)
    blocks.append({"type": "context", "elements": [_mrkdwn(_footer(inc, options))]})
    victims = len(inc["victims"])
    fallback = f"{drill}{emoji} {stage}: GPU OOM cascade in {doc['workload']}, {victims} victims"
    metadata = {"event_type": METADATA_EVENT, "event_payload": {"incident": inc["key"]}}
    return Message(text(fallback, 300), blocks[:50], metadata)


def _summary(inc: Mapping[str, Any], doc: Mapping[str, Any]) -> str:
    stages = [t for t in inc["timeline"] if t["kind"] == "stage"]
    head = f"*{code(doc['workload'])}* ({text(inc['workload_kind'], 40)}) is *{doc['stage']}*"
    if stages:  # the reason as it stood when the stage was reached
        why = stages[-1]["message"].split(": ", 1)[-1]
        head += f" since {_clock(stages[-1]['time'])}: {text(why, 400)}"
    opened = _clock(inc["opened_at"], date=True)
    return f"{head}\nOpened {opened} · incident {code(inc['key'])}"


def _victims(inc: Mapping[str, Any]) -> str:
    victims = sorted(inc["victims"], key=lambda v: v["position"])
    if not victims:
        return "*Victims:* none yet"
    first = _parse(victims[0]["first_oom_at"])
    rows = []
    for v in victims[:MAX_VICTIMS]:
        after = (_parse(v["first_oom_at"]) - first).total_seconds()
        delay = f" (+{after:.0f} s)" if v["position"] > 1 else ""
        rows.append(f"{v['position']}. {code(v['pod'])} at {_clock(v['first_oom_at'])}{delay}")
    if len(victims) > MAX_VICTIMS:
        rows.append(f"… and {len(victims) - MAX_VICTIMS} more")
    return f"*Victims, in order ({len(victims)}):*\n" + "\n".join(rows)


def _now(now: StateNow) -> str:
    """Return the state of now: pods serving and down, the endpoint, the latest rates."""
    if now.endpoint_down:
        pods = f"🛑 *endpoint down:* all {len(now.seen)} pods seen are down"
    else:
        pods = f"*{now.serving} pods serving*"
        if now.down:
            named = ", ".join(code(p) for p in now.down[:4]) + (" …" if len(now.down) > 4 else "")
            pods += f", {len(now.down)} down ({named})"
    lines = [f"*Now:* {pods}"]
    lb = now.lb
    if lb is not None:
        ratio = f" ({lb.error_ratio:.0%})" if lb.error_ratio is not None else ""
        lines.append(
            f"Load balancer, {lb.window_s:.0f} s to {_clock(lb.until)}: "
            f"{lb.requests_per_s:.1f} req/s, 5xx {lb.errors_5xx_per_s:.1f}/s{ratio}, "
            f"429 {lb.shed_429_per_s:.1f}/s"
        )
    return "\n".join(lines)


def _signals(inc: Mapping[str, Any], now: StateNow | None = None) -> str:
    evidence = inc["evidence"]
    live = list(now.readings.values()) if now is not None else evidence
    lb = _latest_summary(evidence, "lb_errors")
    if lb:
        at = max(_parse(e["time"]) for e in evidence if e["kind"] == "lb_errors")
        lb = f"{lb} (at {_clock(at)})"
    rows = [
        ("GPU OOM", _oom_figures(evidence)),
        ("Crash loop", _latest_summary(evidence, "crash_loop")),
        ("Load balancer 5xx", lb),
        ("Memory pressure" + (", live pods" if now is not None else ""), _peak_memory(live)),
    ]
    lines = [f"• *{name}:* {value or '_not seen_'}" for name, value in rows]
    return "*Signals:*\n" + "\n".join(lines)


def _oom_figures(evidence: Sequence[Mapping[str, Any]]) -> str:
    ooms = [e for e in evidence if e["kind"] == "gpu_oom"]
    if not ooms:
        return ""
    attrs = ooms[0].get("attrs") or {}
    tried, free, total = (attrs.get(k) for k in ("bytes_tried", "free_bytes", "capacity_bytes"))
    if isinstance(tried, int | float) and isinstance(total, int | float):
        figures = f"tried {_gib(tried)}"
        figures += f", {_gib(free)} free" if isinstance(free, int | float) else ""
        figures += f" of {_gib(total)}"
    else:
        figures = text(ooms[0]["summary"], 200)
    more = f" · {len(ooms)} OOM lines" if len(ooms) > 1 else ""
    return f"{figures} in {code(ooms[0].get('pod') or '?')}{more}"


def _latest_summary(evidence: Sequence[Mapping[str, Any]], kind: str) -> str:
    found = [e for e in evidence if e["kind"] == kind]
    return text(found[-1]["summary"], 300) if found else ""


def _peak_memory(evidence: Sequence[Mapping[str, Any]]) -> str:
    """Return the highest memory or KV-cache reading (a queue-depth one when there is none)."""
    found = [e for e in evidence if e["kind"] == "gpu_memory"]
    memory = [e for e in found if (e.get("attrs") or {}).get("pressure") != "queue depth"]
    if not found:
        return ""
    peak = max(memory or found, key=lambda e: _ratio(e) or 0.0)
    return text(peak["summary"], 300)


def at_risk(inc: Mapping[str, Any], options: Options) -> str:
    """Return the survivor at risk, as mrkdwn ("": none).

    The latest next-victim forecast (evidence ``next_victim``, detector.correlate.forecast)
    of a pod that is not a victim yet names it, with its ETA and when it was made. Else a
    survivor at its ceiling: a pod with memory evidence that is not a victim, whose latest
    reading's used/total ratio (``attrs.ratio``) is compared with the KV-cache ceiling when it
    is KV-cache pressure, else with the GPU-memory ceiling; the highest such reading is named.
    """
    victims = {v["pod"] for v in inc["victims"]}
    forecasts = [e for e in inc["evidence"] if e["kind"] == "next_victim"]
    e = max(forecasts, key=lambda e: str(e["time"])) if forecasts else None
    if e is not None and e.get("pod") and e["pod"] not in victims:
        eta = (e.get("attrs") or {}).get("eta_s")
        when = f" in ~{eta:.0f} s" if isinstance(eta, int | float) else ""
        return f"{code(e['pod'])}{when} (forecast at {_clock(e['time'])})"
    latest: dict[str, Mapping[str, Any]] = {}
    for e in inc["evidence"]:
        if e["kind"] == "gpu_memory" and e.get("pod") and e["pod"] not in victims:
            latest[e["pod"]] = e
    over = []
    for pod, e in latest.items():
        ratio = _ratio(e)
        kv = (e.get("attrs") or {}).get("pressure") == "KV cache"
        ceiling = options.kv_cache_ceiling if kv else options.memory_ceiling
        if ratio is not None and ratio >= ceiling:
            over.append((ratio, pod, e))
    if not over:
        return ""
    ratio, pod, e = max(over)
    return f"{code(pod)}: {text(e['summary'], 200)} at {_clock(e['time'])}"


def _first_oom_text(inc: Mapping[str, Any]) -> str:
    ooms = [e for e in inc["evidence"] if e["kind"] == "gpu_oom" and e.get("text")]
    return ooms[0]["text"] if ooms else ""


def _steps(doc: Mapping[str, Any], options: Options) -> list[dict[str, Any]]:
    steps = doc["steps"]
    if not steps:
        return []
    blocks: list[dict[str, Any]] = [{"type": "divider"}, _section("*Containment runbook:*")]
    for step in steps:
        blocks.append(_section(_step_text(step, options.now)))
        if decidable(step, options.now):
            blocks.append(_section(_blast_radius(step)))
            blocks.append(_buttons(doc["key"], step))
    return blocks


def _step_text(step: Mapping[str, Any], now: datetime | None) -> str:
    state = step["state"] or step["status"]
    approval = step["approval_state"]
    label = state.replace("_", " ")
    if state == "awaiting_approval" and approval.get("status") in ("approved", "denied"):
        state, label = approval["status"], f"{approval['status']}, moves at the next step"
    elif state == "awaiting_approval" and (expired := past_expiry(approval, now)):
        state, label = "expired", f"approval expired at {_clock(expired, date=True)}"
    emoji = STATE_EMOJI.get(state, "•")
    policy = "automatic" if step["policy"] == "auto" else "needs approval"
    head = f"{emoji} *{step['position']}. {text(step['title'], 150)}* — {label}"
    lines = [f"{head} ({policy}{', dry-run' if step.get('mode') == 'dry_run' else ''})"]
    if approval.get("decided_by") and approval.get("status") in ("approved", "denied"):
        when = _clock(approval["decided_at"]) if approval.get("decided_at") else "?"
        lines.append(
            f"{approval['status']} by {code(approval['decided_by'])} "
            f"via {text(approval.get('via') or '?', 20)} at {when}"
        )
    mechanism = (step.get("params") or {}).get("mechanism")
    if mechanism:
        evidence = (step.get("params") or {}).get("mechanism_evidence") or ""
        lines.append(f"mechanism {code(str(mechanism), 40)}: {text(str(evidence), 300)}")
    if step.get("reason"):
        lines.append(text(step["reason"], 600))
    return "\n".join(lines)


# The parameters that say what a step touches, in the order they are shown.
BLAST_PARAMS = (
    ("max_body_bytes", "refuses requests over, bytes (413)"),
    ("refused_share_text", "of the traffic before"),
    ("pods", "pods"),
    ("current_settings", "now"),
    ("settings", "after"),
    ("rollout", "rollout"),
    ("limit_rps", "limit, req/s per client"),
    ("limit_connections", "limit, connections per client"),
    ("aggregate_bound_rps", "aggregate it bounds, req/s"),
    ("aggregate_budget_rps", "healthy capacity left, req/s"),
    ("clients_seen", "clients seen"),
    ("method", "method"),
    ("spacing_s", "spacing, s"),
)


def _blast_radius(step: Mapping[str, Any]) -> str:
    params = step.get("params") or {}
    rows = []
    for key, label in BLAST_PARAMS:
        value = params.get(key)
        if value not in (None, "", []):
            shown = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
            rows.append(f"• {label}: {code(shown, 300)}")
    expires = step["approval_state"].get("expires_at")
    head = "*What approving does:*" + (
        f" (decide by {_clock(expires, date=True)})" if expires else ""
    )
    diff = f"\n{code_block(step['diff'], lines=12)}" if step.get("diff") else ""
    return cut(head + "\n" + "\n".join(rows) + diff, SECTION_LIMIT)


def _buttons(key: str, step: Mapping[str, Any]) -> dict[str, Any]:
    value = action_value(key, step["position"], step["approval_state"].get("plan") or "")
    summary = f"{step['title']}: {step.get('reason') or ''}"
    return {
        "type": "actions",
        "block_id": f"step-{step['position']}",
        "elements": [
            _button("Approve", ActionId.APPROVE, value, "primary", summary),
            _button("Deny", ActionId.DENY, value, "danger", "Nothing is applied. " + summary),
        ],
    }


def _button(label: str, action: ActionId, value: str, style: str, body: str) -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "action_id": action.value,
        "value": value,
        "style": style,
        "confirm": {
            "title": {"type": "plain_text", "text": f"{label} this step?"},
            "text": {"type": "mrkdwn", "text": text(body, 300)},
            "confirm": {"type": "plain_text", "text": label},
            "deny": {"type": "plain_text", "text": "Cancel"},
            "style": style,
        },
    }


def action_value(key: str, position: int, plan: str) -> str:
    """Return a button's value: the incident key, the step position and the plan digest seen."""
    return json.dumps({"incident": key, "step": position, "plan": plan}, separators=(",", ":"))


def _footer(inc: Mapping[str, Any], options: Options) -> str:
    decided = [a["decided_at"] for a in inc.get("approvals", []) if a.get("decided_at")]
    updated = _clock(max([_parse(t) for t in [inc["updated_at"], *decided]]))
    if options.base_url:
        url = f"{options.base_url.rstrip('/')}/incidents/{int(inc['id'])}"
        return (
            f"<{url}|Open the incident timeline> · <{url}/postmortem.html|Postmortem draft> · "
            f"updated {updated}"
        )
    return f"updated {updated}"


def reply_message(
    inc: Mapping[str, Any],
    entries: Sequence[Mapping[str, Any]],
    key: str,
    mention: str = "",
    drill: bool = False,
) -> Message:
    """Return one thread reply telling ``entries`` (timeline entries, oldest first).

    The reply that announces ``cascading`` starts with ``mention`` (a trusted setting, e.g.
    ``<!subteam^S0123>``) and is also sent to the channel, unless it is a ``drill``; the one
    that announces ``resolved`` or ``contained`` ends with the durations since the opening.
    """
    lines = [f"`{_clock(e['time'])}` {_entry_emoji(e)} {text(e['message'], 700)}" for e in entries]
    stages = {_stage_of(e) for e in entries} - {None}
    cascading = "cascading" in stages and not drill
    if stages & {"contained", "resolved"}:
        lines.append(durations(inc))
    body = "\n".join(lines)
    fallback = text(entries[0]["message"], 200) if entries else "update"
    if cascading:
        workload = code(f"{inc['namespace']}/{inc['workload']}")
        fallback = f"{mention} the GPU OOM cascade is spreading in {workload}".strip()
        body = f"{fallback}\n{body}"
    if drill:
        fallback = DRILL + fallback
    blocks = [_section(chunk) for chunk in _chunks(body)]
    metadata = {"event_type": REPLY_EVENT, "event_payload": {"incident": inc["key"], "reply": key}}
    return Message(fallback, blocks[:50], metadata, broadcast=cascading)


def durations(inc: Mapping[str, Any]) -> str:
    """Return how long the incident took to reach each stage, from its opening (mrkdwn)."""
    opened = _parse(inc["opened_at"])
    parts = []
    for t in inc["timeline"]:
        stage = _stage_of(t)
        if stage and stage != "suspected":
            parts.append(f"{stage} after {_duration((_parse(t['time']) - opened).total_seconds())}")
    return "*Durations:* " + (", ".join(parts) if parts else "none yet")


def _stage_of(entry: Mapping[str, Any]) -> str | None:
    if entry["kind"] != "stage":
        return None
    head = entry["message"].split(":", 1)[0]
    return head.removeprefix("stage -> ").strip() or None


def _entry_emoji(entry: Mapping[str, Any]) -> str:
    stage = _stage_of(entry)
    if stage:
        return STAGE_EMOJI.get(stage, "•")
    if entry["kind"] == "signal":
        return "💀"
    detail = entry.get("detail") or {}  # a person's decision has an event and no state
    return STATE_EMOJI.get(str(detail.get("state") or detail.get("event") or ""), "•")


def _chunks(body: str) -> list[str]:
    out, current = [], ""
    for line in body.split("\n"):
        if current and len(current) + len(line) + 1 > SECTION_LIMIT:
            out.append(current)
            current = ""
        current = f"{current}\n{line}" if current else cut(line, SECTION_LIMIT)
    return [*out, current] if current else out


def _section(body: str) -> dict[str, Any]:
    return {"type": "section", "text": _mrkdwn(cut(body, SECTION_LIMIT))}


def _mrkdwn(body: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": body}


def _ratio(e: Mapping[str, Any]) -> float | None:
    value = (e.get("attrs") or {}).get("ratio")
    return float(value) if isinstance(value, int | float) else None


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 120:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60} min"


def _parse(value: str | datetime) -> datetime:
    when = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return when.astimezone(UTC)


def _clock(value: str | datetime, *, date: bool = False) -> str:
    when = _parse(value)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC" if date else "%H:%M:%S")
