"""The device inventory: which devices a node offers, from which source, with IDs, UUIDs
and health; bounded whatever a node or driver publishes."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import MAX_DEVICES_PER_RESOURCE
from controllers.inventory import (
    SOURCE_ANNOTATION,
    SOURCE_COUNT,
    SOURCE_SLICE,
    Inventory,
    annotation_key,
    node_offers,
    parse_annotation,
    slice_offers,
)
from controllers.ledger.book import Ledger
from tests import factories

GPU = "nvidia.com/gpu"


def node(gpus: int = 0, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Node n0 with ``gpus`` allocatable (none: no entry) and ``annotations``."""
    return factories.node(
        "n0", {GPU: gpus} if gpus else None, annotations=annotations or {}, allocatable={}
    )


def device(name: str, index: int | None = None, uuid: str = "", **extra: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if index is not None:
        attrs["index"] = {"int": index}
    if uuid:
        attrs["gpu.nvidia.com/uuid"] = {"string": uuid}  # qualified names work too
    return {"name": name, "attributes": attrs, **extra}


def rslice(
    devices: list[dict[str, Any]], generation: int = 1, driver: str = "gpu.nvidia.com"
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"s{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": "n0",
            "pool": {"name": "n0", "generation": generation},
            "devices": devices,
        },
    }


def test_count_is_the_fallback_and_marked_as_guessed() -> None:
    offer = node_offers(node(3))[GPU]
    assert offer.source == SOURCE_COUNT and offer.guessed and offer.usable() == [0, 1, 2]
    assert offer.uuids([0]) is None


def test_annotation_wins_over_the_count_with_positions_or_explicit_ids() -> None:
    key = annotation_key(GPU)
    assert key == "deviceshare.io/devices.nvidia.com_gpu"
    offer = node_offers(node(8, {key: "GPU-a, GPU-b"}))[GPU]
    assert offer.source == SOURCE_ANNOTATION and offer.usable() == [0, 1]
    assert offer.uuids([1, 0]) == ["GPU-b", "GPU-a"]
    holes = parse_annotation(GPU, "0=GPU-a,3=GPU-d:unhealthy,5=GPU-f")
    assert holes.usable() == [0, 5] and holes.capacity == 6
    assert holes.missing([0, 3, 4]) == [f"{GPU} 3 GPU-d (unhealthy)", f"{GPU} 4 (gone)"]


@pytest.mark.parametrize(
    "text",
    ["x=GPU-a", "0=GPU-a,0=GPU-b", "GPU-a,GPU-a", "5000=GPU-a", "0=", "0=a b"],
)
def test_a_malformed_annotation_offers_nothing_and_says_why(text: str) -> None:
    offer = parse_annotation(GPU, text)
    assert offer.devices == () and offer.problem.startswith("node annotation")


def test_a_huge_annotation_is_refused_without_reading_it_all() -> None:
    offer = parse_annotation(GPU, ",".join(f"GPU-{i}" for i in range(MAX_DEVICES_PER_RESOURCE + 5)))
    assert offer.devices == () and "more than 1024" in offer.problem


def test_slices_win_use_index_uuid_taints_and_skip_partitions() -> None:
    slices = [
        rslice(
            [
                device("gpu-1", 1, "GPU-1"),
                device("gpu-0", 0, "GPU-0"),
                device("gpu-2", 2, "GPU-2", taints=[{"key": "unhealthy", "effect": "NoSchedule"}]),
                {"name": "mig-0", "attributes": {"type": {"string": "mig"}, "index": {"int": 7}}},
            ]
        )
    ]
    offer = node_offers(node(2, {annotation_key(GPU): "GPU-x"}), slices)[GPU]
    assert offer.source == SOURCE_SLICE and offer.problem == ""
    assert [d.id for d in offer.devices] == [0, 1, 2] and offer.usable() == [0, 1]
    assert offer.uuids([0, 1, 2]) == ["GPU-0", "GPU-1", "GPU-2"]


def test_only_the_newest_pool_generation_counts_and_unknown_drivers_are_ignored() -> None:
    old = rslice([device("gpu-0", 0, "GPU-0"), device("gpu-1", 1, "GPU-1")], generation=1)
    new = rslice([device("gpu-0", 0, "GPU-0")], generation=2)
    other = rslice([device("x", 0)], driver="example.com")
    offers = slice_offers([old, new, other])
    assert list(offers) == [GPU] and offers[GPU].usable() == [0]


def pool_slice(
    name: str, generation: int, count: int, devices: list[dict[str, Any]]
) -> dict[str, Any]:
    s = rslice(devices, generation)
    s["metadata"]["name"] = name
    s["spec"]["pool"]["resourceSliceCount"] = count
    return s


def test_a_pool_counts_at_its_newest_complete_generation() -> None:
    gen1 = [
        pool_slice("a1", 1, 2, [device("gpu-0", 0, "GPU-0"), device("gpu-1", 1, "GPU-1")]),
        pool_slice("b1", 1, 2, [device("gpu-2", 2, "GPU-2"), device("gpu-3", 3, "GPU-3")]),
    ]
    # The driver republishes: one of generation 2's two slices is written so far.
    half = pool_slice("a2", 2, 2, [device("gpu-0", 0, "GPU-0"), device("gpu-1", 1, "GPU-1")])
    assert slice_offers([*gen1, half])[GPU].usable() == [0, 1, 2, 3]  # nothing looks gone
    rest = pool_slice("b2", 2, 2, [device("gpu-2", 2, "GPU-2")])  # GPU 3 really left
    assert slice_offers([*gen1, half, rest])[GPU].usable() == [0, 1, 2]
    # No complete generation at all: the newest is what there is.
    assert slice_offers([half])[GPU].usable() == [0, 1]


def test_devices_without_an_index_get_ids_after_the_indexed_ones() -> None:
    offer = slice_offers([rslice([device("b"), device("a"), device("z", 0)])])[GPU]
    assert [(d.id, d.name) for d in offer.devices] == [(0, "z"), (1, "a"), (2, "b")]
    assert "publish no index" in offer.problem


# --- The drivers' shapes, field for field ---------------------------------------------
#
# NVIDIA: kubernetes-sigs/dra-driver-nvidia-gpu (formerly NVIDIA/k8s-dra-driver-gpu),
# cmd/gpu-kubelet-plugin/. AMD: ROCm/k8s-gpu-dra-driver (commit 2622427, Oct 2025),
# cmd/gpu-kubeletplugin/. Values are an H100 / MI300X node's, as NVML and sysfs give them.

NVIDIA = "gpu.nvidia.com"
AMD = "gpu.amd.com"
AMD_GPU = "amd.com/gpu"


def nvidia_uuid(index: int) -> str:
    return f"GPU-{index:08x}-5e1c-4a0f-9b7d-{index:012x}"


def nvidia_gpu(minor: int, bus: str, uuid: str = "") -> dict[str, Any]:
    """A full GPU as NVIDIA's DRA driver v25.12.0 publishes it: deviceinfo.go
    (GpuInfo.CanonicalName "gpu-<minor>", GetDevice) with partitions.go
    (PartDevAttributes): no index and no minor (removed in v25.8.0, commits 36fc80ab and
    50d90da0); the bus ID under the standard name since commit dcdeb68b; pcieRoot where
    sysfs resolves it (nvlib.go getGpuInfo); capacity memory. As hack/node/gpusim does."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid or nvidia_uuid(minor)},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.124.6"},
            "cudaDriverVersion": {"version": "12.8.0"},
            "resource.kubernetes.io/pciBusID": {"string": bus},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci{bus[:4]}:{bus[5:7]}"},
        },
        "capacity": {"memory": {"value": "81559Mi"}},
    }


def nvidia_mig(
    parent_minor: int, parent_bus: str, parent_uuid: str, profile: str, start: int
) -> dict[str, Any]:
    """A static MIG device as v25.12.0 publishes it (a MIG-enabled GPU is published only
    as these, nvlib.go GetPerGpuAllocatableDevices): deviceinfo.go MigDeviceInfo.GetDevice,
    named by mig.go ToCanonicalName "gpu-<parent minor>-mig-<profile>-<profile ID>-<start>".
    It carries its parent's UUID (``parentUUID``) and PCI bus ID (nvlib.go getMigDevices:
    ``pcieBusID: gpuInfo.pcieBusID``), no parent index."""
    profile_id, slices, sms, engines = {"1g.10gb": (19, 1, 16, 1), "3g.40gb": (9, 4, 60, 3)}[
        profile
    ]
    capacity: dict[str, Any] = {
        "multiprocessors": {"value": str(sms)},
        "copyEngines": {"value": str(engines)},
        "decoders": {"value": str(engines)},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": str(engines)},
        "ofaEngines": {"value": "0"},
        "memory": {"value": f"{9856 * slices}Mi"},
    }
    capacity |= {f"memorySlice{i}": {"value": "1"} for i in range(start, start + slices)}
    return {
        "name": f"gpu-{parent_minor}-mig-{profile.replace('.', '')}-{profile_id}-{start}",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": f"MIG-{parent_minor:08x}-{profile_id:04x}-{start:04x}-0000"},
            "parentUUID": {"string": parent_uuid},
            "profile": {"string": profile},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.124.6"},
            "cudaDriverVersion": {"version": "12.8.0"},
            "resource.kubernetes.io/pciBusID": {"string": parent_bus},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci{parent_bus[:4]}:{parent_bus[5:7]}"},
        },
        "capacity": capacity,
    }


def nvidia_vfio(index: int, bus: str) -> dict[str, Any]:
    """A GPU offered for VM passthrough (feature gate PassthroughSupport):
    deviceinfo.go VfioDeviceInfo.GetDevice "gpu-vfio-<nvpci index>" (v25.12.0; its
    enumerateGpuPciDevices looks parents up in a map it has just made empty, so v25.12.0
    publishes none, main's enumerateGpuVfioDevices at commit 95932046 does), beside the
    GPU's own device, or alone once vfio-pci has the GPU."""
    return {
        "name": f"gpu-vfio-{index}",
        "attributes": {
            "type": {"string": "vfio"},
            "uuid": {"string": f"6f1c0d2e-{index:04x}-5000-8000-{index:012x}"},
            "deviceID": {"string": "0x2330"},
            "vendorID": {"string": "0x10de"},
            "numa": {"int": 0},
            "resource.kubernetes.io/pciBusID": {"string": bus},
            "productName": {"string": "GH100 [H100 SXM5 80GB]"},
        },
        "capacity": {"addressableMemory": {"value": "128Gi"}},
    }


def nvidia_v25_8_gpu(minor: int, bus: str) -> dict[str, Any]:
    """v25.8.0/v25.8.1 deviceinfo.go GpuInfo.GetDevice: no index, no minor, and the bus
    ID under the driver's own name ``pcieBusID`` (the standard name came in v25.12)."""
    gpu = nvidia_gpu(minor, bus)
    gpu["attributes"]["pcieBusID"] = gpu["attributes"].pop("resource.kubernetes.io/pciBusID")
    return gpu


def nvidia_v25_3_gpu(index: int, minor: int, bus: str) -> dict[str, Any]:
    """v25.3.2 deviceinfo.go GpuInfo.GetDevice: ``index`` (NVML's) and ``minor`` beside
    ``pcieBusID``."""
    gpu = nvidia_v25_8_gpu(minor, bus)
    gpu["attributes"] |= {"index": {"int": index}, "minor": {"int": minor}}
    return gpu


def nvidia_v25_3_mig(parent_index: int, parent_minor: int, bus: str) -> dict[str, Any]:
    """v25.3.2 MigDeviceInfo.GetDevice: the MIG device's own ``index`` and its parent's
    ``parentIndex``, named "gpu-<parent minor>-mig-<GI profile>-<start>-<size>"."""
    mig = nvidia_mig(parent_minor, bus, nvidia_uuid(parent_index), "1g.10gb", 0)
    mig["name"] = f"gpu-{parent_minor}-mig-19-0-1"
    attrs = mig["attributes"]
    attrs["pcieBusID"] = attrs.pop("resource.kubernetes.io/pciBusID")
    attrs |= {"index": {"int": 0}, "parentIndex": {"int": parent_index}}
    return mig


#: A node of 12 H100s as NVML numbers them (PCI bus order): (NVML index, minor, bus).
#: Minor numbers need not follow NVML's order (the reason the driver once published both):
#: here those of indices 9 and 10 are swapped.
TWELVE = [
    (0, 0, "0000:18:00.0"),
    (1, 1, "0000:2a:00.0"),
    (2, 2, "0000:3a:00.0"),
    (3, 3, "0000:5d:00.0"),
    (4, 4, "0000:9a:00.0"),
    (5, 5, "0000:ab:00.0"),
    (6, 6, "0000:ba:00.0"),
    (7, 7, "0000:db:00.0"),
    (8, 8, "0001:18:00.0"),
    (9, 10, "0001:2a:00.0"),
    (10, 9, "0001:3a:00.0"),
    (11, 11, "0001:5d:00.0"),
]
MIG_INDEX = 3  # statically MIG-enabled: a 3g.40gb and two 1g.10gb devices


def twelve_gpus(mig: int | None = MIG_INDEX, mig_devices: bool = True) -> list[dict[str, Any]]:
    """The devices NVIDIA's DRA driver (>= v25.8) publishes for ``TWELVE``: GPU ``mig``
    only as its MIG devices (none if ``mig_devices`` is false: MIG mode, nothing
    configured). Listed as driver.go publishResources does, in no particular order."""
    devices = []
    for index, minor, bus in TWELVE:
        if index != mig:
            devices.append(nvidia_gpu(minor, bus, nvidia_uuid(index)))
        elif mig_devices:
            parent = nvidia_uuid(index)
            devices += [
                nvidia_mig(minor, bus, parent, "3g.40gb", 4),
                nvidia_mig(minor, bus, parent, "1g.10gb", 0),
                nvidia_mig(minor, bus, parent, "1g.10gb", 1),
            ]
    return sorted(devices, key=lambda d: d["name"])  # a string sort: gpu-10 before gpu-2


def test_without_an_index_ids_follow_the_pci_bus_order_not_a_string_sort() -> None:
    # 11 GPUs: a string sort of the names would number gpu-10 as 2 and shift gpu-2..9.
    gpus = [nvidia_gpu(m, f"0000:{0x10 + m:02x}:00.0") for m in range(11)]
    offer = slice_offers([rslice(gpus[::-1])])[GPU]
    assert [(d.id, d.name) for d in offer.devices] == [(m, f"gpu-{m}") for m in range(11)]
    assert offer.uuids([2, 10]) == [nvidia_uuid(2), nvidia_uuid(10)]
    assert offer.problem == ""  # NVML's own rule: nothing guessed
    # NVML numbers by bus, whatever the minor numbers say.
    swapped = [nvidia_gpu(0, "0000:b0:00.0"), nvidia_gpu(1, "0000:3b:00.0")]
    offer = slice_offers([rslice(swapped)])[GPU]
    assert [(d.id, d.name) for d in offer.devices] == [(0, "gpu-1"), (1, "gpu-0")]
    # Without a bus ID, numbers in names compare as numbers, and the IDs are guessed.
    for g in gpus:
        del g["attributes"]["resource.kubernetes.io/pciBusID"]
    offer = slice_offers([rslice(gpus)])[GPU]
    assert [d.name for d in offer.devices] == [f"gpu-{m}" for m in range(11)]
    assert "no PCI bus ID" in offer.problem and "guessed" in offer.problem


def test_twelve_gpus_one_in_mig_mode_ids_are_nvml_indices() -> None:
    """The MIG-enabled GPU (NVML index 3) is not offered, and still has its index: its MIG
    devices carry its bus ID, so the GPUs after it keep NVML's indices (numbering only
    the published whole GPUs would make gpu-4 ID 3, and so on)."""
    offer = slice_offers([rslice(twelve_gpus())])[GPU]
    assert offer.problem == ""
    assert [d.id for d in offer.devices] == [i for i, _, _ in TWELVE if i != MIG_INDEX]
    for index, minor, _bus in TWELVE:
        device = offer.device(index)
        if index == MIG_INDEX:
            assert device is None  # a hole: never handed out
        else:
            assert device is not None and (device.name, device.uuid) == (
                f"gpu-{minor}",
                nvidia_uuid(index),
            )
    assert offer.capacity == 12 and len(offer.usable()) == 11


def test_a_mig_gpu_without_mig_devices_keeps_its_place_by_minor_numbers() -> None:
    """MIG mode with no MIG device configured: the driver publishes nothing for the GPU
    (nvlib.go: "has MIG mode enabled but no configured MIG devices"). Its minor number is
    missing from the names; where the others' minors follow their bus order, IDs are the
    minors, so the GPUs after it keep NVML's indices."""
    in_order = [(i, i, bus) for i, _, bus in TWELVE]
    devices = [nvidia_gpu(m, bus, nvidia_uuid(i)) for i, m, bus in in_order if i != 3]
    offer = slice_offers([rslice(devices)])[GPU]
    assert [d.id for d in offer.devices] == [0, 1, 2, *range(4, 12)]
    assert offer.uuids([4, 11]) == [nvidia_uuid(4), nvidia_uuid(11)]
    assert "gpu-3" in offer.problem and "minor numbers" in offer.problem
    # Minors that do not follow the bus order tell nothing: said so.
    offer = slice_offers([rslice(twelve_gpus(mig_devices=False))])[GPU]
    assert "gpu-3" in offer.problem and "may not be NVML's" in offer.problem


def test_passthrough_devices_are_not_offered_and_not_numbered_alone() -> None:
    bus = [b for _, _, b in TWELVE[:4]]
    # vfio beside the GPU's own device: the same GPU, counted once.
    beside = [nvidia_gpu(m, bus[m]) for m in range(4)] + [nvidia_vfio(1, bus[1])]
    offer = slice_offers([rslice(beside)])[GPU]
    assert [(d.id, d.name) for d in offer.devices] == [(i, f"gpu-{i}") for i in range(4)]
    # vfio alone: vfio-pci has the GPU, NVML numbers the others without it.
    alone = [nvidia_gpu(0, bus[0]), nvidia_vfio(1, bus[1])] + [
        nvidia_gpu(m, bus[m]) for m in (2, 3)
    ]
    offer = slice_offers([rslice(alone)])[GPU]
    assert [(d.id, d.name) for d in offer.devices] == [(0, "gpu-0"), (1, "gpu-2"), (2, "gpu-3")]
    assert "VFIO passthrough" in offer.problem and bus[1] in offer.problem


def test_nvidia_v25_8_bus_ids_under_the_drivers_own_name() -> None:
    devices = [nvidia_v25_8_gpu(m, bus) for i, m, bus in TWELVE]
    offer = slice_offers([rslice(devices)])[GPU]
    assert offer.problem == ""
    assert [(d.id, d.name) for d in offer.devices] == [(i, f"gpu-{m}") for i, m, _ in TWELVE]


def test_nvidia_before_v25_8_index_is_the_id() -> None:
    devices = [nvidia_v25_3_gpu(i, m, bus) for i, m, bus in TWELVE if i != MIG_INDEX]
    i, m, bus = TWELVE[MIG_INDEX]
    devices.append(nvidia_v25_3_mig(i, m, bus))  # its own index 0 is no GPU's
    offer = slice_offers([rslice(devices)])[GPU]
    assert offer.problem == ""
    assert [(d.id, d.name) for d in offer.devices] == [
        (i, f"gpu-{m}") for i, m, _ in TWELVE if i != MIG_INDEX
    ]


def amd_gpu(card: int, render: int, pci: str, unique_id: str) -> dict[str, Any]:
    """A whole AMD GPU as ROCm/k8s-gpu-dra-driver publishes it: deviceinfo.go
    AmdGpuInfo.GetDevice, named "gpu-<card>-<render>" (CanonicalName), type ``amdgpu``
    (types.go), no uuid and no index; ``pciAddr`` is the sysfs PCI address
    (pkg/amdgpu/amdgpu.go GetAMDGPUs), ``deviceID`` KFD's unique_id; pcieRoot where
    sysfs resolves it. Published for a GPU in SPX mode (discovery.go)."""
    return {
        "name": f"gpu-{card}-{render}",
        "attributes": {
            "type": {"string": "amdgpu"},
            "pciAddr": {"string": pci},
            "cardIndex": {"int": card},
            "renderIndex": {"int": render},
            "deviceID": {"string": unique_id},
            "family": {"string": "AI"},
            "productName": {"string": "AMD_Instinct_MI300X_OAM"},
            "driverVersion": {"version": "6.10.5"},
            "driverSrcVersion": {"string": "4E0A5C5E1B6A5E0F2A2A1F3"},
            "partitionProfile": {"string": "spx_nps1"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci{pci[:4]}:{pci[5:7]}"},
        },
        "capacity": {
            "memory": {"value": "192Gi"},
            "computeUnits": {"value": "304"},
            "simdUnits": {"value": "1216"},
        },
    }


def amd_partition(card: int, render: int, parent_pci: str, parent_id: str) -> dict[str, Any]:
    """One partition of a partitioned AMD GPU: deviceinfo.go AmdPartitionInfo.GetDevice,
    type ``amdgpu-partition``, the parent's address as ``parentPciAddr`` (the doc,
    docs/driver-attributes.md, says ``pciAddr``; the code publishes ``parentPciAddr``)."""
    return {
        "name": f"gpu-{card}-{render}",
        "attributes": {
            "type": {"string": "amdgpu-partition"},
            "parentPciAddr": {"string": parent_pci},
            "cardIndex": {"int": card},
            "renderIndex": {"int": render},
            "parentDeviceID": {"string": parent_id},
            "family": {"string": "AI"},
            "productName": {"string": "AMD_Instinct_MI300X_OAM"},
            "driverVersion": {"version": "6.10.5"},
            "driverSrcVersion": {"string": "4E0A5C5E1B6A5E0F2A2A1F3"},
            "partitionProfile": {"string": "cpx_nps1"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci{parent_pci[:4]}:{parent_pci[5:7]}"},
        },
        "capacity": {
            "memory": {"value": "24Gi"},
            "computeUnits": {"value": "38"},
            "simdUnits": {"value": "152"},
        },
    }


#: 8 MI300X by PCI address: (address, card, renderD). Card and render numbers follow the
#: kernel's probe order, not the address order amd-ctk numbers by.
MI300X = [
    ("0000:05:00.0", 3, 130),
    ("0000:26:00.0", 1, 128),
    ("0000:46:00.0", 2, 129),
    ("0000:65:00.0", 4, 131),
    ("0000:85:00.0", 7, 134),
    ("0000:a6:00.0", 5, 132),
    ("0000:c6:00.0", 6, 133),
    ("0000:e5:00.0", 8, 135),
]


def amd_slice(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """The AMD driver's one slice of one pool named after the node (driver.go)."""
    return rslice(devices, driver=AMD)


def test_amd_gpus_are_offered_in_amd_ctk_order() -> None:
    """amd-ctk's ``amd.com/gpu=<N>`` and ``AMD_VISIBLE_DEVICES=<N>`` index one list
    (ROCm/container-toolkit v1.3.0 internal/amdgpu GetAMDGPUs, internal/cdi GenerateSpec,
    internal/oci addGPUDevices): GPUs by sysfs PCI address, not by card number."""
    devices = [amd_gpu(c, r, pci, str(1000 + c)) for pci, c, r in MI300X]
    offers = slice_offers([amd_slice(devices[::-1])])
    assert list(offers) == [AMD_GPU]
    offer = offers[AMD_GPU]
    assert offer.problem == ""
    assert [(d.id, d.name) for d in offer.devices] == [
        (n, f"gpu-{c}-{r}") for n, (_, c, r) in enumerate(MI300X)
    ]
    assert offer.uuids([0]) is None  # AMD's driver publishes no UUID
    assert {(d.driver, d.pool) for d in offer.devices} == {(AMD, "n0")}


def test_a_partitioned_amd_gpu_takes_one_id_per_partition() -> None:
    """A GPU in CPX mode is published only as its 8 partitions (discovery.go: the PCI
    device itself and 7 amdgpu_xcp platform devices); amd-ctk lists each partition, so
    the GPUs after it are numbered after its partitions."""
    pci, card, render = MI300X[1]
    devices = [amd_gpu(c, r, p, str(1000 + c)) for p, c, r in MI300X if p != pci]
    devices += [amd_partition(card, render, pci, "1001")]
    devices += [amd_partition(10 + k, 140 + k, pci, "1001") for k in range(7)]
    offer = slice_offers([amd_slice(devices)])[AMD_GPU]
    assert offer.problem == ""
    assert [d.id for d in offer.devices] == [0, *range(9, 15)]
    assert [d.name for d in offer.devices] == [f"gpu-{c}-{r}" for p, c, r in MI300X if p != pci]


# --- DeviceTaintRules ------------------------------------------------------------------


def taint_rule(name: str, effect: str = "NoExecute", **selector: str) -> dict[str, Any]:
    """A DeviceTaintRule (k8s.io/api v0.37.2 resource/v1 types.go: spec.deviceSelector
    driver/pool/device, spec.taint key/value/effect)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": "example.com/maintenance", "value": "dimm", "effect": effect},
        },
    }


def test_device_taint_rules_make_the_devices_they_select_unhealthy() -> None:
    devices = [nvidia_gpu(m, bus) for _, m, bus in TWELVE[:4]]
    slices = [rslice(devices)]
    rules = [
        taint_rule("one", driver=NVIDIA, pool="n0", device="gpu-1"),
        taint_rule("sched", "NoSchedule", device="gpu-2"),
        taint_rule("info", "None", driver=NVIDIA),  # informational: no effect
        taint_rule("future", "SomeNewEffect", driver=NVIDIA),  # unknown: like None
        taint_rule("elsewhere", driver=NVIDIA, pool="other-node"),
        taint_rule("amd", driver=AMD),
    ]
    offer = slice_offers(slices, taint_rules=rules)[GPU]
    assert offer.usable() == [0, 3]
    assert slices[0]["spec"]["devices"][1].get("taints") is None  # the input is not changed
    no_selector = taint_rule("nothing")
    del no_selector["spec"]["deviceSelector"]  # no selector selects nothing
    assert slice_offers(slices, taint_rules=[no_selector])[GPU].usable() == [0, 1, 2, 3]
    everything = taint_rule("all")  # the empty selector selects every device
    assert slice_offers(slices, taint_rules=[everything])[GPU].usable() == []
    offers = node_offers(node(), slices, taint_rules=[taint_rule("x", device="gpu-0")])
    assert offers[GPU].usable() == [1, 2, 3]


def test_the_mirror_follows_taint_rules() -> None:
    changes: list[tuple[str, dict[str, Any]]] = []
    inv = Inventory(on_change=lambda n, o: changes.append((n, o)))
    inv.observe_node(node(0))
    inv.observe_slice(rslice([nvidia_gpu(m, bus) for _, m, bus in TWELVE[:2]]))
    assert inv.of("n0")[GPU].usable() == [0, 1] and len(changes) == 2
    rule = taint_rule("drain", driver=NVIDIA, device="gpu-1")
    inv.observe_taint_rule(rule)
    assert inv.of("n0")[GPU].usable() == [0] and len(changes) == 3
    inv.observe_taint_rule(taint_rule("drain", "None", driver=NVIDIA, device="gpu-1"))
    assert inv.of("n0")[GPU].usable() == [0, 1] and len(changes) == 4
    inv.observe_taint_rule(rule)
    inv.forget_taint_rule(rule)
    assert inv.of("n0")[GPU].usable() == [0, 1] and len(changes) == 6
    inv.observe_taint_rule(taint_rule("amd", driver=AMD))  # selects no slice here
    assert len(changes) == 6


def test_the_mirror_tells_only_real_changes_and_the_claim_book_blocks_holes() -> None:
    changes: list[tuple[str, dict[str, Any]]] = []
    inv = Inventory(on_change=lambda n, o: changes.append((n, o)))
    inv.observe_node(node(0))
    inv.observe_node(node(0))  # a heartbeat: nothing new
    assert len(changes) == 1 and changes[0][1] == {}
    inv.observe_slice(rslice([device("gpu-0", 0, "GPU-0"), device("gpu-2", 2, "GPU-2")]))
    offers = inv.of("n0")
    assert offers[GPU].usable() == [0, 2] and len(changes) == 2
    book = Ledger(None, "ns")  # reads only
    book.set_offers("n0", offers)
    assert book.tracker.free("n0", GPU) == 2
    assert book.tracker.lowest_free("n0", GPU, 2) == [0, 2]  # the hole at 1 is skipped
    inv.forget_slice(rslice([]) | {"metadata": {"name": "s1"}})
    assert inv.of("n0") == {} and len(changes) == 3
    inv.forget_node(node())
    assert not inv.knows("n0")


def test_sdg_devices_and_explain_show_uuids_and_sources() -> None:
    from cli.devices import devices_view
    from cli.explain import explain_group

    shared = {"deviceshare.io/mode": "shared"}
    dra = {"metadata": {"name": "n0", "labels": shared}, "status": {"allocatable": {}}}
    counted = {"metadata": {"name": "n1", "labels": shared}, "status": {"allocatable": {GPU: "1"}}}
    slices = [rslice([device("gpu-0", 0, "GPU-0"), device("gpu-1", 1, "GPU-1")])]
    bound = {
        "metadata": {"name": "g"},
        "spec": {"resources": {GPU: 1}},
        "status": {"phase": "Bound", "nodeName": "n0", "selectedDevices": {GPU: "1"}},
    }
    text = devices_view([dra, counted], [bound], [], slices)
    assert "UUID" in text.splitlines()[0]
    assert any(line.split()[:5] == ["n0", GPU, "1", "GPU-1", "g"] for line in text.splitlines())
    assert f"n0 {GPU}: 2 device(s), from DRA ResourceSlices" in text
    assert f"n1 {GPU}: 1 device(s), counted in status.allocatable: IDs are guessed" in text
    explained = explain_group("g", [bound], [dra, counted], [], [], slices)
    assert f"Device UUIDs:  {GPU} GPU-1 (from DRA ResourceSlices)" in explained
