"""Bounded memory and work, end to end: the foreign-pod mirror holds only pods on shared
nodes, Pending groups retry when a pod outside any group gives devices back, and a
manager with 300 pods of 1.4 MB env each stays small."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import SDG_KIND
from api.pods import POD_NODE_INDEX
from controllers import metrics as sdg_metrics
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import NODES, PODS
from tests.e2e.harness import GPU, add_node, eventually, group, pod, run_sdg, wait_bound

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

MODE = "deviceshare.io/mode"
RAW_DEVICES = "devices.nri.io/pod"


def foreign_pod(name: str, node: str, **container: Any) -> dict[str, Any]:
    """A pod outside any group, bound to ``node`` by hand (no scheduler involved)."""
    body = pod(name, None, nodeName=node)
    body["spec"]["containers"][0].update(container)
    return body


def scheduled_message(g: dict[str, Any]) -> str:
    for cond in (g.get("status") or {}).get("conditions") or ():
        if cond["type"] == "Scheduled":
            return str(cond.get("message", ""))
    return ""


async def test_the_foreign_mirror_keeps_only_pods_on_shared_nodes(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    n = 20
    gpu_pod = {"resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}}}
    await add_node(client, "plain-1", 8, shared=False)
    await add_node(client, "shared-1", 8)
    async with run_sdg(cluster) as sdg:

        def cached_on(node: str) -> int:
            return len(sdg.manager.cache.list(PODS, index=POD_NODE_INDEX, value=node, copy=False))

        async def create_all() -> None:
            for i in range(n):
                await client.create(PODS, foreign_pod(f"gpu-{i}", "plain-1", **gpu_pod), namespace)
            await eventually(lambda: cached_on("plain-1") == n, what="pods in the cache")

        # GPU pods on a node that is not shared: cached, never mirrored.
        await create_all()
        assert sdg.foreign.size() == 0
        for i in range(n):
            await client.delete(PODS, f"gpu-{i}", namespace, grace_period_seconds=0)
        await eventually(lambda: cached_on("plain-1") == 0, what="pods gone from the cache")
        assert sdg.foreign.size() == 0
        await create_all()
        assert sdg.foreign.size() == 0

        # The node becomes shared: its pods come in from the pod cache, and count.
        await client.patch(NODES, "plain-1", {"metadata": {"labels": {MODE: "shared"}}})
        await eventually(lambda: sdg.foreign.size() == n, what="the node's pods mirrored")
        assert {u.pod for u in sdg.foreign.on("plain-1")} == {
            f"{namespace}/gpu-{i}" for i in range(n)
        }
        assert sdg_metrics.FOREIGN_DEVICE_PODS.labels("plain-1")._value.get() == n
        # ... and placement backs off there: a group that fits only with it stays Pending.
        await client.create(SDG_KIND, group("two", {GPU: 2}))
        assert (await wait_bound(client, "two"))["status"]["nodeName"] == "shared-1"
        await client.create(SDG_KIND, group("wide", {GPU: 8}))
        wide = await eventually(
            lambda: _pending_with(client, "wide", "in use by pods outside any group"),
            what="wide Pending, blocked on plain-1",
        )
        assert "in use by pods outside any group" in scheduled_message(wide)

        # The label goes: so do its pods.
        await client.patch(NODES, "plain-1", {"metadata": {"labels": {MODE: None}}})
        await eventually(lambda: sdg.foreign.size() == 0, what="the node's pods dropped")


async def _pending_with(client: Client, name: str, text: str) -> dict[str, Any] | None:
    g = await client.get(SDG_KIND, name)
    pending = (g.get("status") or {}).get("phase") == "Pending"
    return g if pending and text in scheduled_message(g) else None


@pytest.mark.parametrize("how", ["ends", "drops-annotation", "deleted"])
async def test_a_pending_group_binds_when_the_pod_outside_any_group_gives_devices_back(
    cluster: ControlPlane, client: Client, namespace: str, how: str
) -> None:
    await add_node(client, "shared-1", 2)
    async with run_sdg(cluster):
        rogue = foreign_pod("rogue", "shared-1")
        rogue["metadata"]["annotations"] = {RAW_DEVICES: "- path: /dev/nvidia0"}
        await client.create(PODS, rogue, namespace)
        await client.create(SDG_KIND, group("waiting", {GPU: 2}))
        await eventually(
            lambda: _pending_with(client, "waiting", "in use by pods outside any group"),
            what="waiting Pending, blocked by the rogue pod",
        )
        # Another pod outside any group elsewhere changes nothing for it.
        await add_node(client, "plain-1", 8, shared=False)
        await client.create(PODS, foreign_pod("other", "plain-1"), namespace)

        if how == "ends":
            status = {"status": {"phase": "Succeeded"}}
            await client.patch(PODS, "rogue", status, namespace, subresource="status")
        elif how == "drops-annotation":
            gone = {"metadata": {"annotations": {RAW_DEVICES: None}}}
            await client.patch(PODS, "rogue", gone, namespace)
        else:
            await client.delete(PODS, "rogue", namespace, grace_period_seconds=0)
        bound = await wait_bound(client, "waiting")
        assert bound["status"]["nodeName"] == "shared-1"
        assert bound["status"]["selectedDevices"] == {GPU: "0,1"}
