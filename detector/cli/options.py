"""Command-line options that several commands share (Typer ``Annotated`` types), so that each
reads, and documents, the same way everywhere: the workload map and the identity of plain-text
log lines (``detector.events.detect.LogIdentity``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

WorkloadsFile = Annotated[
    Path | None, typer.Option(help="YAML mapping of upstream names to workloads")
]
Namespace = Annotated[
    str | None, typer.Option(help="namespace of plain-text log lines (with --pod)")
]
Pod = Annotated[str | None, typer.Option(help="pod that wrote plain-text log lines")]
Container = Annotated[str | None, typer.Option(help="container of plain-text lines")]
Owner = Annotated[str | None, typer.Option(help="owner of --pod: NAME (Deployment) or KIND/NAME")]
