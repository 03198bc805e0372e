"""Group placement end to end: strategies, nodeSelector, Pending with per-node reasons."""

from __future__ import annotations

import pytest

from api.constants import SDG_KIND
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import EVENTS
from tests.e2e.harness import GPU, add_node, eventually, group, run_sdg, wait_bound

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_binpack_and_spread_choose_expected_nodes(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "small", 2)
    await add_node(client, "big", 8)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("packed", {GPU: 1}, schedulingStrategy="binpack"))
        packed = await wait_bound(client, "packed")
        assert packed["status"]["nodeName"] == "small"  # fewest free devices left
        await client.create(SDG_KIND, group("spread", {GPU: 1}, schedulingStrategy="spread"))
        spread = await wait_bound(client, "spread")
        assert spread["status"]["nodeName"] == "big"  # most free devices left


async def test_node_selector_is_honoured(cluster: ControlPlane, client: Client) -> None:
    await add_node(client, "t4", 8, labels={"gpu-type": "t4"})
    await add_node(client, "a100", 8, labels={"gpu-type": "a100"})
    async with run_sdg(cluster):
        await client.create(
            SDG_KIND, group("needs-a100", {GPU: 2}, nodeSelector={"gpu-type": "a100"})
        )
        g = await wait_bound(client, "needs-a100")
        assert g["status"]["nodeName"] == "a100"


async def test_pending_says_why_per_node_then_binds_when_a_node_appears(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "plain-1", 4, shared=False)
    await add_node(client, "plain-2", 4, shared=False)
    await add_node(client, "shared-1", 1)
    await add_node(client, "cordoned", 8, unschedulable=True)
    await add_node(
        client,
        "not-ready",
        8,
        ready=False,
        taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}],
    )
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("big-group", {GPU: 2}))

        async def pending() -> dict | None:
            g = await client.get(SDG_KIND, "big-group")
            conds = {c["type"]: c for c in (g.get("status") or {}).get("conditions") or []}
            return g if "Scheduled" in conds else None

        g = await eventually(pending, what="Scheduled condition")
        assert g["status"]["phase"] == "Pending"
        cond = next(c for c in g["status"]["conditions"] if c["type"] == "Scheduled")
        assert cond["status"] == "False"
        assert cond["reason"] == "Unschedulable"
        assert cond["message"].startswith("0/5 nodes are available: ")
        assert "2 not labelled deviceshare.io/mode=shared" in cond["message"]
        assert f"1 have 1 free {GPU} (need 2)" in cond["message"]
        assert "1 unschedulable" in cond["message"]
        assert "1 not Ready" in cond["message"]

        async def warning_event() -> list:
            evs, _ = await client.list_all(EVENTS, "default")
            return [
                e
                for e in evs
                if e["involvedObject"].get("name") == "big-group"
                and e["type"] == "Warning"
                and e["reason"] == "FailedScheduling"
            ]

        evs = await eventually(warning_event, what="FailedScheduling event")
        assert evs[0]["message"] == cond["message"]

        await add_node(client, "shared-2", 4)
        g = await wait_bound(client, "big-group")
        assert g["status"]["nodeName"] == "shared-2"
        assert g["status"]["selectedDevices"] == {GPU: "0,1"}
        ready = {c["type"]: c["status"] for c in g["status"]["conditions"]}
        assert ready == {"Scheduled": "True", "NodeHealthy": "True", "Ready": "True"}


async def test_every_requested_resource_must_fit(cluster: ControlPlane, client: Client) -> None:
    await add_node(client, "nv-only", 4)
    await add_node(client, "both", 1, extra={"amd.com/gpu": 2})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("mixed", {GPU: 1, "amd.com/gpu": 2}))
        g = await wait_bound(client, "mixed")
        assert g["status"]["nodeName"] == "both"
        assert g["status"]["selectedDevices"] == {GPU: "0", "amd.com/gpu": "0,1"}


async def test_bound_group_reports_a_vanished_node(cluster: ControlPlane, client: Client) -> None:
    from sdgruntime.kinds import NODES

    await add_node(client, "doomed", 2)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("orphaned", {GPU: 1}))
        await wait_bound(client, "orphaned")
        await client.delete(NODES, "doomed")

        async def unhealthy() -> dict | None:
            g = await client.get(SDG_KIND, "orphaned")
            conds = {c["type"]: c for c in g["status"]["conditions"]}
            return conds if conds["NodeHealthy"]["status"] == "False" else None

        conds = await eventually(unhealthy, what="NodeHealthy=False")
        assert conds["NodeHealthy"]["reason"] == "NodeNotFound"
        assert conds["Ready"]["status"] == "False"
        g = await client.get(SDG_KIND, "orphaned")
        assert g["status"]["phase"] == "Bound"  # groups never move
        assert g["status"]["nodeName"] == "doomed"


async def test_shrunk_node_and_pod_events(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    from sdgruntime.kinds import NODES, PODS
    from tests.e2e.harness import kubelet, pod

    await add_node(client, "shrinking", 4)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("high", {GPU: 4}))
        await wait_bound(client, "high")
        await client.create(PODS, pod("member", "high"), namespace)

        async def joined() -> list:
            evs, _ = await client.list_all(EVENTS, "default")
            return [
                e
                for e in evs
                if e["involvedObject"].get("name") == "high" and e["reason"] == "PodsJoined"
            ]

        evs = await eventually(joined, what="PodsJoined event")
        assert f"{namespace}/member" in evs[0]["message"]
        await client.delete(PODS, "member", namespace)

        async def left() -> list:
            evs, _ = await client.list_all(EVENTS, "default")
            return [
                e
                for e in evs
                if e["involvedObject"].get("name") == "high" and e["reason"] == "PodsLeft"
            ]

        await eventually(left, what="PodsLeft event")

        node = await client.get(NODES, "shrinking")
        node["status"]["allocatable"][GPU] = "2"
        await client.update_status(NODES, node)

        async def missing() -> dict | None:
            g = await client.get(SDG_KIND, "high")
            conds = {c["type"]: c for c in g["status"]["conditions"]}
            return conds["NodeHealthy"] if conds["NodeHealthy"]["status"] == "False" else None

        cond = await eventually(missing, what="DevicesMissing")
        assert cond["reason"] == "DevicesMissing"
        assert (
            "no longer offers nvidia.com/gpu 2 (gone), nvidia.com/gpu 3 (gone)" in cond["message"]
        )
        # Counted, not identified: the condition says the lost device cannot be known.
        assert "which one was lost cannot be known" in cond["message"]
