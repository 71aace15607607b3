"""The Slack builders: Block Kit from the read model, input text as literal data."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from detector.incidents.schemas import TimelineEntryOut
from detector.notify.slack import mrkdwn
from detector.notify.slack.blocks import (
    ActionId,
    Options,
    at_risk,
    durations,
    reply_message,
    root_message,
)
from detector.report.document import incident_document
from detector.report.recovery import attribute

HOSTILE = "<!channel> <@U123> <http://x|y> & <!subteam^S1> `tick` \x1b[2J \u202e"
T0 = datetime(2026, 12, 2, 9, 3, 37, tzinfo=UTC)


def _at(s: float) -> str:
    return (T0 + timedelta(seconds=s)).isoformat()


def _evidence(i: int, kind: str, pod: str, s: float, summary: str, **attrs: Any) -> dict:
    return {
        "id": i,
        "kind": kind,
        "pod": pod,
        "time": _at(s),
        "summary": summary,
        "source": f"logs.jsonl:{i}",
        "text": attrs.pop("text", ""),
        "attrs": attrs,
    }


def _step(position: int, state: str, approval: dict | None = None, **params: Any) -> dict:
    return {
        "position": position,
        "action": "stagger_restarts",
        "title": f"Restart the crashed pods {HOSTILE}",
        "status": "planned",
        "approval": "approval" if approval else "auto",
        "params": params,
        "result": {"state": state, "reason": f"asks sre-oncall {HOSTILE}", "mode": "dry_run"},
    }


def _incident(stage: str = "cascading", steps: list[dict] | None = None, **extra: Any) -> dict:
    pods = ["vllm-a", "vllm-b"]
    return {
        "id": 7,
        "key": "llm/vllm@1",
        "pattern": "gpu_oom_cascade",
        "cluster": None,
        "namespace": "llm",
        "workload": "vllm",
        "workload_kind": "Deployment",
        "stage": stage,
        "opened_at": _at(0),
        "updated_at": _at(60),
        "resolved_at": None,
        "victims": [
            {"pod": p, "position": n + 1, "first_oom_at": _at(29 * n)} for n, p in enumerate(pods)
        ],
        "evidence": [
            _evidence(
                1,
                "gpu_oom",
                "vllm-a",
                0,
                "GPU OOM",
                bytes_tried=2 * 2**30,
                free_bytes=1138166333,
                capacity_bytes=85029615043,
                text=f"torch.OutOfMemoryError: CUDA out of memory. {HOSTILE}\n" + "x" * 900,
            ),
            _evidence(2, "lb_errors", "gw", 10, f"5xx surge {HOSTILE}"),
            _evidence(
                3, "gpu_memory", "vllm-c", 20, "KV cache at 98%", ratio=0.98, pressure="KV cache"
            ),
            _evidence(
                4, "gpu_memory", "vllm-d", 20, "KV cache at 60%", ratio=0.6, pressure="KV cache"
            ),
        ],
        "timeline": extra.pop("timeline", []),
        "runs": [{"steps": steps or []}],
        "questions": [],
        "approvals": extra.pop("approvals", []),
    }


def _texts(blocks: list[dict]) -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("mrkdwn", "plain_text"):
                found.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(blocks)
    return found


def _message(inc: dict, now: datetime | None = None) -> Any:
    return root_message(inc, incident_document(inc), Options("https://d.example", now=now))


def test_input_text_never_becomes_a_mention_link_or_control() -> None:
    msg = _message(_incident(steps=[_step(1, "verifying")]))
    for body in _texts(msg.blocks):
        assert not re.search(r"<[!@#]", body), body
        assert "<http://x" not in body
        assert "\x1b" not in body and "\u202e" not in body
    joined = "\n".join(_texts(msg.blocks))
    assert "&lt;!channel&gt;" in joined and "&lt;@U123&gt;" in joined and "&amp;" in joined
    assert "&lt;http://x|y&gt;" in joined
    # the only links are the detector's own pages: the incident and its postmortem draft
    assert re.findall(r"<(http[^|>]+)\|", joined) == [
        "https://d.example/incidents/7",
        "https://d.example/incidents/7/postmortem.html",
    ]


def test_root_message_tells_stage_victims_signals_and_risk_first() -> None:
    msg = _message(_incident())
    header = msg.blocks[0]["text"]["text"]
    assert header.startswith("🔥 CASCADING") and "llm/vllm" in header
    joined = "\n".join(_texts(msg.blocks))
    assert "1. `vllm-a` at 09:03:37" in joined and "2. `vllm-b` at 09:04:06 (+29 s)" in joined
    assert "tried 2.00 GiB, 1.06 GiB free of 79.19 GiB" in joined
    assert "*Next victim at risk:* `vllm-c`" in joined
    payload = {"incident": "llm/vllm@1"}
    assert msg.metadata == {"event_type": "gpu_oom_incident", "event_payload": payload}


def test_long_log_lines_are_cut_in_a_code_block() -> None:
    msg = _message(_incident())
    oom = next(t for t in _texts(msg.blocks) if t.startswith("*First OOM"))
    block = oom.split("\n", 1)[1]
    assert block.startswith("```") and block.endswith("```")
    assert block.count("`") == 6  # the backtick from input is a look-alike inside
    assert max(len(line) for line in block.split("\n")) <= 310


def test_a_step_waiting_for_approval_has_buttons_with_its_blast_radius() -> None:
    expires = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    approval = {
        "position": 1,
        "status": "pending",
        "policy": "approval",
        "approver_group": "sre-oncall",
        "decided_by": None,
        "via": None,
        "decided_at": None,
        "expires_at": expires,
        "reason": "",
        "plan_digest": "abc123",
    }
    step = _step(1, "awaiting_approval", approval, pods='["vllm-a", "vllm-b"]', spacing_s="60")
    msg = _message(_incident(steps=[step], approvals=[approval]), now=datetime.now(UTC))
    actions = [b for b in msg.blocks if b["type"] == "actions"]
    assert len(actions) == 1
    approve, deny = actions[0]["elements"]
    assert approve["action_id"] == ActionId.APPROVE and deny["action_id"] == ActionId.DENY
    assert json.loads(approve["value"]) == {"incident": "llm/vllm@1", "step": 1, "plan": "abc123"}
    assert approve["confirm"]["text"]["text"].startswith("Restart the crashed pods")
    assert len(approve["confirm"]["text"]["text"]) <= 300
    radius = "\n".join(_texts(msg.blocks))
    assert "pods: `vllm-a, vllm-b`" in radius and "spacing, s: `60`" in radius
    # expired by the wall clock: no buttons any more
    later = datetime.now(UTC) + timedelta(hours=1)
    msg = _message(_incident(steps=[step], approvals=[approval]), now=later)
    assert not [b for b in msg.blocks if b["type"] == "actions"]


def test_a_decided_step_shows_who_and_when() -> None:
    approval = {
        "position": 1,
        "status": "approved",
        "policy": "approval",
        "approver_group": "sre-oncall",
        "decided_by": "slack:U42",
        "via": "slack",
        "decided_at": _at(100),
        "expires_at": _at(600),
        "reason": "",
    }
    msg = _message(_incident(steps=[_step(1, "approved", approval)], approvals=[approval]))
    assert "approved by `slack:U42` via slack at 09:05:17" in "\n".join(_texts(msg.blocks))


def _entry(i: int, s: float, kind: str, message: str) -> dict:
    return {"id": i, "time": _at(s), "kind": kind, "message": message, "evidence_id": None}


@pytest.mark.parametrize(("event", "emoji"), [("approved", "👍"), ("denied", "🚫")])
def test_a_decision_is_told_with_its_mark_who_and_when(event: str, emoji: str) -> None:
    """``approvals.decide``'s entry: the decision, told once, at its wall-clock time."""
    detail = {"step": "stagger_restarts", "position": 4, "event": event, "actor": "slack:U42",
              "via": "slack", "reason": ""}  # fmt: skip
    message = f"step 4 stagger_restarts {event} by slack:U42 via slack"
    entry = _entry(9, 95, "step", message) | {"detail": detail}
    body = "\n".join(_texts(reply_message(_incident(), [entry], "7-9").blocks))
    assert body == f"`09:05:12` {emoji} {message}"


def test_the_cascading_reply_mentions_on_call_and_is_broadcast() -> None:
    entries = [
        _entry(1, 29, "signal", f"victim #2: pod vllm-b died of GPU OOM {HOSTILE}"),
        _entry(2, 29, "stage", "stage -> cascading: pod vllm-b died"),
    ]
    reply = reply_message(_incident(), entries, "7-1", mention="<!subteam^S0ONCALL>")
    body = "\n".join(_texts(reply.blocks))
    assert body.startswith("<!subteam^S0ONCALL> the GPU OOM cascade is spreading")
    assert "&lt;!channel&gt;" in body and reply.broadcast
    assert reply.metadata["event_payload"] == {"incident": "llm/vllm@1", "reply": "7-1"}
    quiet = reply_message(_incident(), entries[:1], "7-2", mention="<!subteam^S0ONCALL>")
    assert "S0ONCALL" not in "\n".join(_texts(quiet.blocks)) and not quiet.broadcast


def test_resolution_posts_the_durations() -> None:
    timeline = [
        _entry(1, 0, "stage", "stage -> suspected: x"),
        _entry(2, 29, "stage", "stage -> cascading: y"),
        _entry(3, 203, "stage", "stage -> contained: z"),
        _entry(4, 503, "stage", "stage -> resolved: quiet"),
    ]
    inc = _incident(stage="resolved", timeline=timeline)
    assert durations(inc) == (
        "*Durations:* cascading after 29 s, contained after 3 min 23 s, resolved after 8 min 23 s"
    )
    reply = reply_message(inc, timeline[3:], "7-4")
    assert "resolved after 8 min 23 s" in "\n".join(_texts(reply.blocks))


def test_the_contained_reply_and_root_say_who_contained_it() -> None:
    """The read model attributes the stage entry (``detector.report.recovery``); the thread's
    reply and the root message's summary show it as it stands."""
    applied = {"step": "enable_rate_limit", "position": 3, "event": "applied", "mode": "live",
               "state": "verifying"}  # fmt: skip
    entries = [
        _entry(1, 29, "stage", "stage -> cascading: y") | {"detail": None},
        _entry(2, 40, "step", "step 3 enable_rate_limit applied [live]") | {"detail": applied},
        _entry(3, 203, "stage", "stage -> contained: no new GPU OOM for 60 s") | {"detail": None},
    ]
    read = attribute([TimelineEntryOut.model_validate(e) for e in entries])
    timeline = [t.model_dump(mode="json") for t in read]
    inc = _incident(stage="contained", timeline=timeline)
    said = "containment did it (step 3 enable_rate_limit applied)"
    reply = reply_message(inc, timeline[2:], "7-3")
    assert f"no new GPU OOM for 60 s; {said}" in "\n".join(_texts(reply.blocks))
    root = root_message(inc, incident_document(inc), Options())
    assert said in "\n".join(_texts(root.blocks))


def test_no_survivor_at_the_ceiling_means_no_risk_line() -> None:
    inc = _incident()
    inc["evidence"] = [e for e in inc["evidence"] if e["pod"] != "vllm-c"]
    assert at_risk(inc, Options()) == ""


def test_the_next_victim_forecast_names_the_survivor_at_risk() -> None:
    inc = _incident()
    forecast = _evidence(
        9, "next_victim", f"vllm-d{HOSTILE}", 40, "next victim at risk: pod vllm-d in ~25 s",
        eta_s=25.0,
    )  # fmt: skip
    inc["evidence"] = [*inc["evidence"], forecast]
    risk = at_risk(inc, Options())
    assert risk.startswith("`vllm-d") and risk.endswith(f" in ~25 s (forecast at {_at(40)[11:19]})")
    assert "<!channel>" not in risk  # the pod name is input text: escaped as any
    inc["victims"] = [*inc["victims"], {"pod": f"vllm-d{HOSTILE}", "position": 3,
                                        "first_oom_at": _at(50)}]  # fmt: skip
    assert at_risk(inc, Options()).startswith("`vllm-c`")  # it died: the ceiling names one


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("<!here>", "&lt;!here&gt;"),
        ("a & b", "a &amp; b"),
        ("line\nnext", "line\\nnext"),
        ("x" * 20, "x" * 9 + "…"),
    ],
)
def test_mrkdwn_text(value: str, expected: str) -> None:
    assert mrkdwn.text(value, 10 if len(value) == 20 else 500) == expected


def test_a_drill_is_labelled_and_pages_no_one() -> None:
    inc = _incident()
    msg = root_message(inc, incident_document(inc), Options(drill=True))
    assert msg.blocks[0]["text"]["text"].startswith("🧪 DRILL (replay) · 🔥 CASCADING")
    assert msg.text.startswith("🧪 DRILL")
    entries = [_entry(1, 29, "stage", "stage -> cascading: pod vllm-b died")]
    reply = reply_message(inc, entries, "7-1", mention="<!subteam^S0ONCALL>", drill=True)
    assert "S0ONCALL" not in json.dumps(reply.blocks) + reply.text and not reply.broadcast


def _approval_row(status: str, expires: datetime, **extra: Any) -> dict:
    return {
        "position": 1,
        "status": status,
        "policy": "approval",
        "approver_group": "sre-oncall",
        "decided_by": extra.get("decided_by"),
        "via": extra.get("via"),
        "decided_at": extra.get("decided_at"),
        "expires_at": expires.isoformat(),
        "reason": "",
        "plan_digest": "abc123",
    }


def test_a_step_decided_but_not_moved_yet_and_an_expired_one_say_so() -> None:
    now = datetime.now(UTC)
    approved = _approval_row("approved", now + timedelta(minutes=5), decided_by="slack:U42",
                             via="slack", decided_at=now.isoformat())  # fmt: skip
    inc = _incident(steps=[_step(1, "awaiting_approval", approved)], approvals=[approved])
    joined = "\n".join(_texts(_message(inc, now=now).blocks))
    assert "— approved, moves at the next step" in joined and "awaiting approval" not in joined
    expired = _approval_row("pending", now - timedelta(days=300))
    inc = _incident(steps=[_step(1, "awaiting_approval", expired)], approvals=[expired])
    joined = "\n".join(_texts(_message(inc, now=now).blocks))
    assert "⌛" in joined and "approval expired at " in joined and "awaiting approval" not in joined


def test_formatting_marks_from_input_are_defused_and_confirm_texts_fit() -> None:
    star, low, tilde, grave = "\u2217", "\uff3f", "\u223c", "\u02cb"  # the look-alikes
    assert mrkdwn.text("*bold* _it_ ~s~ `c` max_num_seqs") == (
        f"{star}bold{star} {low}it{low} {tilde}s{tilde} {grave}c{grave} max_num_seqs"
    )
    assert mrkdwn.code("a`b*c") == f"`a{grave}b*c`"
    assert len(mrkdwn.text("&" * 400, 300)) <= 300
    assert mrkdwn.text("&" * 400, 300).endswith("&amp;…")
    expires = datetime.now(UTC) + timedelta(minutes=10)
    pending = _approval_row("pending", expires)
    step = _step(1, "awaiting_approval", pending)
    step["result"]["reason"] = "&<>" * 200
    msg = _message(_incident(steps=[step], approvals=[pending]), now=datetime.now(UTC))
    [actions] = [b for b in msg.blocks if b["type"] == "actions"]
    for button in actions["elements"]:
        assert len(button["confirm"]["text"]["text"]) <= 300
