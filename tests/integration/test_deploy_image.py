"""The image of deploy/Dockerfile, built and run for real with dockerd (Debian ``docker.io``).

The container runs with ``--network host`` (loopback only), ``--read-only`` and a tmpfs on /tmp,
against the test broker (Tansu) and the machine's PostgreSQL: ``detector migrate``, then
``detector run`` consumes the bundled cascade and its incident is in PostgreSQL; ``detector
serve`` answers /healthz and /readyz. Without docker the tests skip, except under CI (env ``CI``
set), where they fail: ``make services`` installs docker.io and starts dockerd.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import NoReturn

import pytest
from image_build import build_image
from kafka_helpers import (
    CASCADE,
    STREAMS,
    WAIT_S,
    incidents_in,
    produce,
    stop,
    topics_of,
    unique_prefix,
    wait_committed,
)

UID = 10001  # the Dockerfile's user
# what a secret looks like in an image's history or config: Slack tokens, a URL with a
# password, a variable named like a secret that has a value
SECRET_SHAPES = re.compile(
    r"xox[abposr]-|xapp-|://[^/\s:@]+:[^/\s@]+@|(?:SECRET|TOKEN|PASSWORD)[A-Z_]*=\S", re.I
)


def _unavailable(message: str) -> NoReturn:
    """Skip, or fail under CI (env ``CI`` set), when docker cannot build or run images."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; CI must run the image tests (make services starts dockerd)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def docker() -> str:
    """Return the docker client's path when its daemon answers."""
    client = shutil.which("docker")
    if client is None:
        _unavailable("docker is not installed")
    probe = subprocess.run([client, "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        _unavailable(f"dockerd does not answer: {probe.stderr.strip()[:300]}")
    return client


@pytest.fixture(scope="module")
def image(docker: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Build the image (cached base, wheels and layers); print its size."""
    tag = build_image(docker, tmp_path_factory.mktemp("image"))
    size = int(_docker(docker, "image", "inspect", "--format", "{{.Size}}", tag).strip())
    print(f"\nimage {tag}: {size / 2**20:.0f} MiB")
    return tag


def _docker(docker: str, *args: str) -> str:
    done = subprocess.run([docker, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"docker {args[0]} failed: {done.stderr}"
    return done.stdout


def _run_args(docker: str, name: str) -> list[str]:
    """Return the ``docker run`` prefix every test uses: host network, read-only root."""
    return [
        docker,
        "run",
        "--rm",
        "--name",
        name,
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--pull",
        "never",
    ]


def _python_in(docker: str, name: str, image: str, code: str) -> str:
    """Run ``code`` with the image's python3 in a read-only container; return its output."""
    return _docker(
        docker, *_run_args(docker, name)[1:], "--entrypoint", "python3", image, "-c", code
    )


@pytest.fixture
def container_name(docker: str) -> Iterator[str]:
    """Yield a fresh container name; remove the container after the test."""
    name = f"detector-test-{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run([docker, "rm", "-f", name], capture_output=True, check=False)


def test_image_runs_as_non_root_on_a_read_only_root(
    docker: str, image: str, container_name: str
) -> None:
    config = json.loads(_docker(docker, "image", "inspect", image))[0]["Config"]
    assert config["Entrypoint"] == ["detector"]
    assert config["User"] == f"{UID}:{UID}"
    assert "/healthz" in " ".join(config["Healthcheck"]["Test"])
    assert config["Labels"]["org.opencontainers.image.title"] == "gpu-oom-detector"
    probe = (
        "import os, pathlib\n"
        "print(os.getuid(), os.getgid())\n"
        "for p in ('/probe', '/opt/detector/probe', '/tmp/probe', '/data/probe'):\n"
        "    try:\n"
        "        pathlib.Path(p).write_text('x'); print(p, 'writable')\n"
        "    except OSError:\n"
        "        print(p, 'read-only')\n"
    )
    out = _python_in(docker, container_name, image, probe)
    assert out.splitlines() == [
        f"{UID} {UID}",
        "/probe read-only",
        "/opt/detector/probe read-only",
        "/tmp/probe writable",
        "/data/probe writable",  # the anonymous volume of VOLUME /data
    ]


def test_image_carries_no_compiler_no_pip_and_no_tests(
    docker: str, image: str, container_name: str
) -> None:
    probe = (
        "import shutil, importlib.util, pathlib\n"
        "print([c for c in ('gcc', 'cc', 'pip', 'pip3') if shutil.which(c)])\n"
        "print(importlib.util.find_spec('pip') is not None)\n"
        "print(sorted(str(p) for p in pathlib.Path('/opt/detector').rglob('tests')))\n"
    )
    out = _python_in(docker, container_name, image, probe)
    assert out.splitlines() == ["[]", "False", "[]"]


def _migrate(docker: str, image: str, name: str, db_url: str) -> None:
    """Run ``detector migrate`` in a container of the image."""
    args = [*_run_args(docker, name), image, "migrate", "--db", db_url]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_migrate_then_run_puts_the_cascade_incident_in_postgres(
    docker: str,
    image: str,
    container_name: str,
    kafka_bootstrap: str,
    postgres_url: str,
    tmp_path: Path,
) -> None:
    _migrate(docker, image, f"{container_name}-migrate", postgres_url)
    prefix = unique_prefix()
    expected = {
        f"{prefix}-{suffix}": produce(kafka_bootstrap, f"{prefix}-{suffix}", CASCADE / name)
        for name, suffix in STREAMS.items()
    }
    log = tmp_path / "run.log"
    options = {
        "--db": postgres_url,
        "--bootstrap": kafka_bootstrap,
        "--topics": ",".join(topics_of(prefix)),
        "--group": f"{prefix}-group",
        "--dead-letter-topic": f"{prefix}-dead-letters",
        "--fetch-max-wait-ms": "20",
        "--session-timeout-ms": "6000",
        "--max-poll-interval-ms": "10000",
    }
    args = [*_run_args(docker, container_name), image, "run", "-v", *chain(*options.items())]
    with log.open("ab") as out:  # the docker client passes SIGTERM on to the container
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_committed(kafka_bootstrap, prefix, expected, proc)
    finally:
        status = stop(proc)
    assert status == 0, log.read_text()
    incidents = incidents_in(postgres_url)
    assert len(incidents) == 1, log.read_text()
    assert len(incidents[0]["pods"]) == 4
    assert incidents[0]["stage"] in ("cascading", "contained", "resolved")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serve_answers_healthz_and_readyz(
    docker: str, image: str, container_name: str, postgres_url: str, tmp_path: Path
) -> None:
    _migrate(docker, image, f"{container_name}-migrate", postgres_url)
    port = _free_port()
    args = [
        *_run_args(docker, container_name),
        "-e",
        "DETECTOR_WEB__HOST=127.0.0.1",
        image,
        "serve",
        "--db",
        postgres_url,
        "--port",
        str(port),
    ]
    log = tmp_path / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                health = _get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
        ready = _get(f"http://127.0.0.1:{port}/readyz")
    finally:
        stop(proc)
    assert health == (200, '{"status":"ok"}')
    assert ready == (200, '{"status":"ready"}')


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_no_secret_in_the_image_history_or_config(docker: str, image: str) -> None:
    history = _docker(docker, "history", "--no-trunc", "--format", "{{.CreatedBy}}", image)
    config = json.loads(_docker(docker, "image", "inspect", image))[0]["Config"]
    assert "COPY" in history or "copy" in history  # the history is the build's own
    found = SECRET_SHAPES.findall(history + "\n" + "\n".join(config["Env"] or []))
    assert found == []


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("ENV DETECTOR_SLACK__BOT_TOKEN=xoxb-1-2", True),
        ("ENV DETECTOR_DATABASE__URL=postgresql://u:pw@db/x", True),
        ("ARG SIGNING_SECRET=abc", True),
        ("ENV DETECTOR_DATABASE__URL=sqlite:////data/detector.db", False),
        ("HEALTHCHECK CMD python3 -c urlopen('http://127.0.0.1:8080/healthz')", False),
    ],
)
def test_the_secret_shapes_catch_what_they_should(text: str, secret: bool) -> None:
    assert bool(SECRET_SHAPES.search(text)) is secret
