"""End-to-end fixtures: RBAC and the admission policies installed once; every test starts
from an empty cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from tests.e2e.harness import install_policies, install_rbac, reset_cluster


@pytest.fixture(scope="session")
def sdg_rbac(control_plane: ControlPlane) -> ControlPlane:
    install_rbac(control_plane)
    install_policies(control_plane)
    return control_plane


@pytest.fixture
async def cluster(sdg_rbac: ControlPlane, client: Client) -> AsyncIterator[ControlPlane]:
    """The control plane with SDG's RBAC, emptied of groups, nodes and claims around the test."""
    await reset_cluster(client, sdg_rbac)
    yield sdg_rbac
    await reset_cluster(client, sdg_rbac)
