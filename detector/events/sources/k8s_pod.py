"""Kubernetes core/v1 Pod objects (``kubectl get pod -o json``, watch events) -> Signal.

Per container status: ``state.waiting.reason`` CrashLoopBackOff -> CRASH_LOOP; a restart whose
``lastState.terminated`` is not an OOM kill -> CRASH_LOOP ("Restarted"); a ``terminated``
state (current or last) with reason OOMKilled, or exit code 137 and no reason -> HOST_OOM, the
look-alike of a GPU OOM.
Exit code 137 with reason Error is a SIGKILL such as a liveness-probe kill, not an OOM kill, so
it is only crash-loop evidence. Phase Running with every container ready -> POD_READY.
Source: https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus
"""

from __future__ import annotations

from typing import Any

from detector.errors import ParseError
from detector.events.model import Signal, SignalKind, SourcePos
from detector.events.sources.timeparse import parse_time, str_map, str_or_none

_OOM_REASONS = frozenset({"OOMKilled", "OOM Killed"})  # "OOM Killed": kubelet of 2014-2015


def signals_from_pod(pod: dict[str, Any], source: SourcePos) -> list[Signal]:
    """Return the signals one Pod object carries.

    Time: the latest status timestamp (container started/finished times, condition transitions,
    startTime); a HOST_OOM or restart is timed by its own ``finishedAt`` and POD_READY by the
    Ready condition's transition, so re-delivered snapshots repeat the same times.
    CRASH_LOOP attrs: reason, restart_count, last_reason, exit_code. HOST_OOM attrs: reason,
    exit_code. POD_READY attrs: ready. Every signal also carries ``pod_ip`` (``status.podIP``)
    when the pod has one of its own (not ``hostNetwork``, whose IP is its node's and shared):
    load-balancer lines name their upstream by it. Raises
    ``ParseError("missing_field")`` when the pod has no status timestamp at all,
    ``"bad_timestamp"`` for an unparseable one.
    Format: https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/
    """
    status = _obj(pod.get("status"))
    statuses = [s for s in _list(status.get("containerStatuses")) if isinstance(s, dict)]
    snapshot = _snapshot_time(status, statuses)
    if snapshot is None:
        raise ParseError("missing_field", "pod status has no timestamp")
    meta = _obj(pod.get("metadata"))
    base = _Base(
        source,
        str_or_none(meta.get("namespace")),
        str_or_none(meta.get("name")),
        str_or_none(_obj(pod.get("spec")).get("nodeName")),
        str_map(meta.get("labels")),
        owner_from_refs(meta.get("ownerReferences")),
        _own_ip(pod, status),
    )
    out: list[Signal] = []
    for cs in statuses:
        out.extend(_container_signals(base, cs, snapshot))
    ready_time = _ready_time(status, statuses, snapshot)
    if ready_time is not None:
        out.append(base.signal(SignalKind.POD_READY, ready_time, None, {"ready": True}, "Ready"))
    return out


def owner_from_refs(refs: Any) -> tuple[str, str] | None:
    """Return (kind, name) of the controller in ``ownerReferences``, else of the first one."""
    found: tuple[str, str] | None = None
    for ref in _list(refs):
        if not isinstance(ref, dict):
            continue
        kind, name = ref.get("kind"), ref.get("name")
        if not (isinstance(kind, str) and isinstance(name, str) and kind and name):
            continue
        if ref.get("controller") is True:
            return kind, name
        found = found or (kind, name)
    return found


class _Base:
    """The identity every signal of one pod shares."""

    __slots__ = ("labels", "namespace", "node", "owner", "pod", "pod_ip", "source")

    def __init__(
        self,
        source: SourcePos,
        namespace: str | None,
        pod: str | None,
        node: str | None,
        labels: dict[str, str],
        owner: tuple[str, str] | None,
        pod_ip: str | None = None,
    ) -> None:
        self.source, self.namespace, self.pod, self.node = source, namespace, pod, node
        self.labels, self.owner, self.pod_ip = labels, owner, pod_ip

    def signal(
        self, kind: SignalKind, time: float, container: str | None, attrs: dict[str, Any], text: str
    ) -> Signal:
        """Build one signal of this pod."""
        if self.pod_ip:
            attrs["pod_ip"] = self.pod_ip
        return Signal(
            kind=kind,
            time=time,
            source=self.source,
            namespace=self.namespace,
            pod=self.pod,
            container=container,
            node=self.node,
            labels=self.labels,
            owner=self.owner,
            attrs=attrs,
            text=f"pod {self.pod} container {container}: {text}"[:2048],
        )


def _container_signals(base: _Base, cs: dict[str, Any], snapshot: float) -> list[Signal]:
    """CRASH_LOOP / HOST_OOM signals of one container status."""
    name = str_or_none(cs.get("name"))
    state, last_state = _obj(cs.get("state")), _obj(cs.get("lastState"))
    last = _obj(last_state.get("terminated"))
    restarts = cs.get("restartCount")
    restart_count = restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else 0
    out: list[Signal] = []
    for term in (_obj(state.get("terminated")), last):
        if _is_oom_kill(term):
            reason = str_or_none(term.get("reason")) or "exit 137"
            attrs = {"reason": reason.replace(" ", ""), "exit_code": _exit_code(term)}
            time = _time_or(term.get("finishedAt"), snapshot)
            out.append(base.signal(SignalKind.HOST_OOM, time, name, attrs, reason))
    waiting_reason = _obj(state.get("waiting")).get("reason")
    crash = {
        "reason": "CrashLoopBackOff",
        "restart_count": restart_count,
        "last_reason": str_or_none(last.get("reason")),
        "exit_code": _exit_code(last),
    }
    if waiting_reason == "CrashLoopBackOff":
        out.append(base.signal(SignalKind.CRASH_LOOP, snapshot, name, crash, "CrashLoopBackOff"))
    elif last and restart_count > 0 and not _is_oom_kill(last):
        crash["reason"] = "Restarted"
        time = _time_or(last.get("finishedAt"), snapshot)
        text = f"restarted after {crash['last_reason']} (exit {crash['exit_code']})"
        out.append(base.signal(SignalKind.CRASH_LOOP, time, name, crash, text))
    return out


def _own_ip(pod: dict[str, Any], status: dict[str, Any]) -> str | None:
    """Return ``status.podIP`` unless the pod shares its node's IP (``hostNetwork``)."""
    ip = str_or_none(status.get("podIP"))
    if ip is None or _obj(pod.get("spec")).get("hostNetwork") is True:
        return None
    return None if ip == status.get("hostIP") else ip


def _snapshot_time(status: dict[str, Any], statuses: list[dict[str, Any]]) -> float | None:
    """Return the latest timestamp in the pod status, or None if it has none."""
    values: list[Any] = [status.get("startTime")]
    for cond in _list(status.get("conditions")):
        if isinstance(cond, dict):
            values.append(cond.get("lastTransitionTime"))
            values.append(cond.get("lastProbeTime"))
    for cs in statuses:
        for state in (_obj(cs.get("state")), _obj(cs.get("lastState"))):
            for detail in state.values():
                if isinstance(detail, dict):
                    values.append(detail.get("startedAt"))
                    values.append(detail.get("finishedAt"))
    times = [parse_time(v) for v in values if v is not None]
    return max(times) if times else None


def _ready_time(
    status: dict[str, Any], statuses: list[dict[str, Any]], snapshot: float
) -> float | None:
    """Return when the pod became Ready if it is Running with every container ready."""
    if status.get("phase") != "Running" or not statuses:
        return None
    if not all(cs.get("ready") is True for cs in statuses):
        return None
    for cond in _list(status.get("conditions")):
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            if cond.get("status") != "True":
                return None
            return _time_or(cond.get("lastTransitionTime"), snapshot)
    return snapshot


def _is_oom_kill(term: dict[str, Any]) -> bool:
    """Tell an OOM kill: reason OOMKilled, or exit 137 with no reason (137 + Error is not)."""
    reason = term.get("reason")
    if isinstance(reason, str) and reason in _OOM_REASONS:
        return True
    return not reason and _exit_code(term) == 137


def _time_or(value: Any, fallback: float) -> float:
    return parse_time(value) if value is not None else fallback


def _exit_code(term: dict[str, Any]) -> int | None:
    code = term.get("exitCode")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
