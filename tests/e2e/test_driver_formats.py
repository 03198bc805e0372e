"""Groups bound on the DRA drivers' real ResourceSlices, against the real API server: what
each pod is told names exactly the devices its group holds, and no two groups' pods are
told the same physical device (issue 19, done-when 1).

The fixtures are the drivers' shapes, field for field (``tests/unit/test_inventory.py``
says where each comes from): NVIDIA's DRA driver >= v25.8 with 12 GPUs, one of them
statically MIG-enabled (published only as its MIG devices); AMD's with 8 MI300X, one of
them partitioned. What a pod is told is resolved the way the vendor's runtime resolves it
(NVML's index: PCI bus order over every GPU; ``amd-ctk``'s list: PCI address order, one
entry per partition) and compared with the group's ``status.physicalDevices`` and with
its claim in DRA's books (``sdg-group.<group>``), which name the devices SDG holds."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from typing import Any

import pytest

from api.constants import SDG_KIND
from controllers.draclaims import RESOURCECLAIMS, allocated_devices, group_claim_name
from controllers.inventory import DEVICETAINTRULES, RESOURCESLICES, node_offers
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import NODES, PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    add_node,
    env_of,
    eventually,
    group,
    pod,
    run_sdg,
    wait_bound,
)
from tests.unit.test_inventory import (
    AMD,
    AMD_GPU,
    MI300X,
    MIG_INDEX,
    NVIDIA,
    TWELVE,
    amd_gpu,
    amd_partition,
    nvidia_uuid,
    twelve_gpus,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

H100_NODE = "h100-node"
MI300X_NODE = "mi300x-node"
PARTITIONED = MI300X[1][0]  # the MI300X in CPX mode: 8 partitions


def nvml_device(told: str) -> tuple[str, str]:
    """The (DRA device name, UUID) of the GPU NVML gives a container for one entry of
    ``NVIDIA_VISIBLE_DEVICES`` (an index or a UUID)."""
    for index, minor, _bus in TWELVE:
        if told in (str(index), nvidia_uuid(index)):
            assert index != MIG_INDEX, "a pod was told the MIG-enabled GPU as a whole GPU"
            return f"gpu-{minor}", nvidia_uuid(index)
    raise AssertionError(f"NVML has no GPU {told!r}")


def amd_partitions() -> list[dict[str, Any]]:
    """The partitioned MI300X's 8 partitions: the PCI device itself and 7 amdgpu_xcp."""
    _, card, render = MI300X[1]
    return [amd_partition(card, render, PARTITIONED, "1001")] + [
        amd_partition(10 + k, 140 + k, PARTITIONED, "1001") for k in range(7)
    ]


def amd_ctk_list() -> list[str]:
    """``amd-ctk``'s device list (ROCm/container-toolkit v1.3.0 GetAMDGPUs), as DRA device
    names: by PCI address, a partitioned GPU's partitions by render minor."""
    out: list[str] = []
    for pci, card, render in MI300X:
        if pci == PARTITIONED:
            parts = sorted(amd_partitions(), key=lambda p: p["attributes"]["renderIndex"]["int"])
            out += [p["name"] for p in parts]
        else:
            out.append(f"gpu-{card}-{render}")
    return out


def amd_device(told: str) -> str:
    """The DRA device name of ``amd.com/gpu=<told>`` / ``AMD_VISIBLE_DEVICES=<told>``."""
    return amd_ctk_list()[int(told)]


def resource_slice(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """One pool named after the node, one slice (both drivers' driver.go)."""
    return {
        "apiVersion": RESOURCESLICES.api_version,
        "kind": RESOURCESLICES.kind,
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.fixture
async def nodes(cluster: ControlPlane, client: Client) -> AsyncIterator[None]:
    """The H100 node and the MI300X node, each with its driver's slice (no device
    counted in status.allocatable: DRA nodes)."""
    await add_node(client, H100_NODE, 0)
    await add_node(client, MI300X_NODE, 0)
    amd = [amd_gpu(c, r, pci, str(1000 + c)) for pci, c, r in MI300X if pci != PARTITIONED]
    made = [
        resource_slice(H100_NODE, NVIDIA, twelve_gpus()),
        resource_slice(MI300X_NODE, AMD, amd + amd_partitions()),
    ]
    for body in made:
        await client.create(RESOURCESLICES, body)
    yield
    for body in made:
        with contextlib.suppress(errors.NotFound):
            await client.delete(RESOURCESLICES, body["metadata"]["name"])


def scheduled(g: Mapping[str, Any]) -> bool:
    conds = (g.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Scheduled" for c in conds)


async def bind_and_tell(
    client: Client,
    namespace: str,
    resource: str,
    var: str,
    sizes: list[int],
    resolve: Callable[[str], Any],
    names: Callable[[Any], str],
) -> list[tuple[dict[str, Any], set[str]]]:
    """Bind a group of each size, one after the other, and create one pod in each: per
    group, (its status, the DRA names of what its pod was told). The names each pod is
    told must be exactly those its group's claim holds."""
    out = []
    for n, size in enumerate(sizes):
        name = f"{resource.split('/')[0].split('.')[0]}-{n}"
        await client.create(SDG_KIND, group(name, {resource: size}))
        g = await wait_bound(client, name)
        created = await client.create(PODS, pod(f"{name}-worker", name), namespace)
        told = [t for t in env_of(created)[var].split(",") if t]
        assert len(told) == size
        devices = [resolve(t) for t in told]
        told_names = {names(d) for d in devices}
        assert len(told_names) == size, f"{name}'s pod was told {told}: not {size} devices"
        claim = await eventually(
            partial(client.get, RESOURCECLAIMS, group_claim_name(name), MANAGER_NS),
            what=f"{name}'s claim",
        )
        assert {d.device for d in allocated_devices(claim)} == told_names
        out.append((g, told_names))
    all_told = [d for _, told_names in out for d in told_names]
    assert len(all_told) == len(set(all_told)), "two groups' pods told the same device"
    return out


async def pending(client: Client, name: str) -> None:
    async def judged() -> dict[str, Any] | None:
        g = await client.get(SDG_KIND, name)
        return g if scheduled(g) else None

    assert (await eventually(judged, what=f"{name} judged"))["status"]["phase"] == "Pending"


@pytest.mark.parametrize("device_ids", ["index", "uuid"])
async def test_twelve_h100s_one_in_mig_mode(
    cluster: ControlPlane, client: Client, namespace: str, nodes: None, device_ids: str
) -> None:
    """11 whole GPUs are handed out, each group's pod is told exactly its
    ``status.physicalDevices`` (as NVML indices or UUIDs), and the MIG-enabled GPU is
    never told as a whole GPU."""
    async with run_sdg(cluster, device_ids=device_ids):
        bound = await bind_and_tell(
            client,
            namespace,
            GPU,
            "NVIDIA_VISIBLE_DEVICES",
            [4, 3, 2, 2],
            nvml_device,
            lambda d: d[0],
        )
        for g, told_names in bound:
            assert g["status"]["nodeName"] == H100_NODE
            physical = g["status"]["physicalDevices"][GPU].split(",")
            by_uuid = {nvml_device(u)[1]: nvml_device(u)[0] for u in physical}
            assert set(by_uuid.values()) == told_names
            ids = g["status"]["selectedDevices"][GPU].split(",")
            assert [nvidia_uuid(int(i)) for i in ids] == physical
        # The twelfth GPU is in MIG mode: nothing is left.
        await client.create(SDG_KIND, group("one-more", {GPU: 1}))
        await pending(client, "one-more")


async def test_eight_mi300x_one_partitioned(
    cluster: ControlPlane, client: Client, namespace: str, nodes: None
) -> None:
    """7 whole GPUs, IDs as amd-ctk numbers them (``amd.com/gpu=<N>``,
    ``AMD_VISIBLE_DEVICES=<N>``): each pod is told exactly its group's devices, never a
    partition. AMD's driver publishes no UUID, so ``physicalDevices`` names none."""
    async with run_sdg(cluster):
        bound = await bind_and_tell(
            client, namespace, AMD_GPU, "AMD_VISIBLE_DEVICES", [3, 4], amd_device, str
        )
        partitions = {p["name"] for p in amd_partitions()}
        for g, told_names in bound:
            assert g["status"]["nodeName"] == MI300X_NODE
            assert not told_names & partitions
            assert AMD_GPU not in (g["status"].get("physicalDevices") or {})
        assert [g["status"]["selectedDevices"][AMD_GPU] for g, _ in bound] == [
            "0,9,10",
            "11,12,13,14",
        ]
        await client.create(SDG_KIND, group("amd-more", {AMD_GPU: 1}))
        await pending(client, "amd-more")


async def test_device_taint_rules_are_served_and_taint_what_they_select(
    cluster: ControlPlane, client: Client, nodes: None
) -> None:
    """Kubernetes 1.37 serves DeviceTaintRules in resource.k8s.io/v1 by default
    (DRADeviceTaintRules GA, k8s.io/kubernetes v1.37.2 pkg/features/kube_features.go);
    the rule as the API server stores it (timeAdded set) makes the device it selects
    unhealthy, as kube-scheduler would not allocate it."""
    listing = await client.request("GET", "/apis/resource.k8s.io/v1")
    assert "devicetaintrules" in {r["name"] for r in listing["resources"]}
    _, minor, _ = TWELVE[5]
    rule = {
        "apiVersion": DEVICETAINTRULES.api_version,
        "kind": DEVICETAINTRULES.kind,
        "metadata": {"name": "h100-5-maintenance"},
        "spec": {
            "deviceSelector": {"driver": NVIDIA, "pool": H100_NODE, "device": f"gpu-{minor}"},
            "taint": {"key": "example.com/maintenance", "effect": "NoExecute"},
        },
    }
    stored = await client.create(DEVICETAINTRULES, rule)
    try:
        assert stored["spec"]["taint"].get("timeAdded")
        rules, _ = await client.list_all(DEVICETAINTRULES)
        slices, _ = await client.list_all(RESOURCESLICES)
        node = await client.get(NODES, H100_NODE)
        offer = node_offers(node, slices, taint_rules=rules)[GPU]
        assert offer.device(5) is not None and 5 not in offer.usable()
        assert offer.usable() == [i for i, _, _ in TWELVE if i not in (MIG_INDEX, 5)]
    finally:
        await client.delete(DEVICETAINTRULES, "h100-5-maintenance")
