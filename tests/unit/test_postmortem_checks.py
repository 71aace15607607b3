"""The postmortem's checks of what the detector said against what happened: the next-victim
forecasts against the deaths, the first notification from the outbox, the 429 limit's sizing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from detector.postmortem import analysis, checks

T0 = datetime(2025, 3, 14, 9, 0, 0, tzinfo=UTC)
TH = analysis.Thresholds(error_ratio=0.1, kv_cache_ceiling=0.95, window_s=60.0)


def iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def forecast(at_s: float, pod: str, eta_s: float, id_: int) -> dict[str, Any]:
    """A ``next_victim`` evidence row as the correlator writes it (``_announce``)."""
    fitted = T0.timestamp() + at_s
    summary = f"next victim at risk: pod {pod} in ~{eta_s:.0f} s" if eta_s >= 1 else (
        f"next victim at risk: pod {pod}, at its ceiling now"
    )  # fmt: skip
    attrs = {"pod": pod, "eta_s": eta_s, "fitted_at": fitted, "reaches_at": fitted + eta_s}
    return {"id": id_, "kind": "next_victim", "pod": pod, "time": iso(at_s),
            "summary": summary, "source": "metrics:1", "attrs": attrs}  # fmt: skip


def frames_of(evidence: list[dict[str, Any]], victims: list[tuple[str, float]]) -> analysis.Frames:
    incident = {
        "victims": [
            {"pod": pod, "position": i + 1, "first_oom_at": iso(t)}
            for i, (pod, t) in enumerate(victims)
        ],
        "evidence": evidence,
        "timeline": [{"id": 1, "time": iso(600), "kind": "stage", "message": "stage -> x: y"}],
    }
    return analysis.frames(incident, pd.DataFrame(columns=["time", "metric", "label", "value",
                                                           "detail"]), 5.0)  # fmt: skip


def test_each_forecast_is_set_against_the_death_it_predicted() -> None:
    """Issue 24: "in ~117 s" for a pod that died 29 s later read as if it had come true."""
    f = frames_of(
        [forecast(100, "b", 117.0, 1), forecast(200, "c", 0.0, 2), forecast(300, "d", 40.0, 3),
         {"id": 4, "kind": "gpu_oom", "pod": "c", "time": iso(200.4), "summary": "oom",
          "source": "logs:9", "attrs": {}}],
        [("a", 30), ("b", 129)],
    )  # fmt: skip
    soon, on_time, alive = checks.forecasts(f.evidence, f.victims, analysis.record_end(f))
    assert soon | {"text": ""} == {
        "pod": "b", "forecast_at": iso(100), "said": "next victim at risk: pod b in ~117 s",
        "eta_s": 117.0, "predicted_at": iso(217), "died_at": iso(129), "lead_s": 29.0,
        "off_s": -88.0, "text": "",
    }  # fmt: skip
    assert soon["text"] == (
        "at 09:01:40 the forecast put pod b at its ceiling in ~117 s, at 09:03:37; it died at "
        "09:02:09, 88 s sooner than forecast (29 s after the forecast)"
    )
    # a death known only from its gpu_oom line (no victim entry), within a second: on time
    assert (on_time["died_at"], on_time["off_s"]) == (iso(200.4), 0.4)
    assert on_time["text"].endswith("it died at 09:03:20, as forecast")
    assert (alive["died_at"], alive["off_s"], alive["lead_s"]) == (None, None, None)
    assert alive["text"].endswith("; it did not die by 09:10:00, the end of the record")


def test_a_death_before_the_forecast_is_not_the_one_it_predicted() -> None:
    f = frames_of([forecast(100, "a", 20.0, 1)], [("a", 30)])
    (only,) = checks.forecasts(f.evidence, f.victims, None)
    assert only["died_at"] is None and only["text"].endswith("; it did not die")


DELIVERED = {"channel": "#oncall", "drill": False, "root_posted": True, "queued": 5, "sent": 5,
             "first_sent_at": iso(32.5), "first_told_at": iso(30), "error": ""}  # fmt: skip


@pytest.mark.parametrize(
    ("delivery", "time", "note"),
    [
        (None, None, "nothing was queued for Slack (notifications were off)"),
        (DELIVERED, iso(32.5), ""),
        (DELIVERED | {"drill": True}, None, "a replay: first delivered to Slack #oncall at "
         "2025-03-14 09:00:32 UTC by the wall clock, which is not the recording's clock (no "
         "delay measured)"),
        (DELIVERED | {"first_sent_at": None, "sent": 0, "error": "channel_not_found"}, None,
         "queued for Slack #oncall; its root message was posted, none of 5 replies delivered "
         "(last error: channel_not_found)"),
    ],
)  # fmt: skip
def test_the_first_notification_is_the_first_message_the_outbox_delivered(
    delivery: dict[str, Any] | None, time: str | None, note: str
) -> None:
    """Issue 24: it stayed "-" after Slack posted: Slack sends are in the outbox only."""
    f = frames_of([], [("a", 30)])
    found = {d["milestone"]: d for d in analysis.detection(f, delivery)}
    assert found["first notification"]["time"] == time
    assert found["first notification"]["note"] == note
    assert found["first notification"]["delay_s"] == (2.5 if time else None)


def lb(buckets: list[tuple[int, int, int]]) -> pd.DataFrame:
    """A load balancer frame of 5 s buckets from 0 s: (requests, 5xx, 429) each."""
    index = pd.date_range(T0, periods=len(buckets), freq=pd.Timedelta(seconds=5))
    return pd.DataFrame(buckets, index=index, columns=["requests", "errors_5xx", "shed_429"])


def test_the_limit_counts_shed_requests_as_not_served_and_needs_a_full_minute() -> None:
    shed = lb([(20, 0, 10)] * 12)  # 240/min received, 120/min of them refused with 429
    assert checks.served_limit(shed, 5.0, 60.0, 0.1)["limit_per_min"] == 120  # type: ignore[index]
    assert checks.served_limit(lb([(20, 0, 0)] * 11), 5.0, 60.0, 0.1) is None  # 55 s of series
    assert checks.served_limit(lb([(20, 3, 0)] * 12), 5.0, 60.0, 0.1) is None  # 15% 5xx
