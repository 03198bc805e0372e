"""A group on a real node whose GPUs come from a device plugin (the kubelet's own device
manager, fed by ``gpusim device-plugin`` in NVIDIA's envvar and cdi-cri strategies):
what each container really sees, read back from the container itself."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from api.constants import SDG_KIND
from controllers.holders import holder_name
from hack.node.simulators import DevicePluginSim, SimGpu, make_gpus
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.node import Node
from sdgruntime.kinds import EVENTS, PODS
from tests.e2e.harness import GPU, MANAGER_NS, eventually, group, run_sdg, wait_bound
from tests.realnode.conftest import Report, container_report, report_pod

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPUS = make_gpus(4)


@pytest.fixture(scope="module")
def plugin(node: Node) -> Iterator[DevicePluginSim]:
    """4 simulated GPUs registered with the node's kubelet; the node annotated with their
    UUIDs, as a DaemonSet would, so SDG knows which ID is which GPU."""
    sim = DevicePluginSim(
        GPUS, node.work_dir / "gpusim", cdi_dir=node.cdi_dir, strategy="envvar,cdi-cri"
    )
    sim.start(lambda: node.allocatable().get(GPU) == "4")
    node.annotate(sim.annotation())
    yield sim
    sim.stop()


def plain_gpu_pod(name: str, count: int) -> dict[str, Any]:
    """A pod outside any group asking kube-scheduler and the device plugin for GPUs."""
    pod = report_pod(name)
    pod["spec"]["containers"][0]["resources"] = {"limits": {GPU: str(count)}}
    return pod


def seen(report: Report) -> list[SimGpu]:
    """The simulated GPUs a container was given by CDI (env markers and /dev nodes)."""
    return [g for g in GPUS if report.env.get(f"SIM_GPU_{g.index}") == g.uuid]


async def gone(client: Client, namespace: str, name: str) -> None:
    """Delete a pod and wait until the kubelet has stopped it and it is gone."""
    with contextlib.suppress(errors.NotFound):
        await client.delete(PODS, name, namespace, grace_period_seconds=0)

    async def absent() -> bool:
        try:
            await client.get(PODS, name, namespace)
        except errors.NotFound:
            return True
        return False

    await eventually(absent, within=60, interval=0.3, what=f"pod {name} gone")


@contextlib.asynccontextmanager
async def bound_group(
    cp: ControlPlane, client: Client, name: str, **settings: Any
) -> AsyncIterator[dict[str, Any]]:
    """A running manager (holder pods on) and group ``name`` of 2 GPUs Bound on the real
    node; the group is deleted (its pods first) before the manager stops."""
    async with run_sdg(cp, **{"holders": "auto", **settings}):
        await client.create(SDG_KIND, group(name, {GPU: 2}))
        try:
            yield await wait_bound(client, name, within=30)
        finally:
            with contextlib.suppress(errors.NotFound):
                await client.delete(SDG_KIND, name)

            async def deleted() -> bool:
                try:
                    await client.get(SDG_KIND, name)
                except errors.NotFound:
                    return True
                return False

            await eventually(deleted, within=60, interval=0.3, what=f"group {name} deleted")


@pytest.mark.parametrize("device_ids", ["index", "uuid"])
async def test_every_group_pod_sees_exactly_the_groups_devices(
    plugin: DevicePluginSim,
    node: Node,
    real_cp: ControlPlane,
    rclient: Client,
    rns: str,
    device_ids: str,
) -> None:
    async with bound_group(real_cp, rclient, "team", device_ids=device_ids) as g:
        status = g["status"]
        assert status["nodeName"] == node.name
        ids = [int(i) for i in status["selectedDevices"][GPU].split(",")]
        uuids = [GPUS[i].uuid for i in ids]
        assert status["physicalDevices"][GPU].split(",") == uuids
        want = status["selectedDevices"][GPU] if device_ids == "index" else ",".join(uuids)
        names = ["trainer", "notebook"]
        for name in names:
            await rclient.create(PODS, report_pod(name, group="team"), rns)
        for name in names:
            report = await container_report(real_cp, rclient, rns, name)
            assert report.env["NVIDIA_VISIBLE_DEVICES"] == want, (name, report.env)
            # Nothing came from the device plugin: the group pod asked it for nothing.
            assert seen(report) == [], (name, report.env)
            pod = await rclient.get(PODS, name, rns)
            assert pod["spec"]["nodeName"] == node.name
        for name in names:
            await gone(rclient, rns, name)


async def test_a_plain_pod_gets_its_own_gpus_from_the_device_plugin(
    plugin: DevicePluginSim, real_cp: ControlPlane, rclient: Client, rns: str
) -> None:
    await rclient.create(PODS, plain_gpu_pod("plain", 2), rns)
    report = await container_report(real_cp, rclient, rns, "plain")
    visible = report.env["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 2 and set(visible) <= {g.uuid for g in GPUS}, report.env
    # The same two by CDI (cdi-cri): the spec's env markers and device nodes.
    given = seen(report)
    assert sorted(g.uuid for g in given) == sorted(visible)
    assert sorted(d for d in report.dev if d.startswith("nvidia")) == sorted(
        f"nvidia{g.index}" for g in given
    )
    await gone(rclient, rns, "plain")


async def test_the_kubelet_counts_health_and_a_restart_from_the_plugin(
    plugin: DevicePluginSim, node: Node
) -> None:
    plugin.set_healthy(GPUS[3].uuid, False)
    try:
        await eventually(lambda: node.allocatable().get(GPU) == "3", within=30, what="3 GPUs")
    finally:
        plugin.set_healthy(GPUS[3].uuid, True)
    await eventually(lambda: node.allocatable().get(GPU) == "4", within=30, what="4 GPUs")
    node.restart_kubelet()  # the kubelet forgets its plugins; the plugin registers again
    await eventually(lambda: node.allocatable().get(GPU) == "4", within=60, what="re-registered")


async def test_no_plain_pod_ever_sees_a_groups_gpu(
    plugin: DevicePluginSim, real_cp: ControlPlane, rclient: Client, rns: str
) -> None:
    async with bound_group(real_cp, rclient, "held") as g:
        held = set(g["status"]["physicalDevices"][GPU].split(","))
        await rclient.create(PODS, plain_gpu_pod("greedy", 4), rns)
        try:
            report = await container_report(real_cp, rclient, rns, "greedy", within=20)
        except AssertionError:
            pod = await rclient.get(PODS, "greedy", rns)
            assert pod["status"].get("phase") == "Pending"  # kept off the group's GPUs
        else:
            got = set(report.env["NVIDIA_VISIBLE_DEVICES"].split(","))
            assert not got & held, f"a plain pod sees the group's GPUs {sorted(got & held)}"
        finally:
            await gone(rclient, rns, "greedy")


async def test_a_group_and_plain_pods_share_the_node_without_sharing_a_gpu(
    plugin: DevicePluginSim, real_cp: ControlPlane, rclient: Client, rns: str
) -> None:
    """The mixed layout: the node is labelled shared, not tainted. The group's holder has
    2 of the 4 GPUs in the kubelet's books: a plain pod asking for 4 waits, one asking
    for 2 gets the other two, and when the group goes the waiting pod gets all four."""
    async with bound_group(real_cp, rclient, "mixed") as g:
        held = set(g["status"]["physicalDevices"][GPU].split(","))
        holder = await rclient.get(PODS, holder_name("mixed"), MANAGER_NS)
        given = holder["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]
        assert {r["resourceID"] for r in given["resources"]} == held
        await rclient.create(PODS, report_pod("member", group="mixed"), rns)
        await rclient.create(PODS, plain_gpu_pod("small", 2), rns)
        small = await container_report(real_cp, rclient, rns, "small")
        got = set(small.env["NVIDIA_VISIBLE_DEVICES"].split(","))
        assert len(got) == 2 and not got & held, (got, held)
        member = await container_report(real_cp, rclient, rns, "member")
        # By UUID: the kubelet's report names them (--device-ids auto).
        assert member.env["NVIDIA_VISIBLE_DEVICES"] == g["status"]["physicalDevices"][GPU]
        await gone(rclient, rns, "small")
        await rclient.create(PODS, plain_gpu_pod("whole", 4), rns)

        async def unschedulable() -> bool:
            pod = await rclient.get(PODS, "whole", rns)
            conds = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
            return conds.get("PodScheduled", {}).get("reason") == "Unschedulable"

        await eventually(unschedulable, within=30, what="the 4-GPU pod left unscheduled")
        live = await rclient.get(SDG_KIND, "mixed")
        ready = {c["type"]: c for c in live["status"]["conditions"]}["Ready"]
        assert ready["status"] == "True", ready  # plain pods that the kubelet counts are fine
        await gone(rclient, rns, "member")
    # The group is gone, and so is its holder: the kubelet gives the waiting pod all four.
    with pytest.raises(errors.NotFound):
        await rclient.get(PODS, holder_name("mixed"), MANAGER_NS)
    whole = await container_report(real_cp, rclient, rns, "whole", within=60)
    assert sorted(whole.env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(g.uuid for g in GPUS)
    await gone(rclient, rns, "whole")


async def test_a_holder_deleted_by_hand_is_reported_on_the_group(
    plugin: DevicePluginSim, real_cp: ControlPlane, rclient: Client
) -> None:
    async with bound_group(real_cp, rclient, "watched"):
        await rclient.delete(PODS, holder_name("watched"), MANAGER_NS, grace_period_seconds=0)

        async def warned() -> bool:
            events, _ = await rclient.list_all(EVENTS, "default")
            return any(
                e.get("reason") == "HolderLost" and e["involvedObject"].get("name") == "watched"
                for e in events
            )

        await eventually(warned, within=30, what="a HolderLost Warning on the group")
