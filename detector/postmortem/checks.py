"""What the detector said or planned, checked against what was measured (pure).

- ``forecasts``: each next-victim forecast (``detector.correlate.forecast``) against the
  forecast pod's death, or its survival.
- ``served_limit``, ``limit_item``: a standing 429 limit sized from the requests the load
  balancer measured, and its action item.
- ``first_notification``: the first Slack message delivered, from the outbox's record
  (``detector.report.outbox.DeliveryOut``), not from the timeline, which keeps no sends.

Each takes frames or plain values and returns JSON values; no clock, no store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import pandas as pd

from detector.correlate.series import ERRORS_5XX, REQUESTS, SHED_429
from detector.postmortem.fmt import hms, iso, num

NEXT_VICTIM: Final = "next_victim"  # the evidence kind of a forecast (detector.incidents.models)
ON_TIME_S: Final = 1.0  # a death within this of the forecast time is "as forecast"


def _utc(epoch_s: Any, fallback: pd.Timestamp) -> pd.Timestamp:
    if isinstance(epoch_s, int | float) and not isinstance(epoch_s, bool):
        return pd.Timestamp(datetime.fromtimestamp(float(epoch_s), UTC))
    return fallback


def _death(
    pod: str, after: pd.Timestamp, victims: pd.DataFrame, evidence: pd.DataFrame
) -> pd.Timestamp | None:
    """Return ``pod``'s first GPU OOM at or after ``after``: its victim entry, else a
    ``gpu_oom`` evidence line (a pod restarted after its first death can die again)."""
    mine = victims[(victims["pod"] == pod) & (victims["first_oom_at"] >= after)]
    ooms = evidence[(evidence["kind"] == "gpu_oom") & (evidence["pod"] == pod)]
    times = list(mine["first_oom_at"]) + list(ooms[ooms["time"] >= after]["time"])
    return min(times) if times else None


def forecasts(
    evidence: pd.DataFrame, victims: pd.DataFrame, end: pd.Timestamp | None
) -> list[dict[str, Any]]:
    """Return each next-victim forecast, in time order, with what happened to its pod.

    ``evidence``/``victims``: the frames of ``analysis.Frames``; ``end``: the end of the
    record (a pod alive then "did not die"). A forecast (evidence ``next_victim``, attrs of
    ``detector.correlate.correlator.Correlator._announce``) was made at ``fitted_at`` and
    predicted the pod at its ceiling at ``reaches_at`` = ``fitted_at`` + ``eta_s`` (Unix
    seconds). ``died_at``: the pod's first GPU OOM at or after ``fitted_at``; ``off_s`` =
    ``died_at`` - ``reaches_at`` in seconds (negative: it died sooner than forecast; None when
    it did not die); ``lead_s``: ``died_at`` - ``fitted_at``, the warning it gave.
    """
    out = []
    for row in evidence[evidence["kind"] == NEXT_VICTIM].itertuples():
        a = row.attrs if isinstance(row.attrs, Mapping) else {}
        pod = str(a.get("pod") or row.pod)
        made = _utc(a.get("fitted_at"), row.time)
        eta = float(a.get("eta_s") or 0.0)
        predicted = _utc(a.get("reaches_at"), made + pd.Timedelta(seconds=eta))
        died = _death(pod, made, victims, evidence)
        off = (died - predicted).total_seconds() if died is not None else None
        out.append({
            "pod": pod,
            "forecast_at": iso(made),
            "said": row.summary,
            "eta_s": num(eta, 1),
            "predicted_at": iso(predicted),
            "died_at": iso(died),
            "lead_s": num((died - made).total_seconds(), 1) if died is not None else None,
            "off_s": num(off, 1) if off is not None else None,
            "text": _forecast_text(pod, made, eta, predicted, died, off, end),
        })  # fmt: skip
    return out


def _forecast_text(
    pod: str,
    made: pd.Timestamp,
    eta: float,
    predicted: pd.Timestamp,
    died: pd.Timestamp | None,
    off: float | None,
    end: pd.Timestamp | None,
) -> str:
    when = "now" if eta < 1.0 else f"in ~{eta:.0f} s"
    said = f"at {hms(made)} the forecast put pod {pod} at its ceiling {when}, at {hms(predicted)}"
    if died is None or off is None:
        until = f" by {hms(end)}, the end of the record" if end is not None else ""
        return f"{said}; it did not die{until}"
    lead = (died - made).total_seconds()
    gap = "as forecast" if abs(off) < ON_TIME_S else (
        f"{abs(off):.0f} s {'sooner' if off < 0 else 'later'} than forecast"
    )  # fmt: skip
    after = f" ({lead:.0f} s after the forecast)" if eta >= 1.0 else ""
    return f"{said}; it died at {hms(died)}, {gap}{after}"


def served_limit(
    lb: pd.DataFrame, bucket_s: float, window_s: float, error_ratio: float
) -> dict[str, Any] | None:
    """Return a standing 429 limit sized from the load balancer's measured requests.

    ``lb``: ``analysis.Frames.lb`` (responses per ``bucket_s`` bucket). Windows: every run of
    ``window_s / bucket_s`` consecutive buckets (60 s: 12 buckets of 5 s), sliding one bucket
    at a time. Per window, served = requests - 5xx - 429 (the responses that answered), per
    minute = served x 60 / ``window_s``; a window is healthy when its 5xx share (5xx /
    requests) is at most ``error_ratio`` (the correlator's). ``limit_per_min`` = floor(the
    highest served per minute of a healthy window): the most the endpoint served while it was
    healthy, a floor of its capacity (demand may never have reached it). ``peak_per_min``:
    the highest requests per minute of any window (what it received); ``shed_share_at_peak``
    = 1 - limit / peak. None without a healthy window (a series shorter than ``window_s``,
    or degraded throughout).
    """
    n = max(1, round(window_s / bucket_s))
    if len(lb) < n:
        return None
    sums = lb[[REQUESTS, ERRORS_5XX, SHED_429]].rolling(n).sum().dropna()
    per_min = 60.0 / (n * bucket_s)
    served = (sums[REQUESTS] - sums[ERRORS_5XX] - sums[SHED_429]) * per_min
    share = (sums[ERRORS_5XX] / sums[REQUESTS]).where(sums[REQUESTS] > 0)
    healthy = served[(share <= error_ratio) & (served > 0)]
    if not len(healthy):
        return None
    step = pd.Timedelta(seconds=bucket_s * (n - 1))  # a window is labelled by its last bucket
    best, peak_at = healthy.idxmax(), sums[REQUESTS].idxmax()
    limit = math.floor(healthy.max())
    peak = sums[REQUESTS].max() * per_min
    return {
        "limit_per_min": limit,
        "window_s": num(n * bucket_s, 1),
        "window_from": iso(best - step),
        "share_5xx": num(float(share[best]), 3),
        "peak_per_min": round(peak),
        "peak_from": iso(peak_at - step),
        "shed_share_at_peak": num(max(0.0, 1 - limit / peak), 3) if peak else 0.0,
    }


def limit_item(
    sized: Mapping[str, Any], step: Mapping[str, Any], workload: str, error_ratio: float
) -> dict[str, Any]:
    """Return the action item of a standing 429 limit ``sized`` by ``served_limit``; ``step``:
    the runbook's ``enable_rate_limit`` parameters, whose figures (the capacity left to the
    survivors) are what it lowers the limit to in an incident."""
    limit, w = sized["limit_per_min"], sized["window_s"]
    detail = (
        f"the most the endpoint served while healthy: {limit} requests/min answered "
        f"(requests - 5xx - 429) in the {w:.0f} s from {hms(pd.Timestamp(sized['window_from']))}"
        f", 5xx {sized['share_5xx']:.0%} of its requests (healthy: at most {error_ratio:.0%}); "
        f"it received up to {sized['peak_per_min']}/min (the {w:.0f} s from "
        f"{hms(pd.Timestamp(sized['peak_from']))}), of which this limit sheds "
        f"{sized['shed_share_at_peak']:.0%}; a floor of its capacity (raise it after a load test)"
    )
    rpm, conns = step.get("aggregate_limit_rpm"), step.get("aggregate_connections")
    if rpm is not None and step.get("aggregate_budget_rps") != "unknown":
        detail += (
            f"; in an incident the runbook's step lowers it to the capacity left to the survivors"
            f" ({rpm}/min and {conns} connections in this one)"
        )
    return {
        "title": f"Keep a 429 limit ready at the gateway: {limit}/min for {workload}",
        "detail": detail,
        "owner": "TBD",
        "source": "series: requests, 5xx and 429 at the load balancer",
        "sizing": dict(sized),
    }


def first_notification(delivery: Mapping[str, Any] | None) -> tuple[pd.Timestamp | None, str]:
    """Return (the time the first Slack message was delivered, a note when it is None).

    ``delivery``: ``detector.report.outbox.DeliveryOut`` as JSON values; None: no message was
    ever queued (Slack was off when the incident was recorded). The time is the earliest
    ``sent_at`` of the thread's replies (the sender posts the root message just before the
    first reply, in the same delivery). A replay (``drill``) is sent on the wall clock while its
    incident runs on the recording's: its send time is given in the note, not as a milestone.
    """
    if delivery is None:
        return None, "nothing was queued for Slack (notifications were off)"
    where = f"Slack {delivery.get('channel') or ''}".rstrip()
    sent = delivery.get("first_sent_at")
    if sent is None:
        posted = "its root message was posted, " if delivery.get("root_posted") else ""
        error = f" (last error: {delivery['error']})" if delivery.get("error") else ""
        queued = delivery.get("queued", 0)
        return None, f"queued for {where}; {posted}none of {queued} replies delivered{error}"
    when = pd.Timestamp(sent).tz_convert("UTC")
    if delivery.get("drill"):
        wall = when.strftime("%Y-%m-%d %H:%M:%S UTC")
        return None, (
            f"a replay: first delivered to {where} at {wall} by the wall clock, which is not "
            "the recording's clock (no delay measured)"
        )
    return when, ""
