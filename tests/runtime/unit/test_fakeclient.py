"""envtest's FakeClient keeps the API server's write rules a reconciler relies on:
resourceVersion conflicts, UID preconditions, the status subresource, finalizers, label
and field selectors, watches from a version (410 when too old), binds, and a record of
what was written."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import anyio
import pytest

from sdgruntime import errors
from sdgruntime.envtest import FakeClient
from sdgruntime.envtest.fakeclient import parse_label_selector
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS, Kind

pytestmark = pytest.mark.anyio

WIDGETS = Kind("example.com", "v1", "Widget", "widgets", namespaced=True)


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "data": data}


async def test_create_get_and_a_stale_update_conflicts() -> None:
    client = FakeClient()
    made = await client.create(CONFIGMAPS, cm("a", x="1"))
    assert made["kind"] == "ConfigMap" and made["metadata"]["uid"]
    with pytest.raises(errors.AlreadyExists):
        await client.create(CONFIGMAPS, cm("a"))
    fresh = await client.get(CONFIGMAPS, "a", "ns")
    fresh["data"]["x"] = "2"
    updated = await client.update(CONFIGMAPS, fresh)
    assert int(updated["metadata"]["resourceVersion"]) > int(made["metadata"]["resourceVersion"])
    made["data"]["x"] = "3"  # written from the old copy
    with pytest.raises(errors.Conflict, match="has been modified"):
        await client.update(CONFIGMAPS, made)
    assert (await client.get(CONFIGMAPS, "a", "ns"))["data"] == {"x": "2"}
    with pytest.raises(errors.NotFound):
        await client.get(CONFIGMAPS, "b", "ns")


async def test_a_merge_patch_with_another_uid_is_refused() -> None:
    client = FakeClient([(CONFIGMAPS, cm("a", x="1"))])
    uid = (await client.get(CONFIGMAPS, "a", "ns"))["metadata"]["uid"]
    with pytest.raises(errors.Conflict, match="Precondition failed: uid"):
        await client.patch(
            CONFIGMAPS, "a", {"metadata": {"uid": "other"}, "data": {"x": "2"}}, "ns"
        )
    out = await client.patch(CONFIGMAPS, "a", {"metadata": {"uid": uid}, "data": {"y": "2"}}, "ns")
    assert out["data"] == {"x": "1", "y": "2"}
    out = await client.patch(CONFIGMAPS, "a", {"data": {"x": None}}, "ns")
    assert out["data"] == {"y": "2"}
    out = await client.patch(
        CONFIGMAPS,
        "a",
        [
            {"op": "test", "path": "/data/y", "value": "2"},
            {"op": "add", "path": "/data/z", "value": "3"},
        ],
        "ns",
        patch_type="json",
    )
    assert out["data"] == {"y": "2", "z": "3"}
    with pytest.raises(errors.Invalid, match="test failed"):
        await client.patch(
            CONFIGMAPS,
            "a",
            [{"op": "test", "path": "/data/y", "value": "9"}],
            "ns",
            patch_type="json",
        )


async def test_status_is_a_subresource_where_declared() -> None:
    client = FakeClient(status_subresource=[WIDGETS])
    w = await client.create(
        WIDGETS,
        {
            "metadata": {"name": "w", "namespace": "ns"},
            "spec": {"size": 1},
            "status": {"ready": True},
        },
    )
    assert "status" not in w  # dropped on create, as the server does
    w["status"] = {"ready": True}
    w["spec"]["size"] = 2
    w = await client.update(WIDGETS, w)
    assert "status" not in w and w["spec"]["size"] == 2 and w["metadata"]["generation"] == 2
    w = await client.patch(
        WIDGETS, "w", {"status": {"ready": True}, "spec": {"size": 3}}, "ns", subresource="status"
    )
    assert w["status"] == {"ready": True} and w["spec"]["size"] == 2  # only status changed
    assert w["metadata"]["generation"] == 2  # a status write is no new generation


async def test_finalizers_hold_a_delete_until_they_are_removed() -> None:
    client = FakeClient()
    obj = cm("a")
    obj["metadata"]["finalizers"] = ["example.com/keep"]
    made = await client.create(CONFIGMAPS, obj)
    with pytest.raises(errors.Conflict, match="uid"):
        await client.delete(CONFIGMAPS, "a", "ns", uid="other")
    marked = await client.delete(CONFIGMAPS, "a", "ns", uid=made["metadata"]["uid"])
    assert marked["metadata"]["deletionTimestamp"]
    assert (await client.get(CONFIGMAPS, "a", "ns"))["metadata"]["deletionTimestamp"]
    await client.patch(CONFIGMAPS, "a", {"metadata": {"finalizers": None}}, "ns")
    with pytest.raises(errors.NotFound):
        await client.get(CONFIGMAPS, "a", "ns")


async def test_label_and_field_selectors_filter_lists() -> None:
    client = FakeClient(
        [
            (CONFIGMAPS, cm("a", {"app": "web", "tier": "front"})),
            (CONFIGMAPS, cm("b", {"app": "db"})),
            (CONFIGMAPS, cm("c")),
        ]
    )

    async def names(**kw: Any) -> list[str]:
        return [i["metadata"]["name"] for i in (await client.list(CONFIGMAPS, "ns", **kw))["items"]]

    assert await names(label_selector="app=web") == ["a"]
    assert await names(label_selector="app in (web, db),!tier") == ["b"]
    assert await names(label_selector="app!=web") == ["b", "c"]
    assert await names(label_selector="app notin (db),app") == ["a"]
    assert await names(field_selector="metadata.name=c") == ["c"]
    with pytest.raises(ValueError, match="malformed label selector"):
        parse_label_selector("app in web")
    with pytest.raises(errors.BadRequest, match="not supported"):
        await names(field_selector="data.x=1")


async def test_binding_sets_the_node_once() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": []}}
    client = FakeClient([(PODS, pod)])
    await client.bind("ns", "p", "n1")
    assert (await client.get(PODS, "p", "ns"))["spec"]["nodeName"] == "n1"
    with pytest.raises(errors.Conflict, match="already assigned"):
        await client.bind("ns", "p", "n2")
    listed = await client.list(PODS, field_selector="spec.nodeName=n1")
    assert [p["metadata"]["name"] for p in listed["items"]] == ["p"]
    assert [a.verb for a in client.writes()] == ["bind", "bind"]


async def test_a_watch_replays_from_a_version_and_follows() -> None:
    client = FakeClient(history=3)
    start = (await client.list(NODES))["metadata"]["resourceVersion"]
    await client.create(NODES, {"metadata": {"name": "n1"}})
    seen: list[tuple[str, str]] = []
    async with aclosing(client.watch(NODES, resource_version=start)) as events:
        async for event in events:
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if len(seen) == 1:
                await client.patch(NODES, "n1", {"metadata": {"labels": {"a": "b"}}})
            elif len(seen) == 2:
                await client.delete(NODES, "n1")
            else:
                break
    assert seen == [("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1")]
    for i in range(4):
        await client.create(NODES, {"metadata": {"name": f"m{i}"}})
    with pytest.raises(errors.Gone):
        async with aclosing(client.watch(NODES, resource_version=start)) as events:
            await anext(events)


async def test_a_watch_waits_for_what_comes() -> None:
    client = FakeClient()
    got: list[str] = []

    async def follow() -> None:
        async with aclosing(client.watch(CONFIGMAPS, "ns")) as events:
            async for event in events:
                got.append(event["object"]["metadata"]["name"])
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await anyio.wait_all_tasks_blocked()  # the watch is waiting
        await client.create(CONFIGMAPS, cm("later"))
    assert got == ["later"]


async def test_a_reaction_answers_before_the_store() -> None:
    """A virtual kind is answered by a reaction, a failure injected by one; a reaction
    that answers None leaves the call to the store; the newest is asked first."""
    client = FakeClient([(CONFIGMAPS, cm("a", x="1"))])
    seen: list[tuple[str, Any]] = []

    def review(action: Any, body: Any) -> dict[str, Any]:
        seen.append((action.verb, body["spec"]["token"]))
        return {**body, "status": {"authenticated": body["spec"]["token"] == "good"}}

    def refuse_updates(action: Any, body: Any) -> None:
        raise errors.Conflict("injected", code=409, reason="Conflict")

    client.react("create", WIDGETS, review)
    client.react("update", CONFIGMAPS, refuse_updates)
    client.react("*", CONFIGMAPS, lambda action, body: None)  # asked first, lets it pass
    answer = await client.create(
        WIDGETS, {"metadata": {"namespace": "ns"}, "spec": {"token": "good"}}
    )
    assert answer["status"] == {"authenticated": True} and seen == [("create", "good")]
    with pytest.raises(errors.NotFound):
        await client.get(WIDGETS, "anything", "ns")  # a reaction stores nothing
    fresh = await client.get(CONFIGMAPS, "a", "ns")
    with pytest.raises(errors.Conflict, match="injected"):
        await client.update(CONFIGMAPS, {**fresh, "data": {"x": "2"}})
    assert client.stored(CONFIGMAPS, "a", "ns")["data"] == {"x": "1"}
    assert [a.verb for a in client.actions] == ["create", "get", "get", "update"]
