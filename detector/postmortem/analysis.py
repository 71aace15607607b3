"""The postmortem's analysis: pure functions over pandas frames built from the read model.

``frames(incident, series)`` turns an ``IncidentOut`` JSON dump and its series rows
(``detector.report.series.load_series``) into frames; ``analyse`` returns the postmortem's
content as plain JSON values (no clock, stable order, rounded floats), which ``render`` writes
as Markdown, HTML or JSON. Definitions (the load balancer's 5 s buckets, ``bucket_s``):

- **degraded**: a bucket whose 5xx share of requests is above the correlator's
  ``error_ratio`` (``settings.correlate``); **down**: a bucket with requests of which none was
  served (every response a 5xx or a 429). Times are whole buckets.
- **failed** / **shed**: the sums of the 5xx and the gateway's refusals (429, and 413 from the
  admission rule) over the incident's series (its span: the correlation window before the
  first OOM, to its end); **peak 5xx rate**: the
  highest bucket's 5xx count / ``bucket_s``.
- **time to recover**: first GPU OOM -> the first ``contained`` (else ``resolved``) stage.
- **measured effect** of a step: the requests not served (5xx + 429: a request the gateway
  shed failed for the person who sent it, so a step that turns 5xx into 429 is no win), its 5xx
  and 429 parts, the GPU OOMs and the highest pressure in the ``window_s`` before its apply
  time (buckets that end by then) and after it (buckets that start from then); the rate of
  requests not served fell or rose when it changed by half or more and by at least one
  response per bucket, else "no change in the requests not served", with whether a GPU OOM
  followed (a step taken before the errors spread, such as a predictive gateway limit, shows
  there).
- **sources** of a causal-chain link: the lines whose figures its text states, the first the
  line of its own pod and time, or the series an aggregate was computed from (``series: ...``);
  a question says what its one cited line shows (``citations``). What the detector forecast
  and when Slack heard of it are checked against what happened in ``checks``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from detector.correlate.series import CEILING, ERRORS_5XX, KV_CACHE, PRESSURE, REQUESTS, SHED_429
from detector.postmortem import checks, citations
from detector.postmortem.fmt import duration, hms, iso, num
from detector.report.recovery import CONTAINED_HEAD

LB_METRICS = (REQUESTS, ERRORS_5XX, SHED_429)
EFFECT_WINDOW_S = 60.0  # seconds before and after a step's apply that its effect compares
KEY_STEP_EVENTS = frozenset(
    {"auto_approved", "approved", "denied", "expired", "applied", "restarted", "verified",
     "escalated", "rolled_back", "lifted", "removed", "withdrawn", "approval_requested"}
)  # fmt: skip
APPROVALS = ("auto_approved", "approved")
DECISIONS = ("approved", "denied")  # a person's decision on a step (``auto_approved``: policy)
UNVERIFIED = frozenset({"withdrawn", "not_needed", "denied", "expired"})  # ended without a check


@dataclass(frozen=True)
class Frames:
    """An incident as frames; times are UTC ``Timestamp``s, rows in time order.

    ``lb``: index bucket start, columns requests, errors_5xx, shed_429 (responses per bucket,
    zero where the span has no line); ``pressure``: time, pod, value, ceiling, detail;
    ``evidence``: id, kind, pod, time, summary, source, attrs; ``timeline``: id, time, kind,
    message, detail; ``victims``: position, pod, first_oom_at.
    """

    lb: pd.DataFrame
    pressure: pd.DataFrame
    evidence: pd.DataFrame
    timeline: pd.DataFrame
    victims: pd.DataFrame
    bucket_s: float


@dataclass(frozen=True)
class Thresholds:
    """The figures the analysis judges by: the correlator's, and the effect window."""

    error_ratio: float = 0.1
    kv_cache_ceiling: float = 0.95
    window_s: float = EFFECT_WINDOW_S


def _times(values: Sequence[Any]) -> pd.Series:
    return pd.to_datetime(pd.Series(list(values), dtype=object), utc=True, format="ISO8601")


def _frame(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    df = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=list(columns))
    for col in ("time", "first_oom_at"):
        if col in df.columns:
            df[col] = _times(df[col]) if len(df) else pd.Series([], dtype="datetime64[us, UTC]")
    return df


def frames(incident: Mapping[str, Any], series: pd.DataFrame, bucket_s: float) -> Frames:
    """Build the frames of ``incident`` (an ``IncidentOut`` JSON dump) and its ``series``.

    ``series`` has the columns of ``SeriesOut``: time (UTC), metric, label, value, detail.
    """
    s = series.copy()
    s["time"] = pd.to_datetime(s["time"], utc=True) if len(s) else s.get("time")
    lb_rows = s[s["metric"].isin(LB_METRICS)] if len(s) else s
    if len(lb_rows):
        lb = lb_rows.pivot_table(index="time", columns="metric", values="value", aggfunc="sum")
        step = pd.Timedelta(seconds=bucket_s)
        lb = lb.reindex(pd.date_range(lb.index.min(), lb.index.max(), freq=step), fill_value=0)
    else:
        lb = pd.DataFrame(index=pd.DatetimeIndex([], tz="UTC"))
    lb = lb.reindex(columns=list(LB_METRICS), fill_value=0.0).fillna(0.0)
    pressure = pd.DataFrame(columns=["time", "pod", "value", "ceiling", "detail"])
    if len(s):
        p = s[s["metric"] == PRESSURE][["time", "label", "value", "detail"]]
        c = s[s["metric"] == CEILING][["time", "label", "value", "detail"]]
        merged = p.merge(c, on=["time", "label", "detail"], how="left", suffixes=("", "_c"))
        pressure = merged.rename(columns={"label": "pod", "value_c": "ceiling"})[
            ["time", "pod", "value", "ceiling", "detail"]
        ].sort_values(["time", "pod"], kind="stable", ignore_index=True)
    ev_cols = ("id", "kind", "pod", "time", "summary", "source", "attrs")
    evidence = _frame(incident.get("evidence", []), ev_cols)
    evidence = evidence.sort_values(["time", "id"], kind="stable", ignore_index=True)
    timeline = _frame(incident.get("timeline", []), ("id", "time", "kind", "message", "detail"))
    timeline = timeline.sort_values(["time", "id"], kind="stable", ignore_index=True)
    victims = _frame(incident.get("victims", []), ("position", "pod", "first_oom_at"))
    victims = victims.sort_values("position", kind="stable", ignore_index=True)
    return Frames(lb, pressure, evidence, timeline, victims, bucket_s)


# --- formatting helpers: ``fmt``'s (iso, hms, num, duration), and seconds between two times --


def _secs(a: pd.Timestamp, b: pd.Timestamp) -> float:
    return num((b - a).total_seconds(), 3)


# --- sections ------------------------------------------------------------------------------


def first_oom(f: Frames) -> pd.Timestamp | None:
    """Return the first victim's first GPU OOM time, None without victims."""
    return f.victims["first_oom_at"].iloc[0] if len(f.victims) else None


def stage_times(f: Frames) -> dict[str, pd.Timestamp]:
    """Return the time each stage was first entered (from the ``stage`` timeline entries)."""
    out: dict[str, pd.Timestamp] = {}
    for row in f.timeline[f.timeline["kind"] == "stage"].itertuples():
        head = str(row.message).split(":", 1)[0]
        stage = head.rsplit("->", 1)[-1].strip()
        out.setdefault(stage, row.time)
    return out


def _step_entries(f: Frames) -> pd.DataFrame:
    t = f.timeline[f.timeline["kind"] == "step"].copy()
    t["event"] = [(d or {}).get("event") for d in t["detail"]]
    t["position"] = [(d or {}).get("position") for d in t["detail"]]
    # a str column even with no step (an empty list would make it float: no .str accessor)
    t["actor"] = pd.Series(
        [str((d or {}).get("actor") or "") for d in t["detail"]], index=t.index, dtype=object
    )
    return t[t["event"].notna()]


def impact(f: Frames, th: Thresholds, resolved_at: pd.Timestamp | None = None) -> dict[str, Any]:
    """Return the impact: degraded and down time, failed and shed requests, peak, recovery."""
    lb, b = f.lb, f.bucket_s
    share = (lb[ERRORS_5XX] / lb[REQUESTS]).where(lb[REQUESTS] > 0, 0.0)
    degraded = share > th.error_ratio
    down = (lb[REQUESTS] > 0) & (lb[REQUESTS] - lb[ERRORS_5XX] - lb[SHED_429] <= 0)
    peak_at = lb[ERRORS_5XX].idxmax() if len(lb) and lb[ERRORS_5XX].max() > 0 else None
    start = first_oom(f)
    stages = stage_times(f)
    recovered_stage = "contained" if "contained" in stages else "resolved"
    recovered = stages.get("contained", stages.get("resolved", resolved_at))
    # who contained it: the read model's attribution on the first contained stage entry
    # (detector.report.recovery), None when there is none
    t = f.timeline
    firsts = t[(t["kind"] == "stage") & t["message"].astype(str).str.startswith(CONTAINED_HEAD)]
    found = firsts["detail"].iloc[0] if len(firsts) else None
    recovery = found if isinstance(found, dict) else {}
    return {
        "span": {
            "start": iso(lb.index.min()) if len(lb) else None,
            "end": iso(lb.index.max() + pd.Timedelta(seconds=b)) if len(lb) else None,
        },
        "requests": int(lb[REQUESTS].sum()),
        "failed_5xx": int(lb[ERRORS_5XX].sum()),
        "shed_429": int(lb[SHED_429].sum()),
        "degraded_s": num(int(degraded.sum()) * b, 1),
        "degraded_from": iso(degraded[degraded].index.min()) if degraded.any() else None,
        "down_s": num(int(down.sum()) * b, 1),
        "down_from": iso(down[down].index.min()) if down.any() else None,
        "peak_5xx_rate_per_s": num(lb[ERRORS_5XX].max() / b if len(lb) else 0.0),
        "peak_at": iso(peak_at),
        "pods_lost": len(f.victims),
        "recovered_at": iso(recovered),
        "recovered_stage": recovered_stage if recovered is not None else None,
        "recovered_by": recovery.get("recovered_by"),
        "recovery": recovery.get("attribution"),
        "time_to_recover_s": _secs(start, recovered) if start is not None and recovered else None,
        "error_ratio_threshold": th.error_ratio,
        "bucket_s": b,
    }


def detection(f: Frames, delivery: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Return first OOM -> suspected -> cascading -> notification -> action -> a person's
    decision (an approval or a denial by someone, never a policy's automatic approval).

    Each milestone has its time (None when it did not happen or is not in the timeline),
    ``delay_s`` from the first OOM and ``since_previous_s`` from the milestone before it. The
    first notification is the outbox's first delivered message (``delivery``: the read model's
    ``DeliveryOut`` as JSON, None when nothing was queued; ``checks.first_notification``).
    """
    stages, steps = stage_times(f), _step_entries(f)
    actions = steps[steps["event"].isin(("applied", "restarted"))]
    decided = steps[steps["event"].isin(DECISIONS) & ~steps["actor"].str.startswith("policy:")]
    notified, unsent = checks.first_notification(delivery)
    found: list[tuple[str, pd.Timestamp | None, str]] = [
        ("first GPU OOM", first_oom(f), "the first victim's OOM"),
        ("suspected", stages.get("suspected"), "stage entry"),
        ("cascading", stages.get("cascading"), "stage entry"),
        ("first notification", notified, unsent),
        ("first action", actions["time"].iloc[0] if len(actions) else None, "step applied"),
        (
            "first human decision",
            decided["time"].iloc[0] if len(decided) else None,
            "no person approved or denied a step (policy approvals are not decisions)",
        ),
    ]
    start, prev, out = found[0][1], None, []
    for name, when, note in found:
        out.append(
            {
                "milestone": name,
                "time": iso(when),
                "delay_s": _secs(start, when) if start is not None and when is not None else None,
                "since_previous_s": _secs(prev, when) if prev is not None and when is not None
                else None,
                "note": note if when is None or name == "first GPU OOM" else "",
            }
        )  # fmt: skip
        prev = when if when is not None else prev
    return out


def _rate(lb: pd.DataFrame, col: str, start: pd.Timestamp, end: pd.Timestamp, b: float) -> float:
    """Return ``col`` per second over the buckets starting in [start, end)."""
    rows = lb[(lb.index >= start) & (lb.index < end)]
    return float(rows[col].sum()) / (len(rows) * b) if len(rows) else 0.0


def windows(at: pd.Timestamp, w: float, b: float) -> tuple[pd.Timestamp, pd.Timestamp]:
    """Return the start of the before-window and of the after-window of ``at`` (each ``w`` s).

    Before: the buckets that end by ``at``'s bucket; after: those that start at or after
    ``at`` (the bucket holding ``at``, when it starts before ``at``, is in neither).
    """
    step = pd.Timedelta(seconds=b)
    return at.floor(step) - pd.Timedelta(seconds=w), at.ceil(step)


def _ooms(f: Frames) -> pd.Series:
    return f.evidence[f.evidence["kind"] == "gpu_oom"]["time"]


def measure(f: Frames, at: pd.Timestamp, th: Thresholds) -> dict[str, Any]:
    """Return the rates of requests not served (5xx, 429), GPU OOMs and highest pressure in
    the window before/after ``at``; rates per second, shares of the window's requests."""
    w, b = th.window_s, f.bucket_s
    before_start, after_start = windows(at, w, b)
    before_end = before_start + pd.Timedelta(seconds=w)
    after_end = after_start + pd.Timedelta(seconds=w)
    ooms = _ooms(f)
    p = f.pressure
    pb = p[(p["time"] >= before_start) & (p["time"] < before_end)]["value"]
    pa = p[(p["time"] >= after_start) & (p["time"] < after_end)]["value"]
    rates: dict[str, float | None] = {}
    for when, start in (("before", before_start), ("after", after_start)):
        end = start + pd.Timedelta(seconds=w)
        errors, shed = (_rate(f.lb, col, start, end, b) for col in (ERRORS_5XX, SHED_429))
        requests = _rate(f.lb, REQUESTS, start, end, b)
        rates[f"rate_5xx_{when}_per_s"] = num(errors)
        rates[f"rate_429_{when}_per_s"] = num(shed)
        rates[f"rate_unserved_{when}_per_s"] = num(errors + shed)
        rates[f"unserved_share_{when}"] = num((errors + shed) / requests, 3) if requests else None
    return {
        "window_s": w,
        **rates,
        "ooms_before": int(((ooms >= at - pd.Timedelta(seconds=w)) & (ooms < at)).sum()),
        "ooms_after": int(((ooms > at) & (ooms <= at + pd.Timedelta(seconds=w))).sum()),
        "max_pressure_before": num(pb.max(), 3) if len(pb) else None,
        "max_pressure_after": num(pa.max(), 3) if len(pa) else None,
        "settled_s": _settled(f, after_start, after_end, at),
    }


def _settled(f: Frames, start: pd.Timestamp, end: pd.Timestamp, at: pd.Timestamp) -> float:
    """Return seconds from ``at`` to the end of the bucket from which the count not served
    (5xx + 429) stays at or below the after-window's mean (the window's length when it never
    does)."""
    window = f.lb[(f.lb.index >= start) & (f.lb.index < end)]
    rows = window[ERRORS_5XX] + window[SHED_429]
    if not len(rows):
        return num((end - at).total_seconds(), 1)
    above = rows > rows.mean()
    last = above[above].index.max() if above.any() else rows.index.min()
    return num((last + pd.Timedelta(seconds=f.bucket_s) - at).total_seconds(), 1)


def effect_sentence(name: str, at: pd.Timestamp, m: Mapping[str, Any], dry_run: bool) -> str:
    """Say plainly what changed around ``at`` (the rule is in the module docstring)."""
    a, z, w = m["rate_unserved_before_per_s"], m["rate_unserved_after_per_s"], m["window_s"]
    floor = 1.0 / 5.0  # one response per 5 s bucket
    when = hms(at)
    parts = f"{_parts(m, 'before')} before, {_parts(m, 'after')} after"
    if z <= a / 2 and a - z >= floor:
        trend = (
            f"requests not served fell from {a:.1f}/s to {z:.1f}/s within {m['settled_s']:.0f} s"
        )
    elif z >= a * 1.5 and z - a >= floor:
        trend = f"requests not served rose from {a:.1f}/s to {z:.1f}/s"
    else:
        trend = ""
    ooms = f"{parts}; GPU OOMs {m['ooms_before']} before, {m['ooms_after']} after (±{w:.0f} s)"
    if dry_run:
        seen = trend or f"requests not served went from {a:.1f}/s to {z:.1f}/s"
        return (
            f"dry-run: {name} changed nothing at {when}, so what followed is not its effect "
            f"({seen}; {ooms})"
        )
    if not trend:
        went = f"requests not served went from {a:.1f}/s to {z:.1f}/s"
        calm = f"; no GPU OOM followed within {w:.0f} s" if m["ooms_after"] == 0 else ""
        return f"no change in the requests not served: after {name} at {when} {went}{calm} ({ooms})"
    return f"after {name} at {when} {trend} ({ooms})"


def _parts(m: Mapping[str, Any], when: str) -> str:
    """Return ``5xx A/s + shed B/s (C% of requests)`` of one window (shed: the gateway's 429
    and 413, the series' ``shed_429``)."""
    share = m[f"unserved_share_{when}"]
    of = f" ({share * 100:.0f}% of requests)" if share is not None else ""
    return f"5xx {m[f'rate_5xx_{when}_per_s']:.1f}/s + shed {m[f'rate_429_{when}_per_s']:.1f}/s{of}"


GIB = 2**30


def _evidence(f: Frames, kind: str, pod: str | None = None) -> pd.DataFrame:
    ev = f.evidence[f.evidence["kind"] == kind]
    return ev[ev["pod"] == pod] if pod is not None else ev


def _attr(row: Any, key: str) -> Any:
    return (row.attrs or {}).get(key)


def _config_row(f: Frames, key: str, pod: str | None = None) -> Any:
    """Return the latest engine_config evidence row that gives ``key`` (of ``pod``), else None."""
    rows = [r for r in _evidence(f, "engine_config", pod).itertuples() if _attr(r, key) is not None]
    return rows[-1] if rows else None


def _latest_config(f: Frames, key: str, pod: str | None = None) -> Any:
    """Return the latest engine_config evidence value of ``key`` (of ``pod``), else None."""
    row = _config_row(f, key, pod)
    return _attr(row, key) if row is not None else None


_DEVICE_KEYS = ("accelerator", "sharing_layer")  # what the OOM line says of the device


def _oom_text(row: Any) -> str:
    a = row.attrs or {}
    figures = []
    if a.get("bytes_tried") is not None:
        figures.append(f"tried to allocate {a['bytes_tried'] / GIB:.2f} GiB")
    if a.get("free_bytes") is not None:
        free = f"{a['free_bytes'] / GIB:.2f} GiB free"
        if a.get("capacity_bytes") is not None:
            free += f" of {a['capacity_bytes'] / GIB:.2f} GiB"
        figures.append(free)
    said = "; ".join(figures) if figures else "no allocation figures in the line"
    where = "".join(f", {k.replace('_', ' ')} {a[k]}" for k in _DEVICE_KEYS if a.get(k))
    return f"pod {row.pod} died of GPU OOM at {hms(row.time)}: {said}{where}"


def _link(
    kind: str, when: pd.Timestamp | None, text: str, sources: Sequence[Any]
) -> dict[str, Any]:
    """Return a link of the chain citing ``sources``: the lines that show its figures, the
    first the line of its own moment (its pod and time), or the series it was computed from
    (``series: ...``: no line shows an aggregate); ``source`` is the first."""
    cited = list(dict.fromkeys(str(s) for s in sources if s))
    return {"link": kind, "time": iso(when), "text": text, "source": cited[0] if cited else None,
            "sources": cited}  # fmt: skip


def causal_chain(f: Frames, th: Thresholds) -> list[dict[str, Any]]:
    """Return the chain: first OOM, the batch before it, the traffic shift, pressure, deaths."""
    if not len(f.victims):
        return []
    ooms = _evidence(f, "gpu_oom")
    first = f.victims.iloc[0]
    t0 = first["first_oom_at"]
    out: list[dict[str, Any]] = []
    own = ooms[ooms["pod"] == first["pod"]]
    if len(own):
        row = next(own.itertuples())
        out.append(_link("first OOM", row.time, _oom_text(row), [row.source]))
    out += _batch_before(f, first["pod"], t0)
    out.append(_traffic_shift(f, t0, th))
    climbs = _pressure_climb(f, t0, th)  # by pod: its pressure link goes before its death
    prev = t0
    for v in f.victims.iloc[1:].itertuples():
        out += climbs.pop(v.pod, [])
        own = ooms[ooms["pod"] == v.pod]
        src = own["source"].iloc[0] if len(own) else None
        text = _oom_text(next(own.itertuples())) if len(own) else f"pod {v.pod} died of GPU OOM"
        gap = (v.first_oom_at - prev).total_seconds()
        out.append(_link(f"death #{v.position}", v.first_oom_at, f"{text} ({gap:.0f} s after "
                         "the previous death)", [src]))  # fmt: skip
        prev = v.first_oom_at
    for pod in sorted(climbs):
        out += climbs[pod]
    return out


def _batch_before(f: Frames, pod: str, t0: pd.Timestamp) -> list[dict[str, Any]]:
    rows = _evidence(f, "gpu_memory", pod)
    rows = rows[(rows["time"] <= t0)]
    rows = rows[[_attr(r, "requests_running") is not None for r in rows.itertuples()]]
    if not len(rows):
        return []
    row = list(rows.itertuples())[-1]
    a = row.attrs
    kv = a.get("kv_cache_usage")
    text = (
        f"just before, at {hms(row.time)}, pod {pod} was running {a['requests_running']} "
        f"requests with {a.get('requests_waiting', 0)} waiting"
        + (f", KV cache {kv:.0%} used" if isinstance(kv, int | float) else "")
    )
    max_len = _config_row(f, "max_model_len", pod)
    seqs = _config_row(f, "max_num_seqs", pod)
    if max_len is not None:
        text += f"; sequences up to max_model_len {max_len.attrs['max_model_len']:,} tokens"
    if seqs is not None:
        text += f", batch ceiling max_num_seqs {seqs.attrs['max_num_seqs']}"
    cited = [row.source] + [c.source for c in (max_len, seqs) if c is not None]
    return [_link("batch before", row.time, text, cited)]


def _pods(f: Frames) -> list[str]:
    return sorted(set(f.victims["pod"]) | set(f.pressure["pod"]))


def _traffic_shift(f: Frames, t0: pd.Timestamp, th: Thresholds) -> dict[str, Any]:
    w, b = th.window_s, f.bucket_s
    before, after = windows(t0, w, b)
    end = after + pd.Timedelta(seconds=w)
    r0 = _rate(f.lb, REQUESTS, before, before + pd.Timedelta(seconds=w), b)
    r1 = _rate(f.lb, REQUESTS, after, end, b)
    n = len(_pods(f))
    text = f"request rate {r0:.2f}/s in the {w:.0f} s before the first death, {r1:.2f}/s after"
    if n > 1:
        text += (
            f"; per serving pod (even balancing) {r0 / n:.2f}/s over {n} pods → "
            f"{r1 / (n - 1):.2f}/s over the {n - 1} survivors"
        )
    until = before + pd.Timedelta(seconds=w)
    src = f"series: requests at the load balancer, {hms(before)}-{hms(until)}"
    src += f" and {hms(after)}-{hms(end)}"
    return _link("traffic shift", t0, text, [src]) | {
        "rate_before_per_s": num(r0),
        "rate_after_per_s": num(r1),
    }


def _pressure_climb(f: Frames, t0: pd.Timestamp, th: Thresholds) -> dict[str, list[dict[str, Any]]]:
    """Return, per pod but the first victim, how its pressure climbed after the first death
    (``t0``), until it died or ``window_s`` after ``t0``: from its recorded lines
    (``_climb_lines``), else from its series (``_climb_series``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    deaths = dict(zip(f.victims["pod"], f.victims["first_oom_at"], strict=True))
    first_pod = f.victims["pod"].iloc[0]
    for pod in _pods(f):
        p = f.pressure[f.pressure["pod"] == pod]
        if pod == first_pod or not len(p):
            continue
        until = deaths.get(pod, t0 + pd.Timedelta(seconds=th.window_s))
        detail = str(p["detail"].iloc[-1])  # its latest measure: KV cache or GPU memory
        climb = _climb_lines(f, pod, detail, t0, until, th)
        climb = climb or _climb_series(p[p["detail"] == detail], pod, t0, until, th, f.bucket_s)
        if climb is not None:
            text, when, sources = climb
            end = "before it died" if pod in deaths else f"in the {th.window_s:.0f} s after"
            out[pod] = [_link("pressure on a survivor", when, f"{text} {end}", sources)]
    return out


Climb = tuple[str, pd.Timestamp, list[str]]  # text, the time of its peak, its sources


def _climb_lines(
    f: Frames, pod: str, detail: str, t0: pd.Timestamp, until: pd.Timestamp, th: Thresholds
) -> Climb | None:
    """Return the climb of ``pod``'s ``detail`` (its series' measure) in its recorded lines
    (``gpu_memory`` evidence, ``citations.reading``): from its latest line in the ``window_s``
    before ``t0`` (else its first after) to its highest from ``t0`` to ``until``, both cited."""
    ev = _evidence(f, "gpu_memory", pod)
    ev = ev[(ev["time"] >= t0 - pd.Timedelta(seconds=th.window_s)) & (ev["time"] <= until)]
    lines = [(r, citations.reading(r.attrs, detail)) for r in ev.itertuples()]
    read = [(r, v) for r, v in lines if v is not None]
    after = [(r, v) for r, v in read if r.time >= t0]
    if not after:
        return None
    peak = max(after, key=lambda rv: rv[1])  # the first of equal highs
    before = [(r, v) for r, v in read if r.time < t0]
    start = before[-1] if before else after[0]
    text = f"pod {pod} {detail}"
    if start[0] is peak[0]:
        text += f" {peak[1]:.0%} at {hms(peak[0].time)}"
    elif f"{start[1]:.0%}" == f"{peak[1]:.0%}":  # no rise to tell: it stayed there
        text += f" held at {peak[1]:.0%} from {hms(start[0].time)} to {hms(peak[0].time)}"
    else:
        text += f" {start[1]:.0%} at {hms(start[0].time)} → {peak[1]:.0%} at {hms(peak[0].time)}"
    return text, peak[0].time, [peak[0].source, start[0].source]


def _climb_series(
    p: pd.DataFrame, pod: str, t0: pd.Timestamp, until: pd.Timestamp, th: Thresholds, b: float
) -> Climb | None:
    """Return the climb in ``pod``'s pressure series ``p`` (buckets of ``b`` s, each its
    highest reading): the highest in the ``window_s`` before ``t0`` to the highest until
    ``until``."""
    pb = p[(p["time"] >= t0 - pd.Timedelta(seconds=th.window_s)) & (p["time"] < t0)]["value"]
    pa = p[(p["time"] >= t0) & (p["time"] <= until)]
    if not len(pa):
        return None
    peak = pa.loc[pa["value"].idxmax()]
    start = f"{pb.max():.0%}" if len(pb) else "no reading"
    text = f"pod {pod} {peak['detail']} {start} → {peak['value']:.0%} (the {b:.0f} s bucket "
    text += f"from {hms(peak['time'])})"
    return text, peak["time"], [f"series: pressure of {pod}"]


def steps(f: Frames, document: Mapping[str, Any], th: Thresholds) -> list[dict[str, Any]]:
    """Return each runbook step with its diff, approval and measured effect."""
    entries = _step_entries(f)
    out = []
    for s in document.get("steps", []):
        mine = entries[entries["position"] == s["position"]]
        applied = mine[mine["event"].isin(("applied", "restarted"))]
        approval = s.get("approval_state") or {}
        at = applied["time"].iloc[0] if len(applied) else None
        mode = s.get("mode") or (applied["detail"].iloc[0].get("mode") if len(applied) else None)
        entry: dict[str, Any] = {
            "position": s["position"],
            "action": s["action"],
            "title": s["title"],
            "state": s.get("state"),
            "mode": mode,
            "diff": s.get("diff") or "",
            "approval": {
                "status": approval.get("status"),
                "by": approval.get("decided_by"),
                "via": approval.get("via"),
                "at": approval.get("decided_at"),
            },
            "applied_at": iso(at),
            "verification": None
            if s.get("state") in UNVERIFIED
            else (s.get("verification") or {}).get("result"),
        }
        if at is None:
            why = s.get("reason") or f"state {s.get('state')}"
            entry |= {"measured": None, "effect": f"never applied: {why}"}
        else:
            m = measure(f, at, th)
            name = f"step {s['position']} ({s['action']})"
            entry |= {"measured": m, "effect": effect_sentence(name, at, m, mode == "dry_run")}
        out.append(entry)
    return out


def _step_params(document: Mapping[str, Any], action: str) -> dict[str, Any] | None:
    found = [s for s in document.get("steps", []) if s["action"] == action]
    return dict(found[0]["params"]) if found else None


def baseline_pressure(f: Frames, before: pd.Timestamp | None) -> float | None:
    """Return the 95th percentile of KV-cache pressure in the buckets before ``before``."""
    p = f.pressure[f.pressure["detail"] == KV_CACHE]
    if before is not None:
        p = p[p["time"] < before]
    return num(p["value"].quantile(0.95), 3) if len(p) else None


def action_items(
    f: Frames, document: Mapping[str, Any], th: Thresholds, impact_: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Return the runbook's remediation and prevention made concrete with this incident's
    numbers, each with ``owner: TBD``.

    The 429 limit is sized from the load balancer's measured requests, not from the runbook
    step's budget (the capacity left to the survivors during the incident): per window of
    ``window_s`` (60 s: 12 of the 5 s buckets, sliding by one), served/min = (requests - 5xx
    - 429) x 60 / ``window_s``; limit = floor(the highest served/min of a window whose 5xx
    share is at most ``error_ratio``) (``checks.served_limit``).
    """
    out: list[dict[str, Any]] = []
    workload = document.get("workload", "")
    ceiling = _step_params(document, "lower_batch_ceiling")
    max_len = _latest_config(f, "max_model_len")
    kv_tokens = _latest_config(f, "kv_cache_tokens")
    new_seqs: int | None = None
    if ceiling and ceiling.get("new_ceiling") is not None:
        new_seqs = int(ceiling["new_ceiling"])
        out.append(_item(
            f"Lower the batch ceiling of {workload}: {ceiling.get('ceiling_param')} "
            f"{ceiling.get('current_ceiling')} → {new_seqs}",
            f"set {ceiling.get('settings')}; {ceiling.get('basis')}",
            "runbook step lower_batch_ceiling",
        ))  # fmt: skip
    elif max_len and kv_tokens:
        new_seqs = max(1, int(kv_tokens) // int(max_len))
        out.append(_item(
            f"Lower the batch ceiling of {workload} to {new_seqs} sequences",
            f"KV cache {int(kv_tokens):,} tokens / max_model_len {int(max_len):,}",
            "engine start-up lines",
        ))  # fmt: skip
    if max_len:
        detail = f"reject requests whose prompt + max_tokens exceed {int(max_len):,} tokens"
        if kv_tokens:
            detail += (
                f", and admit at most {int(kv_tokens):,} tokens in flight per pod (the KV "
                f"cache: {int(kv_tokens) // int(max_len)} full-length sequences)"
            )
        out.append(_item(
            f"Admission limit on input tokens at the gateway: {int(max_len):,} per request",
            detail, "max_model_len in the engine's start-up lines",
        ))  # fmt: skip
    start = first_oom(f)
    degraded = impact_.get("degraded_from")
    marks = [start, pd.Timestamp(degraded) if degraded else None]
    cutoff = min((x for x in marks if x is not None), default=None)
    if cutoff is not None:
        cutoff -= pd.Timedelta(seconds=th.window_s)
    base = baseline_pressure(f, cutoff)
    if base is not None:
        threshold = num(base + (th.kv_cache_ceiling - base) / 2, 2)
        out.append(_item(
            f"Autoscale {workload} on KV-cache usage above {threshold:.0%} for 30 s",
            f"baseline before the incident: {base:.0%} (95th percentile of KV-cache usage up to "
            f"{hms(cutoff) if cutoff is not None else 'the end'}); "
            f"ceiling {th.kv_cache_ceiling:.0%}; "
            "threshold halfway between them; also scale on queue wait "
            "(vllm:num_requests_waiting above 0 for 30 s)",
            "series: pressure",
        ) | {"threshold": threshold, "baseline": base})  # fmt: skip
    return out + _limit_item(f, document, th)


def _limit_item(f: Frames, document: Mapping[str, Any], th: Thresholds) -> list[dict[str, Any]]:
    """Return the standing 429 limit when the runbook planned one (``enable_rate_limit``),
    sized from the measured requests (``checks.served_limit``); none without a healthy window."""
    shed = _step_params(document, "enable_rate_limit")
    sized = checks.served_limit(f.lb, f.bucket_s, th.window_s, th.error_ratio)
    if shed is None or sized is None:
        return []
    return [checks.limit_item(sized, shed, str(document.get("workload")), th.error_ratio)]


def _item(title: str, detail: str, source: str) -> dict[str, Any]:
    return {"title": title, "detail": detail, "owner": "TBD", "source": source}


def timeline(f: Frames) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return (key entries, every entry): stages, deaths and step moves; then all of them."""
    every, key = [], []
    for row in f.timeline.itertuples():
        entry = {"time": iso(row.time), "kind": row.kind, "message": row.message}
        every.append(entry)
        event = (row.detail or {}).get("event") if isinstance(row.detail, dict) else None
        if (
            row.kind in ("stage", "note", "verdict")
            or (row.kind == "signal" and str(row.message).startswith("victim #"))
            or (row.kind == "step" and event in KEY_STEP_EVENTS)
        ):
            key.append(entry)
    return key, every


def summary(document: Mapping[str, Any], impact_: Mapping[str, Any], f: Frames) -> str:
    """Return three sentences: the workload, the duration, the outcome.

    The shed requests are the series' ``shed_429``, which counts the gateway's 429 (its rate
    limit) and 413 (its admission rule) together (``SHED_STATUSES``): named as both.
    """
    start = first_oom(f)
    n = len(f.victims)
    stage = document.get("stage")
    where = f"{document.get('workload_kind')} {document.get('workload')}"
    if start is None:
        return f"Incident {document.get('key')} of {where} has no victim recorded."
    when = pd.Timestamp(start).strftime("%Y-%m-%d %H:%M:%S UTC")
    one = f"On {when}, {n} pod(s) of {where} died of GPU out-of-memory one after another."
    two = (
        f"The endpoint was degraded for {duration(impact_['degraded_s'])} and down for "
        f"{duration(impact_['down_s'])}: {impact_['failed_5xx']:,} requests failed with 5xx "
        f"and {impact_['shed_429']:,} were shed at the gateway (429/413)."
    )
    ttr = impact_.get("time_to_recover_s")
    modes = [s.get("mode") for s in document.get("steps", [])]
    ran = "in dry-run (nothing changed)" if modes and "live" not in modes else ""
    reached = impact_.get("recovered_stage")
    if ttr is not None:
        three = f"It was {reached} {duration(ttr)} after the first OOM"
        three += f" and is now {stage}" if stage != reached else ""
    else:
        three = f"The incident is {stage}"
    three += (f"; its {len(modes)} runbook step(s) ran {ran}" if ran else "") + "."
    return " ".join((one, two, three))


def analyse(
    incident: Mapping[str, Any],
    document: Mapping[str, Any],
    f: Frames,
    th: Thresholds,
    delivery: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the postmortem's content (JSON values, stable order), without the plots.

    ``delivery``: the incident's Slack thread as delivered (``detector.report.outbox``'s
    ``DeliveryOut`` as JSON; None when nothing was queued), for the first notification.
    """
    resolved = incident.get("resolved_at")
    imp = impact(f, th, pd.Timestamp(resolved) if resolved else None)
    key, every = timeline(f)
    return {
        "kind": "incident",
        "incident": {
            "id": document.get("id"),
            "key": document.get("key"),
            "pattern": document.get("pattern"),
            "workload": document.get("workload"),
            "workload_kind": document.get("workload_kind"),
            "stage": document.get("stage"),
            "opened_at": document.get("opened_at"),
            "resolved_at": resolved,
            "pods": list(document.get("pods", [])),
        },
        "summary": summary(document, imp, f),
        "impact": imp,
        "detection": detection(f, delivery),
        "causal_chain": causal_chain(f, th),
        "forecasts": checks.forecasts(f.evidence, f.victims, record_end(f)),
        "steps": steps(f, document, th),
        "questions": citations.questions(f.evidence, document.get("questions", [])),
        "action_items": action_items(f, document, th, imp),
        "timeline": key,
        "timeline_full": every,
    }


def record_end(f: Frames) -> pd.Timestamp | None:
    """Return the end of the incident's record: its last timeline entry or series bucket."""
    ends = [f.timeline["time"].max() if len(f.timeline) else None]
    ends.append(f.lb.index.max() + pd.Timedelta(seconds=f.bucket_s) if len(f.lb) else None)
    found = [e for e in ends if e is not None and not pd.isna(e)]
    return max(found) if found else None


def markers(f: Frames) -> list[tuple[datetime, str, str]]:
    """Return the plots' markers ``(time, kind, label)``: stages, deaths, steps applied."""
    out: list[tuple[datetime, str, str]] = []
    for row in f.timeline.itertuples():
        detail = row.detail if isinstance(row.detail, dict) else {}
        when = pd.Timestamp(row.time).to_pydatetime()
        if row.kind == "stage":
            out.append((when, "stage", str(row.message).split(":", 1)[0]))
        elif row.kind == "signal" and str(row.message).startswith("victim #"):
            out.append((when, "death", str(row.message).split(":", 1)[0]))
        elif row.kind == "step" and detail.get("event") in ("applied", "lifted", "rolled_back"):
            out.append((when, "step", f"step {detail.get('position')} {detail.get('event')}"))
    return out
