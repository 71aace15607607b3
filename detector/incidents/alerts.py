"""Alertmanager's alerts joined to the incidents: evidence, a hardware-fault verdict, or seen.

The input is Alertmanager's webhook payload, version 4 (fields as documented at
https://prometheus.io/docs/alerting/latest/configuration/#webhook_config): ``version``,
``groupKey``, ``truncatedAlerts``, ``status``, ``receiver``, ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL`` and ``alerts[]``, each with ``status``
(``firing``/``resolved``), ``labels``, ``annotations``, ``startsAt``, ``endsAt`` (RFC 3339;
``0001-01-01T00:00:00Z`` while firing), ``generatorURL`` and ``fingerprint``.

Each alert is a signal (``signal_of``, pure): its name says which of our signals it is
(``SIGNAL_RULES``: kube-prometheus ``KubePodCrashLooping`` -> crash loop, ingress 5xx rules
-> lb_errors, DCGM memory rules -> gpu_memory, vLLM KV-cache/queue rules -> engine_pressure,
XID/ECC rules -> a hardware fault; any other name is context, ``alert``) and its labels name
the namespace, pod and workload. ``receive`` stores each alert once per (group key,
fingerprint, status, start) under a unique key, so Alertmanager's duplicates (HA peers,
retries, repeats, ``send_resolved``) and concurrent deliveries add nothing; a new one joins
the open incident of its workload as evidence (a resolved one as a timeline line), or is kept
as seen when none is open. An XID/ECC alert records a ``hardware_fault`` verdict: it never
opens or moves an incident.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from detector.correlate.identity import classify_pod
from detector.db import clean_json, clean_text, insert_ignore, store_errors
from detector.events.model import SourcePos
from detector.incidents import service
from detector.incidents.models import Alert, EvidenceKind, Incident

ORIGIN = "alertmanager"  # the evidence's source origin; its position: from the alert's key
HARDWARE_FAULT = "hardware_fault"  # the verdict of an XID/ECC alert
MAX_LABEL_CHARS = 255
MAX_TEXT_CHARS = 1000

# Alert name -> signal, first match wins (case-insensitive searches of the name).
SIGNAL_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"xid|ecc|double.?bit|row.?remap|retired.?page", re.I), HARDWARE_FAULT),
    (re.compile(r"crash.?loop", re.I), EvidenceKind.CRASH_LOOP.value),
    (re.compile(r"5xx|http.?5\d\d|error.?rate|errors?.?ratio", re.I), EvidenceKind.LB_ERRORS.value),
    (re.compile(r"kv.?cache|preempt|queue", re.I), EvidenceKind.ENGINE_PRESSURE.value),
    (re.compile(r"(gpu|dcgm|fb).*mem|framebuffer", re.I), EvidenceKind.GPU_MEMORY.value),
)
WORKLOAD_LABELS = ("workload", "deployment", "statefulset", "rollout", "leaderworkerset")
ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)  # Alertmanager's endsAt of an alert still firing


def _in_utc(value: datetime) -> datetime:
    """Return ``value`` in UTC; raises ValueError past the years 1..9999 there."""
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("the time is outside the years 1 to 9999 in UTC") from exc


# RFC 3339 times carry their offset: a time without one is refused, not read as local time.
Time = Annotated[AwareDatetime, AfterValidator(_in_utc)]


class AlertIn(BaseModel):
    """One alert of the webhook payload."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: Time = Field(alias="startsAt")
    ends_at: Time | None = Field(None, alias="endsAt")
    generator_url: str = Field("", alias="generatorURL", max_length=4096)
    fingerprint: str = Field(min_length=1, max_length=64)


class WebhookIn(BaseModel):
    """Alertmanager's webhook payload, version 4 (see the module doc)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    version: Literal["4"]
    group_key: str = Field(alias="groupKey", min_length=1, max_length=4096)
    truncated_alerts: int = Field(0, alias="truncatedAlerts", ge=0)
    status: Literal["firing", "resolved"]
    receiver: str = Field("", max_length=255)
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field("", alias="externalURL", max_length=4096)
    alerts: list[AlertIn] = Field(max_length=1000)


@dataclass(frozen=True, slots=True)
class AlertSignal:
    """What one alert says: its signal (``SIGNAL_RULES``), where, when (Unix s) and a line."""

    name: str
    signal: str
    status: str
    namespace: str | None
    pod: str | None
    workload: str | None
    cluster: str | None
    time: float
    summary: str


@dataclass(frozen=True, slots=True)
class Received:
    """What ``receive`` did with one alert: ``outcome`` (evidence, seen, verdict,
    unattributed, duplicate), its signal and the incident it joined (key), if any."""

    fingerprint: str
    status: str
    signal: str
    outcome: str
    incident: str | None


def signal_name(alertname: str) -> str:
    """Return the signal an alert's name maps to (``SIGNAL_RULES``), ``alert`` for none."""
    for pattern, signal in SIGNAL_RULES:
        if pattern.search(alertname):
            return signal
    return EvidenceKind.ALERT.value


def signal_of(alert: AlertIn) -> AlertSignal:
    """Return the signal of one alert: its name's signal, its labels' workload, its time.

    The workload: a ``workload``/``deployment``/``statefulset``/``rollout``/
    ``leaderworkerset`` label, else the controller the pod label's name implies
    (``correlate.identity.classify_pod``), else a service label. Where both are there,
    ``exported_pod``/``exported_namespace``/``exported_service`` win over ``pod``/
    ``namespace``/``service``: Prometheus renames a scraped metric's own label to
    ``exported_<name>`` when the target has that label (``honor_labels: false``,
    https://prometheus.io/docs/prometheus/latest/configuration/configuration/#scrape_config),
    so the exported one names the pod the metric is about (dcgm-exporter's GPU user), the
    plain one the exporter's pod. The time is ``endsAt`` for a resolved alert, else
    ``startsAt``.
    """
    labels = alert.labels
    name = labels.get("alertname", "")[:MAX_LABEL_CHARS] or "unnamed"
    namespace = _label(labels, "exported_namespace", "namespace")
    pod = _label(labels, "exported_pod", "pod", "pod_name")
    workload = _label(labels, *WORKLOAD_LABELS)
    if workload is None and pod is not None:
        kind, guessed, _ = classify_pod(pod, labels, None)
        workload = guessed if kind != "unknown" else None
    if workload is None:
        workload = _label(labels, "exported_service", "service")
    ended = alert.ends_at if alert.ends_at is not None and alert.ends_at > ZERO_TIME else None
    at = ended if alert.status == "resolved" and ended is not None else alert.starts_at
    words = alert.annotations.get("summary") or alert.annotations.get("description") or ""
    summary = f"alert {name} {alert.status}" + (f": {words}" if words else "")
    return AlertSignal(
        name=name,
        signal=signal_name(name),
        status=alert.status,
        namespace=namespace,
        pod=pod,
        workload=workload,
        cluster=_label(labels, "cluster"),
        time=at.timestamp(),
        summary=clean_text(summary)[:MAX_TEXT_CHARS],
    )


def dedupe_key(group_key: str, alert: AlertIn) -> str:
    """Return the alert's delivery key: SHA-256 (hex) of group key, fingerprint, status and
    start (a new firing of the same alert starts later: a new delivery)."""
    parts = (group_key, alert.fingerprint, alert.status, alert.starts_at.isoformat())
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


@store_errors
def receive(payload: WebhookIn, *, session: Session, now: datetime) -> list[Received]:
    """Store each new alert of ``payload`` and join it to its incident (see the module doc).

    Runs in the caller's transaction; ``now`` (wall clock) is the time received. Returns one
    ``Received`` per alert, in order. Raises StoreError.
    """
    return [_receive_one(payload.group_key, alert, session, now) for alert in payload.alerts]


def _receive_one(group_key: str, alert: AlertIn, session: Session, now: datetime) -> Received:
    sig = signal_of(alert)
    # An alert cannot start after it arrives: a later time (a skewed clock, a forged payload)
    # would move its incident's last update into the future, where it would stay.
    sig = replace(sig, time=min(sig.time, now.timestamp()))
    key = dedupe_key(group_key, alert)
    incident = _open_incident(session, sig)
    outcome = _outcome(sig, incident)
    values = {
        "dedupe_key": key,
        "group_key": clean_text(group_key),
        "fingerprint": clean_text(alert.fingerprint),
        "status": alert.status,
        "alertname": clean_text(sig.name),
        "signal": sig.signal,
        "outcome": outcome,
        "namespace": _cut(sig.namespace),
        "pod": _cut(sig.pod),
        "workload": _cut(sig.workload),
        "labels": clean_json(dict(alert.labels)),
        "annotations": clean_json(dict(alert.annotations)),
        "starts_at": alert.starts_at,
        "ends_at": alert.ends_at if alert.ends_at and alert.ends_at > ZERO_TIME else None,
        "generator_url": clean_text(alert.generator_url),
        "received_at": now,
        "incident_id": incident.id if incident is not None else None,
    }
    if not insert_ignore(session, Alert, values, ["dedupe_key"]):
        return Received(alert.fingerprint, alert.status, sig.signal, "duplicate", None)
    source = SourcePos(origin=ORIGIN, position=int(key[:15], 16))
    if sig.signal == HARDWARE_FAULT and sig.namespace and sig.workload:
        _verdict(sig, source, key, session)
    if incident is not None:
        _join(incident, sig, alert, source, key, session)
    return Received(
        alert.fingerprint,
        alert.status,
        sig.signal,
        outcome,
        incident.key if incident is not None else None,
    )


def _outcome(sig: AlertSignal, incident: Incident | None) -> str:
    if sig.signal == HARDWARE_FAULT and sig.namespace and sig.workload:
        return "verdict"
    if incident is not None:
        return "evidence"
    return "seen" if sig.namespace and sig.workload else "unattributed"


def _open_incident(session: Session, sig: AlertSignal) -> Incident | None:
    """Return the open incident of the alert's workload (the latest opened), or None."""
    if not (sig.namespace and sig.workload):
        return None
    stmt = select(Incident).where(
        Incident.namespace == sig.namespace,
        Incident.workload == sig.workload,
        Incident.resolved_at.is_(None),
    )
    if sig.cluster:
        stmt = stmt.where(Incident.cluster == sig.cluster)
    return session.scalars(stmt.order_by(Incident.opened_at.desc()).limit(1)).first()


def _join(
    incident: Incident,
    sig: AlertSignal,
    alert: AlertIn,
    source: SourcePos,
    key: str,
    session: Session,
) -> None:
    """Add a firing alert as evidence with its timeline line; a resolved one as a line."""
    evidence = None
    if alert.status == "firing":
        evidence = service.add_evidence(
            session=session,
            incident=incident,
            kind=sig.signal,
            pod=sig.pod,
            time=sig.time,
            source=source,
            summary=sig.summary,
            text=alert.annotations.get("description", "")[:MAX_TEXT_CHARS],
            attrs={"alertname": sig.name, "fingerprint": alert.fingerprint,
                   "labels": dict(alert.labels), "generator_url": alert.generator_url},
        )  # fmt: skip
    service.add_timeline_entry(
        session=session,
        incident=incident,
        time=sig.time,
        kind="signal",
        message=f"{sig.signal}: {sig.summary}",
        dedupe_key=f"alert:{key[:32]}",
        evidence=evidence,
    )


def _verdict(sig: AlertSignal, source: SourcePos, key: str, session: Session) -> None:
    where = f"pod {sig.pod}" if sig.pod else f"workload {sig.workload}"
    reason = f"GPU hardware fault: {sig.summary} ({where}): a failed GPU, not a GPU OOM cascade"
    service.record_verdict(
        session=session,
        cluster=sig.cluster,
        namespace=str(sig.namespace),
        workload=str(sig.workload),
        verdict=HARDWARE_FAULT,
        reason=reason[:MAX_TEXT_CHARS],
        time=sig.time,
        source=source,
        dedupe_key=f"alert:{key}",
    )


def _label(labels: dict[str, str], *names: str) -> str | None:
    for name in names:
        value = labels.get(name, "").strip()
        if value:
            return value[:MAX_LABEL_CHARS]
    return None


def _cut(value: str | None) -> str | None:
    return clean_text(value)[:MAX_LABEL_CHARS] if value is not None else None
