"""Streamed lists (a watch with ``sendInitialEvents``) against the real API server: the
same objects as a paged list, a cache that syncs from one and watches on, and a paged list
where the server refuses the stream."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from sdgruntime import errors
from sdgruntime.cache import Cache, KindOptions, ReflectorOptions
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

STREAMED = ReflectorOptions(watch_list=True, backoff_initial=0.1, backoff_max=0.5)


def cm(name: str, value: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"v": value},
    }


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """A transform: only the name and the data."""
    return {"metadata": {"name": obj["metadata"]["name"]}, "data": obj.get("data")}


@contextlib.asynccontextmanager
async def running(cache: Cache) -> AsyncIterator[Cache]:
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        await cache.wait_for_sync(30)
        yield cache
        tg.cancel_scope.cancel()


async def until(cond: Any, what: str) -> None:
    with anyio.fail_after(20, shield=False):
        while not cond():  # noqa: ASYNC110 - plain state the cache reaches
            await anyio.sleep(0.02)
    assert cond(), what


async def test_a_streamed_list_holds_what_a_paged_list_holds(
    client: Client, namespace: str
) -> None:
    for i in range(5):
        await client.create(CONFIGMAPS, cm(f"c{i}"), namespace)
    paged, _ = await client.list_all(CONFIGMAPS, namespace, page_size=2)
    streamed, rv = await client.list_streamed(CONFIGMAPS, namespace, transform=slim)
    assert sorted(o["metadata"]["name"] for o in streamed) == sorted(
        o["metadata"]["name"] for o in paged
    )
    assert all(o == slim(o) for o in streamed)  # transformed as they arrived
    assert int(rv) >= max(int(o["metadata"]["resourceVersion"]) for o in paged)


async def test_a_cache_syncs_from_a_streamed_list_and_watches_on(
    client: Client, namespace: str
) -> None:
    await client.create(CONFIGMAPS, cm("before"), namespace)
    cache = Cache(
        client, by_kind={CONFIGMAPS: KindOptions(namespace=namespace, reflector=STREAMED)}
    )
    added: list[str] = []
    cache.informer(CONFIGMAPS).add_handler(on_add=lambda o: added.append(o["metadata"]["name"]))
    async with running(cache):
        assert added == ["before"]
        await client.create(CONFIGMAPS, cm("after"), namespace)
        await client.patch(CONFIGMAPS, "before", {"data": {"v": "2"}}, namespace)
        await until(lambda: added == ["before", "after"], "the add after the list")
        await until(
            lambda: cache.get(CONFIGMAPS, "before", namespace)["data"] == {"v": "2"},
            "the update after the list",
        )
        assert cache.informer(CONFIGMAPS).reflector.stats.lists == 1


async def test_where_the_server_refuses_a_streamed_list_the_cache_lists_in_pages(
    client: Client, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused: list[str] = []

    async def refuse(kind: Any, *args: Any, **kwargs: Any) -> Any:
        refused.append(kind.name)
        raise errors.Invalid("sendInitialEvents is forbidden for watch", code=422)

    monkeypatch.setattr(client, "list_streamed", refuse)
    await client.create(CONFIGMAPS, cm("there"), namespace)
    cache = Cache(
        client, by_kind={CONFIGMAPS: KindOptions(namespace=namespace, reflector=STREAMED)}
    )
    cache.informer(CONFIGMAPS)
    async with running(cache):
        assert cache.get(CONFIGMAPS, "there", namespace)["data"] == {"v": "1"}
        assert refused == [CONFIGMAPS.name]
