"""Shared fixtures: the anyio backend and the real local control plane (sdgruntime.envtest)."""

from __future__ import annotations

import signal

import pytest

pytest_plugins = ["sdgruntime.envtest.pytest_plugin"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def pytest_configure(config: pytest.Config) -> None:
    """Tests press Ctrl-C (send SIGINT) to the CLI processes they start, and a child
    inherits an ignored SIGINT: a run started as ``make test &`` from a script (which
    ignores SIGINT in background jobs) would time those tests out. Such a run gets SIGINT's
    default back, as in a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
