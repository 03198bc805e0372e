"""The devices a group holds are real: placement, UUIDs and health from DRA ResourceSlices
and from the node annotation, against the real API server."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from api.constants import SDG_KIND
from controllers import metrics as sdg_metrics
from controllers.inventory import RESOURCESLICES, annotation_key
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import EVENTS, PODS
from tests.e2e.harness import GPU, add_node, env_of, eventually, group, pod, run_sdg, wait_bound
from tests.unit.test_inventory import nvidia_v25_3_gpu

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

DRIVER = "gpu.nvidia.com"


def gpu(index: int, *, unhealthy: bool = False) -> dict[str, Any]:
    """GPU ``index`` in the shape NVIDIA's DRA driver published before v25.8, with its
    ``index`` attribute (tests/unit/test_inventory.py ``nvidia_v25_3_gpu``: v25.3.2
    deviceinfo.go); tainted as main's driver taints a GPU with a critical XID."""
    device = nvidia_v25_3_gpu(index, index, f"0000:{0x07 + 8 * index:02x}:00.0")
    device["attributes"]["uuid"] = {"string": f"GPU-{index:04d}-aaaa"}
    if unhealthy:
        device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    return device


def resource_slice(node: str, devices: list[dict[str, Any]], generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.fixture
async def slices(client: Client) -> Any:
    """ResourceSlices the test publishes for its fake nodes (removed afterwards)."""
    made: list[str] = []

    async def publish(
        node: str, devices: list[dict[str, Any]], generation: int = 1
    ) -> dict[str, Any]:
        body = resource_slice(node, devices, generation)
        name = body["metadata"]["name"]
        try:
            current = await client.get(RESOURCESLICES, name)
        except errors.NotFound:
            made.append(name)
            return await client.create(RESOURCESLICES, body)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return await client.update(RESOURCESLICES, body)

    yield publish
    for name in made:
        with contextlib.suppress(errors.NotFound):
            await client.delete(RESOURCESLICES, name)


def condition(g: dict[str, Any], type_: str) -> dict[str, Any]:
    conds = (g.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), {})


async def test_resource_slice_devices_drive_placement_and_reach_the_pod(
    cluster: ControlPlane, client: Client, namespace: str, slices: Any
) -> None:
    # A DRA node: no device count in allocatable at all; device 2 is unhealthy.
    await add_node(client, "dra-1", 0)
    await slices("dra-1", [gpu(0), gpu(1), gpu(2, unhealthy=True), gpu(3)])
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("trio", {GPU: 3}))
        g = await wait_bound(client, "trio")
        assert g["status"]["nodeName"] == "dra-1"
        assert g["status"]["selectedDevices"] == {GPU: "0,1,3"}  # never the unhealthy one
        assert g["status"]["physicalDevices"] == {GPU: "GPU-0000-aaaa,GPU-0001-aaaa,GPU-0003-aaaa"}
        created = await client.create(PODS, pod("worker", "trio"), namespace)
        # Told by UUID, the slice's (--device-ids auto).
        assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] == (
            "GPU-0000-aaaa,GPU-0001-aaaa,GPU-0003-aaaa"
        )
        # Nothing else is free: the unhealthy device is not handed out.
        await client.create(SDG_KIND, group("one-more", {GPU: 1}))

        async def judged() -> dict[str, Any] | None:
            g = await client.get(SDG_KIND, "one-more")
            return g if condition(g, "Scheduled") else None

        assert (await eventually(judged, what="judged"))["status"]["phase"] == "Pending"


async def test_a_device_gone_from_the_slice_flags_exactly_its_group(
    cluster: ControlPlane, client: Client, slices: Any
) -> None:
    await add_node(client, "dra-1", 0)
    await slices("dra-1", [gpu(0), gpu(1), gpu(2), gpu(3)])
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("a", {GPU: 2}))
        await wait_bound(client, "a")
        await client.create(SDG_KIND, group("b", {GPU: 1}))
        b = await wait_bound(client, "b")
        assert b["status"]["selectedDevices"] == {GPU: "2"}
        # GPU 1 (a's) falls off the bus: the driver republishes without it.
        await slices("dra-1", [gpu(0), gpu(2), gpu(3)], generation=2)

        async def flagged() -> dict[str, Any] | None:
            g = await client.get(SDG_KIND, "a")
            return g if condition(g, "NodeHealthy").get("status") == "False" else None

        a = await eventually(flagged, what="a flagged")
        cond = condition(a, "NodeHealthy")
        assert cond["reason"] == "DevicesMissing"
        assert f"{GPU} 1 (gone)" in cond["message"] and "cannot be known" not in cond["message"]
        assert a["status"]["physicalDevices"] == {GPU: "GPU-0000-aaaa,GPU-0001-aaaa"}
        b = await client.get(SDG_KIND, "b")
        assert condition(b, "NodeHealthy")["status"] == "True"
        evs, _ = await client.list_all(EVENTS, "default")
        assert any(
            e["involvedObject"]["name"] == "a" and e["reason"] == "DevicesMissing" for e in evs
        )
        assert sdg_metrics.DEVICES_MISSING.labels("dra-1", GPU)._value.get() == 1
        # The lost device is never handed out, even once a lets go of it.
        await client.create(SDG_KIND, group("c", {GPU: 1}))
        assert (await wait_bound(client, "c"))["status"]["selectedDevices"] == {GPU: "3"}


async def test_node_annotation_names_devices_with_holes(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    node = await add_node(client, "annotated", 3)
    node["metadata"].setdefault("annotations", {})[annotation_key(GPU)] = (
        "0=GPU-a,2=GPU-c,3=GPU-d:unhealthy"
    )
    from sdgruntime.kinds import NODES

    await client.update(NODES, node)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("pair", {GPU: 2}))
        g = await wait_bound(client, "pair")
        assert g["status"]["selectedDevices"] == {GPU: "0,2"}
        assert g["status"]["physicalDevices"] == {GPU: "GPU-a,GPU-c"}
        created = await client.create(PODS, pod("p", "pair"), namespace)
        assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-c"  # --device-ids auto


def _holder_series() -> set[tuple[str, ...]]:
    """The sdg_device_holder series exposed now, as (node, resource, device, uuid, group)."""
    return {
        tuple(s.labels[k] for k in ("node", "resource", "device", "uuid", "group"))
        for metric in sdg_metrics.DEVICE_HOLDER.collect()
        for s in metric.samples
        if s.value == 1
    }


async def test_each_device_a_group_holds_is_a_series_with_its_uuid(
    cluster: ControlPlane, client: Client, slices: Any
) -> None:
    """sdg_device_holder says which group holds which GPU by UUID (what DCGM's metrics
    carry); a group deleted leaves no series behind."""
    await add_node(client, "dra-m", 0)
    await slices("dra-m", [gpu(0), gpu(1), gpu(2)])
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("metered", {GPU: 2}))
        bound = await wait_bound(client, "metered")
        uuids = bound["status"]["physicalDevices"][GPU].split(",")
        want = {("dra-m", GPU, str(i), u, "metered") for i, u in enumerate(uuids)}
        assert {s for s in _holder_series() if s[0] == "dra-m"} == want
        await client.delete(SDG_KIND, "metered")

        async def gone() -> bool:
            return not any(s[0] == "dra-m" for s in _holder_series())

        await eventually(gone, what="the group's series dropped")
