"""Holder pods: on a node whose GPUs come from a device plugin, a group's devices are the
ones the kubelet gave its holder pod, and they stay in the kubelet's books while the group
lives (the fake kubelet plays the device manager here; tests/realnode proves the same with
a real kubelet and kube-scheduler)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from api.constants import SDG_KIND
from controllers.holders import HOLDER_FOR_ANNOTATION, ROLE_HOLDER, ROLE_LABEL, holder_name
from controllers.inventory import annotation_key
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.fakes import create_node, indexed_devices, make_node
from sdgruntime.kinds import EVENTS, PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    SHARED,
    add_node,
    eventually,
    group,
    kubelet,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

UUIDS = ["GPU-11111111-aaaa", "GPU-22222222-bbbb", "GPU-33333333-cccc", "GPU-44444444-dddd"]


def by_uuid(node: Mapping[str, Any], resource: str) -> Sequence[str] | None:
    """A device plugin with UUID IDs (NVIDIA's default): the node's GPUs by UUID."""
    return UUIDS if resource == GPU else None


async def holder_of(client: Client, name: str) -> dict[str, Any] | None:
    try:
        return await client.get(PODS, holder_name(name), MANAGER_NS)
    except errors.NotFound:
        return None


def condition(g: Mapping[str, Any], type_: str) -> dict[str, Any]:
    conds = (g.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in conds}.get(type_) or {}


async def test_a_group_is_bound_on_the_devices_the_kubelet_gave_its_holder(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "dp-1", 4)
    async with run_sdg(cluster, holders="auto"), kubelet(client, devices=indexed_devices):
        await client.create(SDG_KIND, group("first", {GPU: 2}))
        await client.create(SDG_KIND, group("second", {GPU: 2}))
        first = await wait_bound(client, "first")
        second = await wait_bound(client, "second")
        for g in (first, second):
            name = g["metadata"]["name"]
            holder = await holder_of(client, name)
            assert holder is not None
            given = holder["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]
            ids = sorted(int(r["resourceID"]) for r in given["resources"])
            # The group holds exactly what the kubelet counts for its holder.
            assert g["status"]["selectedDevices"][GPU] == ",".join(map(str, ids))
            meta, spec = holder["metadata"], holder["spec"]
            assert meta["labels"][ROLE_LABEL] == ROLE_HOLDER
            assert meta["annotations"][HOLDER_FOR_ANNOTATION] == name
            owner = meta["ownerReferences"][0]
            assert (owner["kind"], owner["uid"]) == ("SharedDeviceGroup", g["metadata"]["uid"])
            assert spec["nodeName"] == "dp-1"
            assert spec["containers"][0]["resources"]["limits"][GPU] == "2"
            assert spec["tolerations"] == [{"operator": "Exists"}]
            assert spec["priorityClassName"] == "deviceshare-holder"
            assert spec["automountServiceAccountToken"] is False
        a = set(first["status"]["selectedDevices"][GPU].split(","))
        b = set(second["status"]["selectedDevices"][GPU].split(","))
        assert a.isdisjoint(b) and len(a | b) == 4


async def test_uuids_from_the_plugin_are_matched_to_the_nodes_devices(
    cluster: ControlPlane, client: Client
) -> None:
    """NVIDIA's plugin names GPUs by UUID: the node's device annotation says which ID each
    is; the group's physical devices are the holder's."""
    node = make_node("dp-1", labels=SHARED, allocatable={GPU: 4})
    node["metadata"]["annotations"] = {annotation_key(GPU): ",".join(UUIDS)}
    await create_node(client, node)
    async with run_sdg(cluster, holders="auto"), kubelet(client, devices=by_uuid):
        await client.create(SDG_KIND, group("team", {GPU: 3}))
        g = await wait_bound(client, "team")
        holder = await holder_of(client, "team")
        assert holder is not None
        given = holder["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]
        uuids = sorted(r["resourceID"] for r in given["resources"])
        ids = g["status"]["selectedDevices"][GPU].split(",")
        assert sorted(UUIDS[int(i)] for i in ids) == uuids
        assert sorted(g["status"]["physicalDevices"][GPU].split(",")) == uuids


async def test_devices_sdg_cannot_name_keep_the_group_pending_with_the_fix(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "dp-1", 4)  # no annotation: SDG cannot tell which UUID is which
    async with run_sdg(cluster, holders="auto"), kubelet(client, devices=by_uuid):
        await client.create(SDG_KIND, group("team", {GPU: 1}))

        async def pending_with_the_fix() -> str | None:
            message = condition(await client.get(SDG_KIND, "team"), "Scheduled").get("message")
            return message if message and annotation_key(GPU) in message else None

        message = await eventually(pending_with_the_fix, what="a message naming the annotation")
        assert "GPU-" in message
        assert (await client.get(SDG_KIND, "team"))["status"]["phase"] == "Pending"


async def test_a_holder_the_kubelet_refuses_is_replaced_and_the_group_says_why(
    cluster: ControlPlane, client: Client
) -> None:
    """The node's allocatable says 4, but the plugin has only 2 free (taken behind SDG's
    back): the kubelet refuses the holder and the group tells the kubelet's reason."""
    await add_node(client, "dp-1", 4)

    def two(node: Mapping[str, Any], resource: str) -> Sequence[str] | None:
        return ["0", "1"] if resource == GPU else None

    async with run_sdg(cluster, holders="auto"), kubelet(client, devices=two):
        await client.create(SDG_KIND, group("big", {GPU: 3}))

        async def refused() -> str | None:
            message = condition(await client.get(SDG_KIND, "big"), "Scheduled").get("message")
            return message if message and "Allocate failed" in message else None

        await eventually(refused, what="the kubelet's refusal in the group's status")
        holder = await holder_of(client, "big")
        assert holder is None or holder["status"].get("phase") == "Failed"
        assert (await client.get(SDG_KIND, "big"))["status"]["phase"] == "Pending"


async def test_a_lost_holder_is_reported_and_made_again(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "dp-1", 4)
    async with run_sdg(cluster, holders="auto"), kubelet(client, devices=indexed_devices):
        await client.create(SDG_KIND, group("team", {GPU: 2}))
        g = await wait_bound(client, "team")
        first = await holder_of(client, "team")
        assert first is not None
        await client.delete(PODS, holder_name("team"), MANAGER_NS, grace_period_seconds=0)

        async def warned() -> bool:
            events, _ = await client.list_all(EVENTS, "default")
            return any(
                e.get("reason") == "HolderLost" and e["involvedObject"].get("name") == "team"
                for e in events
            )

        await eventually(warned, what="a HolderLost Warning on the group")

        async def made_again() -> dict[str, Any] | None:
            h = await holder_of(client, "team")
            return h if h and h["metadata"]["uid"] != first["metadata"]["uid"] else None

        await eventually(made_again, what="a new holder pod")

        async def ready_again() -> bool:
            now = await client.get(SDG_KIND, "team")
            return condition(now, "Ready").get("status") == "True"

        # The kubelet gave the new holder the same (the only free) devices: Ready again.
        await eventually(ready_again, what="the group Ready again")
        now = await client.get(SDG_KIND, "team")
        assert now["status"]["selectedDevices"] == g["status"]["selectedDevices"]


async def test_deleting_a_group_deletes_its_holder(cluster: ControlPlane, client: Client) -> None:
    await add_node(client, "dp-1", 2)
    async with run_sdg(cluster, holders="auto"), kubelet(client, devices=indexed_devices):
        await client.create(SDG_KIND, group("team", {GPU: 2}))
        await wait_bound(client, "team")
        assert await holder_of(client, "team") is not None
        await client.delete(SDG_KIND, "team")

        async def all_gone() -> bool:
            try:
                await client.get(SDG_KIND, "team")
                return False
            except errors.NotFound:
                return await holder_of(client, "team") is None

        await eventually(all_gone, what="group and holder gone")
        # The devices are free in both books: a new group of 2 binds there.
        await client.create(SDG_KIND, group("next", {GPU: 2}))
        await wait_bound(client, "next")


async def test_with_holders_off_no_holder_is_made(cluster: ControlPlane, client: Client) -> None:
    await add_node(client, "dp-1", 2)
    async with run_sdg(cluster, holders="off"), kubelet(client, devices=indexed_devices):
        await client.create(SDG_KIND, group("team", {GPU: 2}))
        await wait_bound(client, "team")
        assert await holder_of(client, "team") is None


def plain_pod(name: str, gpus: int, node: str = "dp-1") -> dict[str, Any]:
    """A pod outside any group, bound to ``node``, asking the device plugin for GPUs."""
    p = pod(name, None, nodeName=node)
    p["spec"]["containers"][0]["resources"] = {"limits": {GPU: str(gpus)}}
    return p


async def test_plain_pods_the_kubelet_counts_share_the_node_with_groups(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    """The mixed layout: plain pods asking the device plugin for GPUs are in the kubelet's
    books like the holders, so they neither block the node nor flag its groups; placement
    counts the devices they hold."""
    await add_node(client, "dp-1", 4)
    async with run_sdg(cluster, holders="auto"), kubelet(client, devices=indexed_devices):
        await client.create(PODS, plain_pod("plain", 2), namespace)

        async def plain_given() -> list[str] | None:
            p = await client.get(PODS, "plain", namespace)
            statuses = (p.get("status") or {}).get("containerStatuses") or [{}]
            given = statuses[0].get("allocatedResourcesStatus")
            return [r["resourceID"] for r in given[0]["resources"]] if given else None

        plain_ids = set(await eventually(plain_given, what="the plain pod's GPUs"))
        await client.create(SDG_KIND, group("team", {GPU: 2}))
        g = await wait_bound(client, "team")
        held = set(g["status"]["selectedDevices"][GPU].split(","))
        assert held.isdisjoint(plain_ids) and len(held | plain_ids) == 4
        assert condition(g, "Ready").get("status") == "True", g["status"]
        # Nothing is left: a third group waits, and says the node has no GPU free.
        await client.create(SDG_KIND, group("late", {GPU: 1}))

        async def says_none_free() -> str | None:
            message = condition(await client.get(SDG_KIND, "late"), "Scheduled").get("message")
            return message if message and "0 free" in message else None

        await eventually(says_none_free, what="'late' Pending: 0 free")
        # The plain pod ends: its GPUs are free in both books, and 'late' binds on one.
        await client.delete(PODS, "plain", namespace, grace_period_seconds=0)
        late = await wait_bound(client, "late")
        assert late["status"]["selectedDevices"][GPU] in plain_ids
        live = await client.get(SDG_KIND, "team")
        assert condition(live, "Ready").get("status") == "True", live["status"]


async def test_a_pod_that_sets_the_device_env_itself_is_still_foreign(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    """The kubelet counts requests, not env: NVIDIA_VISIBLE_DEVICES=all on the node reaches
    every GPU, the group's too."""
    await add_node(client, "dp-1", 4)
    async with run_sdg(cluster, holders="auto"), kubelet(client, devices=indexed_devices):
        await client.create(SDG_KIND, group("team", {GPU: 2}))
        await wait_bound(client, "team")
        rogue = pod("rogue", None, nodeName="dp-1")
        rogue["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        await client.create(PODS, rogue, namespace)

        async def flagged() -> dict[str, Any] | None:
            ready = condition(await client.get(SDG_KIND, "team"), "Ready")
            return ready if ready.get("reason") == "ForeignDevicePods" else None

        ready = await eventually(flagged, what="ForeignDevicePods on the group")
        assert f"{namespace}/rogue" in ready["message"]
