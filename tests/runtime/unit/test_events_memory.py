"""What an EventRecorder keeps per object under churn (issue 24): its aggregation keys go
when the object is deleted, expire after the window, and never exceed ``max_keys``; an
idle key holds no lock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from sdgruntime import events
from sdgruntime.envtest.fakeclient import Action, FakeClient
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import Kind
from tests.runtime.helpers import as_client

pytestmark = pytest.mark.anyio


class Client(FakeClient):
    """An API server that takes every Event at a checkpoint (so writes interleave) and
    keeps the patches' bodies."""

    def __init__(self) -> None:
        super().__init__()
        self.patched: list[tuple[str, Any]] = []

    @property
    def created(self) -> list[Action]:
        return [a for a in self.actions if a.verb == "create"]

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], namespace: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return await super().create(kind, obj, namespace, **kw)

    async def patch(
        self, kind: Kind, name: str, body: Any, namespace: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        self.patched.append((name, body))
        return await super().patch(kind, name, body, namespace, **kw)


def pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{i}", "namespace": "ns", "uid": f"uid-{i}"},
    }


def recorder(client: Client, **kwargs: Any) -> EventRecorder:
    return EventRecorder(as_client(client), "test", **kwargs)


async def test_deleting_objects_drops_their_keys_and_the_book_is_back_to_empty() -> None:
    client = Client()
    rec = recorder(client)
    for i in range(300):
        await rec.event(pod(i), "Normal", "Scheduled", f"assigned ns/p-{i} to node-1")
        await rec.event(pod(i), "Normal", "Started", "started")
    assert len(rec) == 600
    for i in range(300):
        rec.forget(pod(i))
    assert len(rec) == 0
    assert rec._keys_of == {}
    assert len(client.created) == 600


async def test_an_event_about_a_deleted_object_is_written_but_not_kept() -> None:
    client = Client()
    rec = recorder(client)
    rec.forget(pod(1))  # deleted before the reconcile that saw it last reports
    await rec.event(pod(1), "Normal", "PodsLeft", "pods left: a")
    assert len(client.created) == 1
    assert len(rec) == 0
    # Remembered deletions are bounded too.
    for i in range(events.GONE_KEPT + 100):
        rec.forget(pod(1000 + i))
    assert len(rec._gone) == events.GONE_KEPT


async def test_repeats_of_a_live_object_still_aggregate() -> None:
    client = Client()
    rec = recorder(client)
    for _ in range(3):
        await rec.event(pod(1), "Warning", "Unschedulable", "no node")
    assert len(client.created) == 1
    assert [body["count"] for _, body in client.patched] == [2, 3]
    rec.forget(pod(2))  # another object's deletion leaves it alone
    await rec.event(pod(1), "Warning", "Unschedulable", "no node")
    assert len(client.created) == 1 and len(client.patched) == 3


async def test_keys_past_the_window_are_dropped_when_new_ones_come() -> None:
    client = Client()
    rec = recorder(client, window=0.2)
    for i in range(50):
        await rec.event(pod(i), "Normal", "Scheduled", "x")
    assert len(rec) == 50
    await anyio.sleep(0.3)
    await rec.event(pod(99), "Normal", "Scheduled", "x")
    assert len(rec) == 1
    assert list(rec._keys_of) == ["uid-99"]


async def test_the_keys_are_an_lru_of_max_keys() -> None:
    rec = recorder(Client(), max_keys=64)
    for i in range(500):
        await rec.event(pod(i), "Normal", "Scheduled", "x")
    assert len(rec) == 64
    assert sorted(rec._keys_of) == sorted(f"uid-{i}" for i in range(436, 500))


async def test_idle_keys_hold_no_lock_and_concurrent_repeats_share_one() -> None:
    client = Client()
    rec = recorder(client)
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(rec.event, pod(1), "Normal", "Scheduled", "x")
        for i in range(2, 50):
            tg.start_soon(rec.event, pod(i), "Normal", "Scheduled", "x")
    assert len(client.created) == 49  # the 5 repeats: one create, then patches
    assert [body["count"] for _, body in client.patched] == [2, 3, 4, 5]
    assert all(seen.lock is None and seen.users == 0 for seen in rec._seen.values())
