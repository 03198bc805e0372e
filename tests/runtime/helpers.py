"""What sdgruntime's unit tests share: ``settle()`` (run every other task until all are
blocked), a ConfigMap builder, ``as_client`` (envtest's FakeClient where a Client is
typed) and ``running_cache`` (a real Cache over one). Imports nothing of Shared Device
Group, so SDG's tests may use it too (tests/factories.py re-exports it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import anyio
import anyio.lowlevel
import pytest

from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.envtest import FakeClient
from sdgruntime.kinds import Kind

Obj = dict[str, Any]
C = TypeVar("C", bound=Cache)


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def both_event_loops(request: pytest.FixtureRequest) -> object:
    """An ``anyio_backend`` for transport tests: each runs on asyncio's own loop and on
    uvloop's (the manager's by default), whose transports and TLS are other code. A module
    takes it with ``from tests.runtime.helpers import both_event_loops as anyio_backend``."""
    return request.param


async def settle() -> None:
    """Let every other task run until it blocks: anyio's ``wait_all_tasks_blocked`` without
    its 0.1 s back-off, so tests that step a FakeClock stay fast. A task that never blocks
    fails the test instead of hanging it."""
    me = asyncio.current_task()
    for _ in range(10_000):
        await anyio.lowlevel.checkpoint()
        if all(
            t is me or (t._fut_waiter is not None and not t._fut_waiter.done())  # type: ignore[attr-defined]
            for t in asyncio.all_tasks()
        ):
            return
    raise AssertionError("tasks never blocked: one of them keeps running without waiting")


def configmap(
    name: str,
    namespace: str | None = "ns",
    *,
    data: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
    rv: int | str | None = None,
) -> Obj:
    """A ConfigMap; ``namespace=None`` leaves it out (as a cluster-scoped object has none),
    ``data``/``labels``/``annotations`` only where given."""
    meta: Obj = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if uid is not None:
        meta["uid"] = uid
    if rv is not None:
        meta["resourceVersion"] = str(rv)
    obj: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    if data is not None:
        obj["data"] = dict(data)
    return obj


def as_client(fake: FakeClient) -> Client:
    """``fake`` where code wants a :class:`~sdgruntime.client.Client`. FakeClient has the
    Client's methods without being a subclass, so this is the one cast, instead of a
    ``type: ignore[arg-type]`` at every call."""
    return cast(Client, fake)


@asynccontextmanager
async def running_cache(cache: C, *kinds: Kind, sync_timeout: float = 5.0) -> AsyncIterator[C]:
    """Run ``cache`` (a real one, over a FakeClient) with informers for ``kinds``; yield it
    once they have synced, stop it on exit. A kind read that is not among them is not
    synced: its reads raise CacheNotSynced, as in a manager that is starting."""
    for kind in kinds:
        cache.informer(kind)
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        await cache.wait_for_sync(sync_timeout)
        yield cache
        tg.cancel_scope.cancel()
