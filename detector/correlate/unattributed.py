"""Signals that name no workload: counted by kind and reason, with a few examples, never lost.

A signal the correlator cannot tie to a workload cannot open or join an incident; it is
tallied here with the reason and the flag or mapping that would tie it, so the report can say
what was left out and how to bring it in. Memory is bounded: the reasons are a fixed set per
kind, and each keeps at most ``EXAMPLES_KEPT`` examples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from detector.events.model import Signal, SignalKind

EXAMPLES_KEPT: Final = 3  # examples kept per (kind, reason)
# a web server's own access line (nothing proxied): no load balancer's line (``streams.py``)
NO_UPSTREAM: Final = "no upstream on the line"

_LOG_HINT = (
    "pass --namespace NS to replay (with --pod POD for one pod's raw log), or ship the logs "
    "with their Kubernetes metadata (namespace, pod)"
)
_POD_STATE_HINT = (
    "pass --namespace NS to replay (it names the pods of a pasted kubectl get pods table "
    "without a NAMESPACE column), paste kubectl output that shows the namespace (kubectl get "
    "pods -A, kubectl describe pod, -o yaml), or ship the pod objects and events with their "
    "metadata"
)
_POD_STATE_KINDS = frozenset({SignalKind.CRASH_LOOP, SignalKind.HOST_OOM, SignalKind.POD_READY})
_GPU_MEMORY_HINT = (
    "nvidia-smi lines name a GPU, not a pod: run detector gpu-sample --namespace NS --pod POD "
    "beside the pod that owns the GPU, pass --namespace NS --pod POD to replay for one pod's "
    "nvidia-smi output, or ship DCGM exporter metrics with their pod labels (namespace, pod)"
)
_NO_UPSTREAM_HINT = (
    "a proxy's access log must name the upstream (ingress-nginx $proxy_upstream_name, or the "
    "upstream address); a web server's own access log (static files, nothing proxied) names "
    "no workload and may stay out"
)
_UPSTREAM_HINT = (
    "add the upstream to a workloads file (upstreams: {NAME: {namespace, workload}}) and "
    "pass it with --workloads, or replay the pod objects too (kubectl get pods -A -o yaml) so "
    "the upstream address names its pod"
)


@dataclass
class UnattributedReason:
    """The signals of one kind left out for one reason: count, hint and a few examples."""

    kind: str
    reason: str
    hint: str
    count: int = 0
    examples: list[dict[str, str]] = field(default_factory=list)


class UnattributedTally:
    """Count the signals that name no workload by ``(kind, reason)``, keeping a few examples."""

    def __init__(self) -> None:
        self.by_reason: dict[tuple[str, str], UnattributedReason] = {}

    def add(self, signal: Signal) -> None:
        """Count one unattributed signal under its reason; keep it as an example if room."""
        reason, hint = why_unattributed(signal)
        key = (signal.kind.value, reason)
        entry = self.by_reason.get(key)
        if entry is None:
            entry = self.by_reason[key] = UnattributedReason(key[0], reason, hint)
        entry.count += 1
        if len(entry.examples) < EXAMPLES_KEPT:
            entry.examples.append(_example(signal))

    def reasons(self) -> list[UnattributedReason]:
        """Return the reasons, most signals first (GPU OOMs before other kinds on a tie)."""
        return sorted(
            self.by_reason.values(),
            key=lambda r: (r.kind != SignalKind.GPU_OOM.value, -r.count, r.kind, r.reason),
        )


def why_unattributed(signal: Signal) -> tuple[str, str]:
    """Return ``(reason, hint)``: why ``signal`` names no workload and what would tie it."""
    if signal.kind is SignalKind.LB_RESPONSE and not signal.attrs.get("sidecar"):
        if not signal.attrs.get("upstream"):
            return NO_UPSTREAM, _NO_UPSTREAM_HINT
        return "upstream matches no workload", _UPSTREAM_HINT
    if signal.kind is SignalKind.GPU_MEMORY:
        hint = _GPU_MEMORY_HINT
    else:
        hint = _POD_STATE_HINT if signal.kind in _POD_STATE_KINDS else _LOG_HINT
    if not signal.namespace and not signal.pod:
        return "no namespace and no pod", hint
    if not signal.namespace:
        return "no namespace", hint
    return "no pod", hint


def _example(signal: Signal) -> dict[str, str]:
    """Return where ``signal`` came from and what it named (pod, upstream, GPU, node)."""
    example = {"source": str(signal.source)}
    for name, value in (
        ("pod", signal.pod),
        ("node", signal.node),
        ("upstream", signal.attrs.get("upstream")),
        ("gpu", signal.attrs.get("uuid") or signal.attrs.get("gpu")),
    ):
        if value is not None and value != "":
            example[name] = str(value)[:256]
    return example
