"""The spec's flow end to end: groups bind, pods join with the same devices on the node."""

from __future__ import annotations

import pytest

from api.constants import SDG_KIND
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from tests.e2e.harness import (
    GPU,
    add_node,
    env_of,
    eventually,
    group,
    kubelet,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_multi_gpu_group_pods_share_devices(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "gpu-node-1", 4)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("my-gpu-group", {GPU: 2}, schedulingStrategy="binpack"))
        g = await wait_bound(client, "my-gpu-group")
        assert g["status"]["nodeName"] == "gpu-node-1"
        assert g["status"]["selectedDevices"] == {GPU: "0,1"}
        for name in ("workload-1", "workload-2"):
            await client.create(
                PODS, pod(name, "my-gpu-group", schedulerName="deviceshare-scheduler"), namespace
            )

        async def both_running() -> list[dict]:
            pods = [await client.get(PODS, n, namespace) for n in ("workload-1", "workload-2")]
            ok = all(
                p["spec"].get("nodeName") and p["status"].get("phase") == "Running" for p in pods
            )
            return pods if ok else []

        pods = await eventually(both_running, what="pods bound and Running")
        for p in pods:
            assert p["spec"]["nodeName"] == "gpu-node-1"
            assert env_of(p)["NVIDIA_VISIBLE_DEVICES"] == "0,1"

        async def allocated() -> dict | None:
            g = await client.get(SDG_KIND, "my-gpu-group")
            want = [f"{namespace}/workload-1", f"{namespace}/workload-2"]
            return g if g["status"].get("allocatedPods") == want else None

        g = await eventually(allocated, what="allocatedPods")
        assert g["status"]["podCount"] == 2


async def test_single_gpu_group_and_second_group_get_disjoint_devices(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "gpu-node-1", 2)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("single-a", {GPU: 1}))
        await client.create(SDG_KIND, group("single-b", {GPU: 1}))
        a = await wait_bound(client, "single-a")
        b = await wait_bound(client, "single-b")
        assert {a["status"]["selectedDevices"][GPU], b["status"]["selectedDevices"][GPU]} == {
            "0",
            "1",
        }
        created = await client.create(PODS, pod("p", "single-a", containers=2), namespace)
        assert created["spec"]["schedulerName"] == "deviceshare-scheduler"
        assert env_of(created, 0)["NVIDIA_VISIBLE_DEVICES"] == a["status"]["selectedDevices"][GPU]
        assert env_of(created, 1)["NVIDIA_VISIBLE_DEVICES"] == a["status"]["selectedDevices"][GPU]
