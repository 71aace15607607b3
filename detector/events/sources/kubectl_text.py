"""Human ``kubectl`` output (``describe pod``, ``get pods``, ``get pod -o yaml``) -> Signal.

On-call engineers paste or save what ``kubectl`` printed; each text is turned into the Pod
and Event objects it shows and handed to ``k8s_pod`` / ``k8s_event``, so OOMKilled versus exit
137 with reason Error is decided in one place.

- ``kubectl describe pod``: Name, Namespace, Node, Start Time, Status, Labels, Controlled By,
  and per container State / Last State (Reason, Exit Code, Started, Finished), Ready and
  Restart Count; also a container fragment without the pod header, and pastes that lost their
  indentation (the fields are told by their names, not by their indent). Times are RFC 1123
  (``Mon, 02 Jan 2006 15:04:05 -0700``).
- the Events table of ``describe`` (``Type Reason Age From Message``, and the
  ``1h (x3 from 1h)`` wording of Kubernetes <= 1.7): ages are relative, so an event is timed by
  ``default_time``.
- ``kubectl get pods`` rows: STATUS CrashLoopBackOff (or OOMKilled) and RESTARTS, merged into
  the describe of the same pod when both were pasted.
- YAML (``kubectl get pod -o yaml``, or a bare ``status`` / ``containerStatuses`` /
  ``lastState`` fragment), also with a CI log's timestamp before every line.

Sources: https://kubernetes.io/docs/reference/kubectl/generated/kubectl_describe/ ,
https://kubernetes.io/docs/reference/kubectl/generated/kubectl_get/ .
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import yaml

from detector.errors import ParseError
from detector.events.model import Signal, SourcePos
from detector.events.sources.k8s_event import signals_from_event
from detector.events.sources.k8s_pod import signals_from_pod

_CI_PREFIX = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z ")
_COMMAND = re.compile(r"(?:\$ |kubectl\b|nvidia-smi\b)")
_FIELD = re.compile(r"( *)([A-Za-z][A-Za-z0-9 ._/-]{0,40}?):(?:[ \t]+(.*))?$")
_EVENT = re.compile(r"\s*(Normal|Warning)\s+([A-Za-z]\w{0,60})(?:\s{2,}|\t)(.*)$")
_EVENT_COLUMNS = re.compile(r"(.+?)(?:\s{2,}|\t)(.+?)(?:\s{2,}|\t)(.*)$")
_COUNT = re.compile(r"\(x(\d{1,9}) ")
_FIELD_PATH = re.compile(r"spec\.(?:initContainers|containers)\{[^}]{1,253}\}")
_GET_HEADER = re.compile(r"(?:NAMESPACE\s+)?NAME\s+READY\s+STATUS\s+RESTARTS")
_YAML_START = re.compile(r"(?:apiVersion|kind|metadata|status|containerStatuses|lastState):")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_STATE_KEYS = {"Reason": "reason", "Message": "message", "Exit Code": "exitCode"}
_STATE_TIMES = {"Started": "startedAt", "Finished": "finishedAt"}
_STATES = {"Waiting": "waiting", "Running": "running", "Terminated": "terminated"}
_POD_SECTION_ENDS = frozenset(
    {"Conditions", "Volumes", "QoS Class", "Node-Selectors", "Tolerations", "Events"}
)
_MAX_YAML_NODES = 100_000

__all__ = ["is_kubectl_text", "signals_from_kubectl_text"]


def is_kubectl_text(head: str) -> bool:
    """Tell whether ``head`` (a record's first lines) is kubectl describe/get/YAML output.

    Formats: https://kubernetes.io/docs/reference/kubectl/generated/kubectl_describe/ and
    https://kubernetes.io/docs/reference/kubectl/generated/kubectl_get/ .
    """
    lines = [ln for ln in _strip_ci(head.split("\n")[:12]) if ln.strip()]
    while lines and _COMMAND.match(lines[0]):
        lines.pop(0)
    if not lines:
        return False
    first, rest = lines[0].strip(), lines[1:]
    if first.startswith("Name:"):
        return bool(rest) and rest[0].lstrip().startswith("Namespace:")
    if first in ("Events:", "Containers:") or _EVENT.match(first) or _GET_HEADER.match(first):
        return True
    if re.match(r"Type\s+Reason\s+", first) or re.match(r"(?:Last )?State:\s+[A-Z]", first):
        return True
    return bool(_YAML_START.match(first)) and bool(rest)


def signals_from_kubectl_text(
    text: str,
    source: SourcePos,
    *,
    default_time: float | None = None,
    namespace: str | None = None,
) -> list[Signal]:
    """Return the signals of one pasted ``kubectl describe`` / ``get`` / ``-o yaml`` output.

    ``namespace`` (``detector replay --namespace``) is the namespace of the pods the output
    shows without one (a ``get pods`` table without a NAMESPACE column, a bare fragment).

    Raises ``ParseError`` only: ``unknown_format`` (nothing kubectl-shaped), ``malformed_json``
    (invalid YAML), ``missing_timestamp`` (signals but neither a time nor ``default_time``),
    ``bad_timestamp``. Formats:
    https://kubernetes.io/docs/reference/kubectl/generated/kubectl_describe/ .
    """
    lines = _strip_ci(text.split("\n"))
    body = [ln for ln in lines if ln.strip() and not _COMMAND.match(ln)]
    if body and _YAML_START.match(body[0].strip()):
        return _from_yaml("\n".join(lines), source, default_time, namespace)
    pods, events = _read_text(lines)
    if not pods and not events:
        raise ParseError("unknown_format", "no kubectl describe/get fields found")
    if namespace:
        for pod in pods:
            pod["metadata"].setdefault("namespace", namespace)
    out: list[Signal] = []
    for pod in pods:
        out.extend(_pod_signals(pod, source, default_time))
    identity = pods[-1]["metadata"] if pods else {}
    node = pods[-1]["spec"].get("nodeName") if pods else None
    for event in events:
        event["involvedObject"].update(identity)
        if namespace:
            event["involvedObject"].setdefault("namespace", namespace)
        if node is not None:
            event["source"] = {"host": node}
        out.extend(_event_signals(event, source, default_time))
    return out


def _strip_ci(lines: list[str]) -> list[str]:
    """Drop a CI log's timestamp prefix when the first non-blank line carries one."""
    first = next((ln for ln in lines if ln.strip()), "")
    if not _CI_PREFIX.match(first):
        return [ln.rstrip("\r") for ln in lines]
    return [_CI_PREFIX.sub("", ln, count=1).rstrip("\r") for ln in lines]


# --- describe / get text ----------------------------------------------------------------------


class _Reader:
    """State of a line-by-line walk through describe and get output."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.rows: dict[str, dict[str, Any]] = {}  # kubectl get rows by pod name
        self.section = ""
        self.container: dict[str, Any] | None = None
        self.state: dict[str, Any] | None = None
        self.last_key = ""
        self.header: list[str] | None = None

    def pod(self) -> dict[str, Any]:
        if not self.pods:
            self.pods.append(_new_pod())
        return self.pods[-1]


def _new_pod() -> dict[str, Any]:
    return {"metadata": {}, "spec": {}, "status": {"containerStatuses": []}}


def _read_text(lines: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Collect the pods and events a describe/get text shows."""
    r = _Reader()
    for line in lines:
        if not line.strip() or line.startswith("$ "):
            r.header = None
            continue
        _read_line(r, line)
    _merge_rows(r)
    return r.pods, r.events


def _read_line(r: _Reader, line: str) -> None:
    event = _EVENT.match(line)
    if event is not None:
        r.events.append(_event(event))
        return
    if _GET_HEADER.match(line.strip()):
        r.header = re.split(r"\s{2,}|\t", line.strip())
        return
    if r.header is not None:
        _get_row(r, re.split(r"\s{2,}|\t", line.strip()))
        return
    field = _FIELD.match(line)
    if field is None:
        if r.last_key == "Labels" and "=" in line and ":" not in line:
            key, _, value = line.strip().partition("=")
            r.pod()["metadata"].setdefault("labels", {})[key] = value
        return
    indent, key, value = len(field.group(1)), field.group(2), (field.group(3) or "").strip()
    r.last_key = key
    _read_field(r, indent, key, value)


def _read_field(r: _Reader, indent: int, key: str, value: str) -> None:
    """Apply one ``Key: value`` line of describe output."""
    if key == "Name" and value and (r.section == "" or indent == 0):
        r.pods.append(_new_pod())
        r.section, r.container, r.state = "pod", None, None
        r.pods[-1]["metadata"]["name"] = value
    elif key in ("Containers", "Init Containers") and not value:
        r.section, r.container, r.state = "containers", None, None
    elif key in _POD_SECTION_ENDS:
        r.section, r.container, r.state = "after", None, None
    elif r.section == "containers" and not value and indent <= 2 and _DNS_LABEL.fullmatch(key):
        r.container = {"name": key}
        r.pod()["status"]["containerStatuses"].append(r.container)
        r.state = None
    elif key in ("State", "Last State") and value in _STATES:
        _start_state(r, key, _STATES[value])
    elif r.state is not None and (key in _STATE_KEYS or key in _STATE_TIMES):
        _state_field(r.state, key, value)
    elif key in ("Ready", "Restart Count") and (r.container is not None or r.state is not None):
        _container_field(r, key, value)
    elif r.section in ("", "pod") and r.container is None:
        _pod_field(r.pod(), key, value)


def _start_state(r: _Reader, key: str, state: str) -> None:
    if r.container is None:  # a container fragment without its name or the pod header
        r.container = {}
        r.pod()["status"]["containerStatuses"].append(r.container)
        r.section = "containers"
    r.state = {}
    r.container["state" if key == "State" else "lastState"] = {state: r.state}


def _state_field(state: dict[str, Any], key: str, value: str) -> None:
    if key in _STATE_TIMES:
        state[_STATE_TIMES[key]] = _rfc1123(value)
    elif key == "Exit Code":
        state["exitCode"] = int(value) if value.isdigit() and len(value) < 10 else None
    else:
        state[_STATE_KEYS[key]] = value


def _container_field(r: _Reader, key: str, value: str) -> None:
    if r.container is None:
        return
    if key == "Ready":
        r.container["ready"] = value == "True"
    elif value.isdigit() and len(value) < 10:
        r.container["restartCount"] = int(value)
    r.state = None


def _pod_field(pod: dict[str, Any], key: str, value: str) -> None:
    meta, status = pod["metadata"], pod["status"]
    if key == "Namespace" and value:
        meta["namespace"] = value
    elif key == "Node" and value and value != "<none>":
        pod["spec"]["nodeName"] = value.split("/", 1)[0]
    elif key == "Start Time" and value:
        status["startTime"] = _rfc1123(value)
    elif key == "Status" and value:
        status["phase"] = value
    elif key == "Labels" and "=" in value:
        label, _, label_value = value.partition("=")
        meta.setdefault("labels", {})[label] = label_value
    elif key == "Controlled By" and "/" in value:
        kind, _, name = value.partition("/")
        meta["ownerReferences"] = [{"kind": kind, "name": name, "controller": True}]


def _rfc1123(value: str) -> str:
    """Return an RFC 1123 describe time as ISO-8601; raise ``bad_timestamp`` otherwise."""
    try:
        return parsedate_to_datetime(value).isoformat()
    except (ValueError, TypeError, IndexError, OverflowError):
        raise ParseError("bad_timestamp", f"not an RFC 1123 time: {value[:64]!r}") from None


def _event(match: re.Match[str]) -> dict[str, Any]:
    """Build the core/v1 Event one describe Events row shows (age and source dropped)."""
    kind, reason, rest = match.groups()
    columns = _EVENT_COLUMNS.match(rest)
    message = columns.group(3) if columns else rest  # legacy layouts: the whole rest
    count = _COUNT.search(columns.group(1) if columns else rest)
    involved: dict[str, Any] = {"kind": "Pod"}
    path = _FIELD_PATH.search(rest)
    if path is not None:
        involved["fieldPath"] = path.group(0)
    return {
        "type": kind,
        "reason": reason,
        "message": message.strip(),
        "count": int(count.group(1)) if count else 1,
        "involvedObject": involved,
    }


def _get_row(r: _Reader, cells: list[str]) -> None:
    """Read one ``kubectl get pods`` row into a container status of that pod."""
    assert r.header is not None
    row = dict(zip(r.header, cells, strict=False))
    name = row.get("NAME", "").removeprefix("pod/")
    if not _DNS_LABEL.fullmatch(name[:63]) or "STATUS" not in row:
        return
    restarts = row.get("RESTARTS", "").split(" ", 1)[0]
    status: dict[str, Any] = {"restartCount": int(restarts) if restarts.isdigit() else 0}
    if row["STATUS"] == "CrashLoopBackOff":
        status["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    elif row["STATUS"] == "OOMKilled":
        status["state"] = {"terminated": {"reason": "OOMKilled"}}
    meta = {"name": name}
    if row.get("NAMESPACE"):
        meta["namespace"] = row["NAMESPACE"]
    r.rows[name] = {"metadata": meta, "status": status, "node": row.get("NODE")}


def _merge_rows(r: _Reader) -> None:
    """Give each get row to the described pod of its name, or make it a pod of its own."""
    for name, row in r.rows.items():
        pod = next((p for p in r.pods if p["metadata"].get("name") == name), None)
        if pod is None:
            pod = _new_pod()
            pod["metadata"].update(row["metadata"])
            if row["node"] not in (None, "<none>"):
                pod["spec"]["nodeName"] = row["node"]
            r.pods.append(pod)
        statuses = pod["status"]["containerStatuses"]
        if any("state" in cs or "lastState" in cs for cs in statuses):
            continue  # the describe shows the containers' own states
        if len(statuses) == 1:
            statuses[0].update(row["status"])
        else:
            statuses.append(row["status"])


def _pod_signals(
    pod: dict[str, Any], source: SourcePos, default_time: float | None
) -> list[Signal]:
    """Hand a pod to ``k8s_pod``; time it by ``default_time`` when it shows no time at all."""
    try:
        return signals_from_pod(pod, source)
    except ParseError as exc:
        if exc.reason != "missing_field":
            raise
    if not pod["status"].get("containerStatuses"):
        return []
    if default_time is None:
        raise ParseError("missing_timestamp", "kubectl output shows no time; give default_time")
    try:
        pod["status"]["startTime"] = datetime.fromtimestamp(default_time, UTC).isoformat()
    except (ValueError, OverflowError, OSError):
        raise ParseError("bad_timestamp", f"default_time {default_time!r}") from None
    return signals_from_pod(pod, source)


def _event_signals(
    event: dict[str, Any], source: SourcePos, default_time: float | None
) -> list[Signal]:
    try:
        return signals_from_event(event, source, default_time=default_time)
    except ParseError as exc:
        if exc.reason == "missing_field":
            raise ParseError("missing_timestamp", "describe event ages are relative") from None
        raise


# --- YAML ------------------------------------------------------------------------------------


def _from_yaml(
    text: str, source: SourcePos, default_time: float | None, namespace: str | None
) -> list[Signal]:
    """Parse ``kubectl get pod -o yaml`` (or a status fragment of it) with the Pod logic."""
    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise ParseError("malformed_json", f"invalid YAML: {str(exc)[:160]}") from None
    if not isinstance(doc, dict):
        raise ParseError("unknown_format", "YAML document is not a mapping")
    doc = _plain(doc, {}, [0])
    if "containerStatuses" in doc:
        doc = {"status": doc}
    elif "lastState" in doc or "state" in doc:
        doc = {"status": {"containerStatuses": [doc]}}
    if not isinstance(doc.get("status"), dict):
        raise ParseError("unknown_format", "YAML without a pod status")
    if doc.get("kind") not in (None, "Pod"):
        raise ParseError("unknown_format", f"YAML kind {str(doc.get('kind'))[:40]}")
    doc.setdefault("metadata", {})
    if not isinstance(doc["metadata"], dict):
        raise ParseError("unknown_format", "YAML metadata is not a mapping")
    if namespace and not doc["metadata"].get("namespace"):
        doc["metadata"]["namespace"] = namespace
    status = doc["status"]
    if not isinstance(status.get("containerStatuses", []), list):
        raise ParseError("unknown_format", "containerStatuses is not a list")
    status.setdefault("containerStatuses", [])
    return _pod_signals(doc, source, default_time)


def _plain(value: Any, seen: dict[int, Any], budget: list[int]) -> Any:
    """Return YAML data with dates as ISO strings; bounded even for alias bombs."""
    budget[0] += 1
    if budget[0] > _MAX_YAML_NODES:
        raise ParseError("too_large", "YAML document has too many nodes")
    if isinstance(value, datetime | date):
        return value.isoformat()
    if id(value) in seen:
        return seen[id(value)]
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        seen[id(value)] = out
        for key, item in value.items():
            out[key if isinstance(key, str) else str(key)] = _plain(item, seen, budget)
        return out
    if isinstance(value, list):
        items: list[Any] = []
        seen[id(value)] = items
        items.extend(_plain(item, seen, budget) for item in value)
        return items
    return value
