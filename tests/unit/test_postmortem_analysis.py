"""The postmortem's analysis on small hand-made frames, and its rendering's escaping."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd

from detector.postmortem import analysis
from detector.postmortem.render import md_fence, md_text, render

T0 = datetime(2025, 3, 14, 9, 0, 0, tzinfo=UTC)
TH = analysis.Thresholds(error_ratio=0.1, kv_cache_ceiling=0.95, window_s=60.0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(seconds: float) -> str:
    return at(seconds).isoformat().replace("+00:00", "Z")


def lb_series(buckets: list[tuple[float, int, int, int]]) -> list[dict[str, Any]]:
    """Rows of (bucket start s, requests, 5xx, 429)."""
    rows = []
    for t, req, err, shed in buckets:
        rows += [
            {"time": at(t), "metric": "requests", "label": "", "value": float(req), "detail": ""},
            {"time": at(t), "metric": "errors_5xx", "label": "", "value": float(err), "detail": ""},
            {"time": at(t), "metric": "shed_429", "label": "", "value": float(shed), "detail": ""},
        ]
    return rows


def pressure(pod: str, t: float, value: float) -> list[dict[str, Any]]:
    return [
        {"time": at(t), "metric": "pressure", "label": pod, "value": value, "detail": "KV cache"},
        {"time": at(t), "metric": "ceiling", "label": pod, "value": 0.95, "detail": "KV cache"},
    ]


def incident(step_mode: str | None = "live", applied_s: float = 120.0) -> dict[str, Any]:
    """An incident of two victims (OOM at 30 s and 60 s) with one step applied at 120 s."""
    evidence = [
        {"id": 1, "kind": "gpu_memory", "pod": "p1", "time": iso(25), "summary": "kv",
         "source": "logs:10", "attrs": {"requests_running": 41, "requests_waiting": 7,
                                        "kv_cache_usage": 0.98}},
        {"id": 2, "kind": "gpu_oom", "pod": "p1", "time": iso(30), "summary": "oom",
         "source": "logs:11", "attrs": {"bytes_tried": 2 * 2**30, "free_bytes": 2**30,
                                        "capacity_bytes": 80 * 2**30}},
        {"id": 3, "kind": "gpu_oom", "pod": "p2", "time": iso(60), "summary": "oom",
         "source": "logs:20", "attrs": {"bytes_tried": 2**30}},
        {"id": 4, "kind": "engine_config", "pod": "p1", "time": iso(0), "summary": "cfg",
         "source": "logs:1", "attrs": {"max_model_len": 4096, "kv_cache_tokens": 40960,
                                       "max_num_seqs": 256}},
    ]  # fmt: skip
    detail = {"event": "applied", "position": 1, "mode": step_mode}
    timeline = [
        {"id": 1, "time": iso(30), "kind": "stage", "message": "stage -> suspected: GPU OOM"},
        {"id": 2, "time": iso(30), "kind": "signal", "message": "victim #1: pod p1 died"},
        {"id": 3, "time": iso(60), "kind": "signal", "message": "victim #2: pod p2 died"},
        {"id": 4, "time": iso(61), "kind": "stage", "message": "stage -> cascading: spread"},
        {"id": 5, "time": iso(applied_s - 1), "kind": "step", "message": "approved",
         "detail": {"event": "approved", "position": 1}},
        {"id": 6, "time": iso(applied_s), "kind": "step", "message": "applied", "detail": detail},
        {"id": 7, "time": iso(300), "kind": "stage", "message": "stage -> contained: calm"},
    ]  # fmt: skip
    return {
        "id": 7,
        "key": "ns/w@1",
        "resolved_at": None,
        "victims": [
            {"pod": "p1", "position": 1, "first_oom_at": iso(30)},
            {"pod": "p2", "position": 2, "first_oom_at": iso(60)},
        ],
        "evidence": evidence,
        "timeline": timeline,
    }


def document(step_mode: str | None = "live") -> dict[str, Any]:
    step = {
        "position": 1, "action": "enable_rate_limit", "title": "Shed load", "state": "verified",
        "mode": step_mode, "diff": "+limit-rps: 1\n", "params": {"aggregate_limit_rpm": 60},
        "approval_state": {"status": "approved", "decided_by": "alice", "via": "web",
                           "decided_at": iso(119)},
        "verification": {"result": "passed"}, "reason": "",
    }  # fmt: skip
    return {
        "id": 7, "key": "ns/w@1", "pattern": "gpu_oom_cascade", "workload": "ns/w",
        "workload_kind": "Deployment", "stage": "contained", "opened_at": iso(30),
        "pods": ["p1", "p2"], "steps": [step], "questions": [],
    }  # fmt: skip


def build(lb: list[tuple[float, int, int, int]], step_mode: str | None = "live") -> dict[str, Any]:
    rows = lb_series(lb) + pressure("p2", 20, 0.5) + pressure("p2", 55, 0.97)
    frames = analysis.frames(incident(step_mode), pd.DataFrame(rows), 5.0)
    return analysis.analyse(incident(step_mode), document(step_mode), frames, TH)


def falling() -> list[tuple[float, int, int, int]]:
    """20 req per 5 s; 20 5xx per 5 s until the step at 120 s, then 3 per 5 s."""
    return [(t, 20, 20 if t < 120 else 3, 0) for t in range(0, 240, 5)]


def test_a_step_after_which_the_5xx_rate_falls_is_said_to_have_cut_it() -> None:
    (step,) = build(falling())["steps"]
    m = step["measured"]
    assert (m["rate_5xx_before_per_s"], m["rate_5xx_after_per_s"]) == (4.0, 0.6)
    assert step["effect"].startswith(
        "after step 1 (enable_rate_limit) at 09:02:00 requests not served fell from 4.0/s to"
        " 0.6/s within 5 s (5xx 4.0/s + shed 0.0/s (100% of requests) before, 5xx 0.6/s + shed"
        " 0.0/s (15% of requests) after;"
    )
    assert step["approval"] == {"status": "approved", "by": "alice", "via": "web", "at": iso(119)}


def test_the_window_excludes_the_bucket_the_step_lands_in() -> None:
    before, after = analysis.windows(pd.Timestamp(at(122)), 60.0, 5.0)
    assert (before, after) == (pd.Timestamp(at(60)), pd.Timestamp(at(125)))
    before, after = analysis.windows(pd.Timestamp(at(120)), 60.0, 5.0)
    assert (before, after) == (pd.Timestamp(at(60)), pd.Timestamp(at(120)))


def test_a_flat_5xx_rate_is_no_change_and_says_whether_an_oom_followed() -> None:
    (step,) = build([(t, 20, 10, 0) for t in range(0, 240, 5)])["steps"]
    assert step["effect"].startswith("no change in the requests not served: after step 1")
    assert "2.0/s to 2.0/s" in step["effect"]
    assert "; no GPU OOM followed within 60 s (5xx 2.0/s + shed 0.0/s" in step["effect"]
    assert "; GPU OOMs 1 before, 0 after" in step["effect"]


def test_a_step_that_turns_5xx_into_429_is_no_win() -> None:
    """A shed request failed for its sender: 5xx falling while 429 rises is no change."""
    swap = [(t, 20, 20 if t < 120 else 2, 0 if t < 120 else 18) for t in range(0, 240, 5)]
    (step,) = build(swap)["steps"]
    m = step["measured"]
    assert (m["rate_5xx_before_per_s"], m["rate_5xx_after_per_s"]) == (4.0, 0.4)
    assert (m["rate_unserved_before_per_s"], m["rate_unserved_after_per_s"]) == (4.0, 4.0)
    assert (m["unserved_share_before"], m["unserved_share_after"]) == (1.0, 1.0)
    assert step["effect"].startswith("no change in the requests not served: after step 1")


def test_a_dry_run_step_says_it_changed_nothing_even_when_the_rate_fell() -> None:
    (step,) = build(falling(), step_mode="dry_run")["steps"]
    assert step["effect"].startswith("dry-run: step 1 (enable_rate_limit) changed nothing")
    assert "fell from 4.0/s to 0.6/s" in step["effect"]  # what happened, not its effect


def test_a_step_never_applied_has_no_measurement() -> None:
    inc = incident()
    inc["timeline"] = [t for t in inc["timeline"] if (t.get("detail") or {}).get("event") !=
                       "applied"]  # fmt: skip
    frames = analysis.frames(inc, pd.DataFrame(lb_series(falling())), 5.0)
    (step,) = analysis.steps(frames, document() | {"steps": [document()["steps"][0] |
                             {"state": "withdrawn", "reason": "nothing to do"}]}, TH)  # fmt: skip
    assert step["measured"] is None and step["effect"] == "never applied: nothing to do"


def test_a_withdrawn_step_shows_no_verification() -> None:
    """A withdrawn dry-run step read "verification: passed"."""
    frames = analysis.frames(incident(), pd.DataFrame(lb_series(falling())), 5.0)
    withdrawn = document()["steps"][0] | {
        "state": "withdrawn",
        "verification": {"result": "passed"},
    }
    (step,) = analysis.steps(frames, document() | {"steps": [withdrawn]}, TH)
    assert step["verification"] is None


def test_a_policy_approval_is_no_human_decision() -> None:
    """The first approval shown was the automatic policy's, not a person's."""
    inc = incident()
    for t in inc["timeline"]:
        if (t.get("detail") or {}).get("event") == "approved":
            t["detail"] = t["detail"] | {"actor": "policy:auto"}
    frames = analysis.frames(inc, pd.DataFrame(lb_series(falling())), 5.0)
    found = {d["milestone"]: d for d in analysis.detection(frames)}
    assert found["first human decision"]["time"] is None
    assert "policy approvals are not decisions" in found["first human decision"]["note"]


def test_an_incident_without_steps_has_no_decision_and_no_action() -> None:
    """With no step on the timeline (containment off), the export crashed on ``.str``."""
    inc = incident()
    inc["timeline"] = [t for t in inc["timeline"] if t.get("kind") != "step"]
    frames = analysis.frames(inc, pd.DataFrame(lb_series(falling())), 5.0)
    found = {d["milestone"]: d for d in analysis.detection(frames)}
    assert found["first action"]["time"] is None
    assert found["first human decision"]["time"] is None


def test_impact_counts_degraded_down_failed_shed_and_the_peak() -> None:
    lb = [(0, 10, 0, 0), (5, 10, 1, 0), (10, 10, 5, 0), (15, 8, 8, 0), (20, 6, 4, 2),
          (25, 0, 0, 0), (35, 10, 0, 0)]  # fmt: skip
    frames = analysis.frames(incident(), pd.DataFrame(lb_series(lb)), 5.0)
    imp = analysis.impact(frames, TH)
    assert imp["failed_5xx"] == 18 and imp["shed_429"] == 2 and imp["requests"] == 54
    # 10 %: not above the threshold; 50 %, 100 %, 67 %: degraded
    assert imp["degraded_s"] == 15.0 and imp["degraded_from"] == iso(10)
    assert imp["down_s"] == 10.0 and imp["down_from"] == iso(15)  # 8/8 5xx; 4 5xx + 2 429
    assert imp["peak_5xx_rate_per_s"] == 1.6 and imp["peak_at"] == iso(15)
    assert imp["span"] == {"start": iso(0), "end": iso(40)}  # the missing bucket 30 s is 0
    assert imp["pods_lost"] == 2 and imp["time_to_recover_s"] == 270.0


def test_the_summary_names_the_shed_requests_as_the_gateways_429_and_413() -> None:
    # the series' shed_429 counts the rate limit's 429 and the admission rule's 413 together
    summary = build([(t, 20, 2, 3) for t in range(0, 240, 5)])["summary"]
    assert "96 requests failed with 5xx and 144 were shed at the gateway (429/413)." in summary
    assert "shed with 429" not in summary


def test_detection_delays_from_the_first_oom() -> None:
    found = {d["milestone"]: d for d in build(falling())["detection"]}
    assert found["suspected"]["delay_s"] == 0.0
    assert found["cascading"]["delay_s"] == 31.0
    assert found["first human decision"]["delay_s"] == 89.0
    assert found["first action"]["delay_s"] == 90.0
    assert found["first notification"]["note"] == (
        "nothing was queued for Slack (notifications were off)"
    )


def test_the_causal_chain_names_figures_and_sources() -> None:
    chain = build(falling())["causal_chain"]
    assert [c["link"] for c in chain] == [
        "first OOM", "batch before", "traffic shift", "pressure on a survivor", "death #2"
    ]  # fmt: skip
    assert "tried to allocate 2.00 GiB; 1.00 GiB free of 80.00 GiB" in chain[0]["text"]
    assert chain[0]["source"] == "logs:11"
    assert "running 41 requests with 7 waiting" in chain[1]["text"]
    assert "max_model_len 4,096" in chain[1]["text"]
    assert "50% → 97%" in chain[3]["text"]
    assert "30 s after the previous death" in chain[4]["text"]


def test_action_items_carry_this_incidents_numbers_and_an_owner() -> None:
    items = build(falling())["action_items"]
    titles = [i["title"] for i in items]
    assert "Lower the batch ceiling of ns/w to 10 sequences" in titles  # 40,960 / 4,096
    assert any("4,096 per request" in t for t in titles)
    assert {i["owner"] for i in items} == {"TBD"}


def test_the_429_limit_is_sized_from_the_measured_requests_not_the_survivors_budget() -> None:
    """Issue 24: the item said the runbook's 49/min (the capacity left to the survivors)
    where the endpoint served far more; it is the most served in a healthy minute."""
    healthy = [(t, 10, 0, 0) for t in range(0, 60, 5)]  # 120/min served, no 5xx
    degraded = [(t, 40, 20, 0) for t in range(60, 120, 5)]  # 50% 5xx: 240/min served, unhealthy
    after = [(t, 15, 1, 0) for t in range(120, 180, 5)]  # 6.7% 5xx: 168/min served, healthy
    frames = analysis.frames(incident(), pd.DataFrame(lb_series(healthy + degraded + after)), 5.0)
    doc = document()
    doc["steps"][0]["params"] = {"aggregate_limit_rpm": 49, "aggregate_connections": 26}
    (item,) = [i for i in analysis.action_items(frames, doc, TH, {}) if "429" in i["title"]]
    assert item["title"] == "Keep a 429 limit ready at the gateway: 168/min for ns/w"
    assert item["sizing"] == {
        "limit_per_min": 168, "window_s": 60.0, "window_from": iso(120), "share_5xx": 0.067,
        "peak_per_min": 480, "peak_from": iso(60), "shed_share_at_peak": 0.65,
    }  # fmt: skip
    assert "(49/min and 26 connections in this one)" in item["detail"]
    assert item["source"] == "series: requests, 5xx and 429 at the load balancer"


def test_no_429_limit_is_advised_without_a_healthy_minute_of_traffic() -> None:
    """No load-balancer series, or one degraded throughout: nothing measured to size it by."""
    doc = document()
    keep = "Keep a 429 limit ready at the gateway"
    for rows in ([], lb_series(falling())):  # falling(): 15% or more 5xx in every minute
        frames = analysis.frames(incident(), pd.DataFrame(rows + pressure("p2", 20, 0.5)), 5.0)
        items = analysis.analyse(incident(), doc, frames, TH)["action_items"]
        assert not any(i["title"].startswith(keep) for i in items)


def test_a_survivors_pressure_cites_the_lines_that_show_it() -> None:
    """Issue 24: "80% -> 100% at 09:04:35" cited a 09:03:49 line that read 91.0%."""
    inc = incident()
    inc["evidence"] += [
        {"id": 9, "kind": "gpu_memory", "pod": "p2", "time": iso(40), "summary": "queue",
         "source": "logs:15", "attrs": {"kv_cache_usage": 0.91, "ratio": 1.11}},
        {"id": 10, "kind": "gpu_memory", "pod": "p2", "time": iso(55), "summary": "kv",
         "source": "logs:18", "attrs": {"kv_cache_usage": 0.989, "ratio": 0.989}},
        {"id": 11, "kind": "gpu_memory", "pod": "p2", "time": iso(58), "summary": "kv",
         "source": "logs:19", "attrs": {"kv_cache_usage": 0.95, "ratio": 0.95}},
    ]  # fmt: skip
    rows = lb_series(falling()) + pressure("p2", 20, 0.5) + pressure("p2", 55, 0.999)
    frames = analysis.frames(inc, pd.DataFrame(rows), 5.0)
    (link,) = [c for c in analysis.causal_chain(frames, TH) if c["link"].startswith("pressure")]
    assert link["text"] == "pod p2 KV cache 91% at 09:00:40 → 99% at 09:00:55 before it died"
    assert (link["time"], link["source"], link["sources"]) == (iso(55), "logs:18",
                                                                ["logs:18", "logs:15"])  # fmt: skip


def test_the_batch_before_cites_the_start_up_line_of_each_setting() -> None:
    chain = build(falling())["causal_chain"]
    (batch,) = [c for c in chain if c["link"] == "batch before"]
    assert batch["sources"] == ["logs:10", "logs:1"]  # the pressure line, then the settings'
    (shift,) = [c for c in chain if c["link"] == "traffic shift"]
    assert shift["sources"] == [
        "series: requests at the load balancer, 08:59:30-09:00:30 and 09:00:30-09:01:30"
    ]


def test_a_question_says_what_its_cited_line_shows() -> None:
    doc = document() | {"questions": [
        {"question": "q?", "answer": "41 running; max_model_len 4,096", "evidence": "logs:10"},
        {"question": "r?", "answer": None, "evidence": None},
    ]}  # fmt: skip
    frames = analysis.frames(incident(), pd.DataFrame(lb_series(falling())), 5.0)
    asked = analysis.analyse(incident(), doc, frames, TH)["questions"]
    assert [q["evidence_shows"] for q in asked] == [
        "pod p1 at 09:00:25: 41 requests running, 7 waiting, KV cache 98.0% used",
        None,
    ]


def test_markdown_escapes_input_that_would_break_a_table_or_open_markup() -> None:
    evil = "a|b <script>x</script> `code` [l](javascript:1) \x1b[31m\nnext"
    out = md_text(evil)
    assert "\n" not in out and "\x1b" not in out and "<" not in out
    assert out.count("|") == out.count("\\|") and "\\`code\\`" in out and "\\[l\\]" in out
    assert md_fence("x ``` y").startswith("````\n")


def test_rendered_documents_escape_input_and_are_deterministic() -> None:
    content = build(falling())
    content["timeline"][0]["message"] = "<img src=x onerror=alert(1)> | `x`"
    md = render(content, "md")
    row = next(line for line in md.splitlines() if "onerror" in line)
    assert row.count("|") - row.count("\\|") == 4  # three cells: the input added none
    assert "<img" not in md
    html = render(content, "html")
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    doc = json.loads(render(content, "json", plots=[{"title": "t"}]))
    assert {"summary", "impact", "detection", "causal_chain", "steps", "questions",
            "action_items", "timeline", "plots"} <= set(doc)  # fmt: skip
    assert render(content, "md") == md and render(content, "html") == html


def test_a_survivors_climb_from_its_series_keeps_to_one_measure() -> None:
    """A pod's GPU memory rows (before its first KV reading) are another quantity: its KV
    cache climb never starts from, or peaks at, a framebuffer reading."""
    gpu = [
        {"time": at(t), "metric": "pressure", "label": "p2", "value": v, "detail": "GPU memory"}
        for t, v in ((20, 0.9), (45, 0.99))
    ]
    rows = lb_series(falling()) + gpu + pressure("p2", 25, 0.5) + pressure("p2", 55, 0.97)
    frames = analysis.frames(incident(), pd.DataFrame(rows), 5.0)
    (link,) = [c for c in analysis.causal_chain(frames, TH) if c["link"].startswith("pressure")]
    assert link["text"].startswith("pod p2 KV cache 50% → 97% (the 5 s bucket from 09:00:55)")
    assert link["sources"] == ["series: pressure of p2"]
