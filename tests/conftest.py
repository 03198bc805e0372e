"""Shared fixtures: the anyio backend and the real local control plane (sdgruntime.envtest)."""

from __future__ import annotations

import pytest

pytest_plugins = ["sdgruntime.envtest.pytest_plugin"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"
