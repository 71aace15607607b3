"""Build the detector's image (deploy/Dockerfile) for the tests, offline, with caches.

No image registry is reachable here, so the base image is a Debian bookworm rootfs made with
``debootstrap --variant=minbase`` from the apt mirror of this machine, loaded with
``docker import`` (built once, kept as ``BASE_TAG``). The wheels come from a wheelhouse built on
the host with ``pip wheel`` (the build container has no route to the package index), cached by
the hash of the dependency list, and copied into a throw-away build context: the checkout
itself is never written to. Docker's layer cache makes a rebuild with unchanged sources quick.
debootstrap: https://manpages.debian.org/bookworm/debootstrap/debootstrap.8.en.html
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE_TAG = "gpu-oom-detector-test-base:bookworm"
IMAGE_TAG = "gpu-oom-detector:test"
SUITE = "bookworm"
BASE_PACKAGES = "python3,python3-venv"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# what the build context copy leaves out before .dockerignore has its say
NOT_COPIED = (".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis")


def cache_dir() -> Path:
    """Return the tests' cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = root / "gpu-oom-detector-tests"
    path.mkdir(parents=True, exist_ok=True)
    return path


def apt_mirror(sources: tuple[Path, ...] = ()) -> str:
    """Return the Debian mirror this machine's apt uses (its first non-security URI).

    Reads one-line ``deb URI SUITE ...`` entries and deb822 ``URIs:`` fields.
    """
    paths = sources or (
        Path("/etc/apt/sources.list"),
        *sorted(Path("/etc/apt/sources.list.d").glob("*")),
    )
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for match in re.finditer(r"^(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", text, re.M):
            uri = match.group(1)
            if "debian" in uri and "security" not in uri:
                return uri
    return DEFAULT_MIRROR


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; raise RuntimeError with its output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} ... exited {done.returncode}:\n{done.stderr}")
    return done


def has_image(docker: str, tag: str) -> bool:
    """Return True when the daemon holds ``tag``."""
    probe = [docker, "image", "inspect", tag]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def ensure_base(docker: str, work: Path) -> str:
    """Import the debootstrap base image unless it is there already; return its tag."""
    if has_image(docker, BASE_TAG):
        return BASE_TAG
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    rootfs = work / "rootfs"
    try:
        run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                SUITE,
                str(rootfs),
                apt_mirror(),
            ]
        )
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / cache, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run(
            [docker, "import", "-", BASE_TAG], stdin=tar.stdout, capture_output=True, check=False
        )
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise RuntimeError(f"docker import failed: {imported.stderr.decode(errors='replace')}")
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return BASE_TAG


def dependencies() -> list[str]:
    """Return the project's runtime requirements (pyproject.toml ``[project] dependencies``)."""
    with (REPO / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def wheelhouse() -> Path:
    """Build (once per dependency list) the wheels of the runtime requirements on the host."""
    deps = dependencies()
    digest = hashlib.sha256("\n".join(deps).encode()).hexdigest()[:16]
    path = cache_dir() / f"wheelhouse-{digest}"
    if not (path / ".complete").exists():
        shutil.rmtree(path, ignore_errors=True)
        run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(path), *deps])
        (path / ".complete").touch()
    return path


def build_context(work: Path, wheels: Path) -> Path:
    """Copy the checkout (less VCS and caches) and the wheels into a build context."""
    context = work / "context"
    shutil.copytree(
        REPO,
        context,
        ignore=shutil.ignore_patterns(*NOT_COPIED, "__pycache__", "*.pyc", "*.db", "*.egg-info"),
    )
    for wheel in wheels.glob("*.whl"):
        shutil.copy2(wheel, context / "deploy" / "wheelhouse" / wheel.name)
    return context


def build_image(docker: str, work: Path) -> str:
    """Build ``IMAGE_TAG`` from deploy/Dockerfile on the imported base, offline; return it."""
    base = ensure_base(docker, work)
    before = _image_id(docker, IMAGE_TAG)
    context = build_context(work, wheelhouse())
    try:
        run(
            [
                docker,
                "build",
                "-q",
                "-f",
                str(context / "deploy" / "Dockerfile"),
                "--build-arg",
                f"BASE={base}",
                "--build-arg",
                "PIP_NO_INDEX=1",
                "-t",
                IMAGE_TAG,
                str(context),
            ],
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )
    finally:
        shutil.rmtree(context, ignore_errors=True)
    if before and before != _image_id(docker, IMAGE_TAG):  # the last build's, now untagged
        subprocess.run([docker, "image", "rm", before], capture_output=True, check=False)
    return IMAGE_TAG


def _image_id(docker: str, tag: str) -> str:
    """Return the id of the image ``tag`` names ("" when none)."""
    probe = [docker, "image", "inspect", "--format", "{{.Id}}", tag]
    done = subprocess.run(probe, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""
