"""The pod webhook's group lookup: cache first, the API server when the cache cannot say."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.cache import CacheNotSynced
from sdgruntime.kinds import Kind
from webhooks.podmutator import PodMutator

pytestmark = pytest.mark.anyio

BOUND = {
    "metadata": {"name": "g"},
    "spec": {"resources": {"nvidia.com/gpu": 1}},
    "status": {"phase": "Bound", "nodeName": "n1", "selectedDevices": {"nvidia.com/gpu": "0"}},
}


class UnsyncedCache:
    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        raise CacheNotSynced(f"the cache of {kind.name} has not synced yet")


class LiveClient:
    def __init__(self, groups: dict[str, dict[str, Any]]) -> None:
        self.groups = groups
        self.gets: list[str] = []

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        assert kind == SDG_KIND
        self.gets.append(name)
        if name not in self.groups:
            raise errors.NotFound(f"{name} not found")
        return self.groups[name]


async def test_unsynced_cache_falls_back_to_a_live_get() -> None:
    client = LiveClient({"g": BOUND})
    mutator = PodMutator(UnsyncedCache(), client, binding_wait=0)  # type: ignore[arg-type]
    assert await mutator._group("g") == BOUND
    assert await mutator._group("missing") is None
    assert client.gets == ["g", "missing"]


async def test_unsynced_cache_while_waiting_keeps_the_live_answer() -> None:
    binding = {"metadata": {"name": "g"}, "status": {}}  # not decided yet: the webhook waits
    mutator = PodMutator(UnsyncedCache(), LiveClient({"g": binding}), binding_wait=0.1)  # type: ignore[arg-type]
    assert await mutator._group("g") == binding
