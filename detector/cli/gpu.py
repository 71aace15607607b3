"""``detector gpu-sample``: GPU memory through NVML, printed as nvidia-smi CSV lines.

The output is what ``nvidia-smi --query-gpu=timestamp,index,uuid,memory.used,memory.total
--format=csv`` prints per GPU (``detector.gpu.sample``), so a file of it replays with
``detector replay`` and ships to the ``gpu-metrics`` topic with ``detector produce``. With
``--namespace`` and ``--pod`` every line ends in ``namespace=NS, pod=POD`` fields, which the
nvidia-smi parser reads as the line's pod.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from typing import Annotated, NoReturn

import typer

from detector.cli.exits import interruptible
from detector.gpu.nvml import GpuError, Nvml, open_nvml
from detector.gpu.sample import sample_lines

DEFAULT_INTERVAL_S = 5.0  # nvidia-smi -l's default
# A node name the nvidia-smi parser reads as one: lower-case RFC 1123, with a letter in it.
NODE_NAME = re.compile(r"(?=[a-z0-9.-]*[a-z])[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
# Kubernetes names: a namespace is an RFC 1123 label, a pod name an RFC 1123 subdomain.
NAMESPACE_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
POD_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
NO_DRIVER_HINT = (
    "no NVIDIA driver reachable here: run it on a GPU node (in Kubernetes, in a pod with the "
    "NVIDIA container runtime)"
)


@interruptible
def gpu_sample_cmd(
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval", min=0.0, help="seconds between samples (default 5; alone: endless)"
        ),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option(
            "--count", min=1, help="samples to take (default: 1; endless with --interval)"
        ),
    ] = None,
    node: Annotated[
        str | None, typer.Option("--node", help="node name to put first on every line")
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="namespace of the pod that owns the GPUs")
    ] = None,
    pod: Annotated[
        str | None, typer.Option("--pod", help="pod that owns the GPUs (with --namespace)")
    ] = None,
) -> None:
    """Print GPU memory as nvidia-smi --query-gpu CSV lines, one per GPU per sample.

    Without --interval and --count: one sample, like nvidia-smi without -l. With --interval
    alone: until interrupted, like nvidia-smi -l. Times are UTC.

    The lines name a GPU (UUID) and, with --node, its node. With --namespace and --pod (run
    as a sidecar of the pod that owns every GPU it sees, or on a node with one GPU pod) they
    also name that pod, so its GPU memory counts toward its incidents; without them a replay
    reports the lines as unattributed GPU memory.
    """
    if node is not None and NODE_NAME.fullmatch(node) is None:
        typer.echo(f"error: --node {node!r} is not a lower-case host name", err=True)
        raise typer.Exit(2)
    owner = _owner(namespace, pod)
    if count is None and interval is None:
        count = 1
    try:
        nvml = open_nvml()
    except GpuError as exc:
        _fail(exc)
    try:
        interval_s = DEFAULT_INTERVAL_S if interval is None else interval
        _print_samples(nvml, count, interval_s, node, owner)
    except GpuError as exc:
        _fail(exc)
    finally:
        _close(nvml)


def _owner(namespace: str | None, pod: str | None) -> tuple[str, str] | None:
    """Return (namespace, pod) from the options; exit 2 on half a pod or a bad name."""
    if namespace is None and pod is None:
        return None
    if namespace is None or pod is None:
        typer.echo("error: --namespace and --pod go together", err=True)
        raise typer.Exit(2)
    if NAMESPACE_NAME.fullmatch(namespace) is None:
        typer.echo(f"error: --namespace {namespace!r} is not a Kubernetes namespace", err=True)
        raise typer.Exit(2)
    if POD_NAME.fullmatch(pod) is None:
        typer.echo(f"error: --pod {pod!r} is not a Kubernetes pod name", err=True)
        raise typer.Exit(2)
    return namespace, pod


def _print_samples(
    nvml: Nvml,
    count: int | None,
    interval_s: float,
    node: str | None,
    owner: tuple[str, str] | None,
) -> None:
    try:
        for line in sample_lines(
            nvml,
            count=count,
            interval_s=interval_s,
            clock=time.time,
            sleep=time.sleep,
            node=node,
            pod=owner,
        ):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()  # a pipe to a file or a shipper sees each sample at once
    except KeyboardInterrupt:
        pass  # Ctrl-C ends an endless sampler
    except BrokenPipeError:  # the reader went away (| head): stop, and flush nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _close(nvml: Nvml) -> None:
    with contextlib.suppress(GpuError):  # nothing left to release
        nvml.close()


def _fail(exc: GpuError) -> NoReturn:
    hint = f"; {NO_DRIVER_HINT}" if exc.reason == "NVML_ERROR_LIBRARY_NOT_FOUND" else ""
    typer.echo(f"error: cannot read the GPUs through NVML: {exc}{hint}", err=True)
    raise typer.Exit(2) from exc
