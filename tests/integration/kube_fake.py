"""The Kubernetes API stand-in (``detector.sim.kube_api``) as fixtures for the actuators' tests.

The ``kube`` fixture serves a ``FakeKube`` on a free loopback port and checks that every call it
saw is granted by deploy/rbac.yaml, and records the calls of each test so that
``check_every_granted_call`` can tell that the tests together make every call the actuators
may make. A module uses the fixtures by importing them (and naming them in ``__all__``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import ModuleType

import pytest
from kubernetes import client

from detector.actuators.kubernetes.actuator import RBAC_PERMISSIONS
from detector.actuators.kubernetes.api import ACTUATOR_PERMISSIONS, KubeApi, Permission
from detector.sim.kube_api import MANAGER, MERGE, SMP, Recorded, serving, write_kubeconfig
from detector.sim.kube_api import KubeStandIn as FakeKube

__all__ = ["MANAGER", "MERGE", "SMP", "FakeKube", "Recorded", "write_kubeconfig"]
_ALL_REQUESTS: dict[tuple[str, str], list[Recorded]] = {}


@pytest.fixture
def kube(request: pytest.FixtureRequest) -> Iterator[FakeKube]:
    """Serve a FakeKube on a free loopback port; check every call it saw is granted."""
    fake = FakeKube()
    with serving(fake):
        try:
            yield fake
        finally:
            _ALL_REQUESTS[(request.module.__name__, request.function.__name__)] = list(fake.history)
    for seen in fake.history:
        assert permission_of(seen) in ACTUATOR_PERMISSIONS, seen


@pytest.fixture
def api(kube: FakeKube) -> Iterator[KubeApi]:
    """Return a KubeApi whose real ``kubernetes`` client talks to the fake (1 s timeout)."""
    config = client.Configuration(host=kube.url)
    config.retries = 0
    api_client = client.ApiClient(config)
    try:
        yield KubeApi(api_client, timeout_s=1.0)
    finally:
        api_client.close()


def permission_of(seen: Recorded) -> Permission:
    """Return the RBAC grant a recorded request needs."""
    parts = seen.path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    plural, named, sub = rest[2], len(rest) > 3, rest[4] if len(rest) > 4 else ""
    if sub:
        return Permission(group, f"{plural}/{sub}", "create")
    verb = {"GET": "get" if named else "list", "PATCH": "patch", "DELETE": "delete"}
    return Permission(group, plural, verb.get(seen.method, "create"))


def check_every_granted_call(*modules: ModuleType) -> None:
    """Assert the ``kube`` tests of ``modules`` together made every call the actuators may make.

    Skips unless every one of those tests ran in this session (a partial run proves nothing).
    """
    tests = {
        (module.__name__, name)
        for module in modules
        for name, fn in vars(module).items()
        if name.startswith("test_") and callable(fn) and "kube" in inspect.signature(fn).parameters
    }
    if not tests <= _ALL_REQUESTS.keys():
        pytest.skip("needs every test of the Kubernetes actuator modules in the same run")
    used = {permission_of(r) for key in tests for r in _ALL_REQUESTS[key]}
    assert used == ACTUATOR_PERMISSIONS
    assert ACTUATOR_PERMISSIONS <= RBAC_PERMISSIONS
