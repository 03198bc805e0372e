"""pytest fixtures for integration tests against the real local control plane.

Enable with ``pytest_plugins = ["sdgruntime.envtest.pytest_plugin"]`` in a conftest.
The control plane is started once per session; every test gets its own namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sdgruntime.envtest.controlplane import ControlPlane, ControlPlaneError

if TYPE_CHECKING:
    from sdgruntime.client import Client


def _crd_dir(config: pytest.Config) -> list[Path]:
    crd = Path(config.rootpath) / "config" / "crd"
    return [crd] if crd.is_dir() else []


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A started etcd + kube-apiserver with the project's CRDs installed."""
    with ControlPlane(crd_paths=_crd_dir(request.config)) as cp:
        yield cp


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> str:
    """Path of an admin (system:masters) kubeconfig for the session's control plane."""
    return str(control_plane.kubeconfig_path)


@pytest.fixture
async def client(kubeconfig: str) -> AsyncIterator[Client]:
    """An admin ``sdgruntime.client.Client``, closed after the test."""
    from sdgruntime.client import Client

    async with Client.from_kubeconfig(kubeconfig) as c:
        yield c


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace; its pods are force-deleted and the namespace deleted afterwards.

    No namespace controller runs here, so the namespace itself may stay Terminating;
    its name is unique, so that does not leak into other tests.
    """
    name = f"t-{uuid.uuid4().hex[:10]}"
    r = control_plane.http.post(
        "/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    if r.status_code != 201:
        raise ControlPlaneError(f"create namespace {name}: {r.status_code} {r.text}")
    yield name
    control_plane.http.delete(f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": 0})
    control_plane.http.delete(f"/api/v1/namespaces/{name}")
