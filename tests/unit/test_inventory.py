"""The device inventory: which devices a node offers, from which source, with IDs, UUIDs
and health; bounded whatever a node or driver publishes."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import MAX_DEVICES_PER_RESOURCE
from controllers.claims import ClaimBook
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

GPU = "nvidia.com/gpu"


def node(gpus: int = 0, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "n0", "annotations": annotations or {}},
        "status": {"allocatable": {GPU: str(gpus)} if gpus else {}},
    }


def device(name: str, index: int | None = None, uuid: str = "", **extra: Any) -> dict:
    attrs: dict[str, Any] = {}
    if index is not None:
        attrs["index"] = {"int": index}
    if uuid:
        attrs["gpu.nvidia.com/uuid"] = {"string": uuid}  # qualified names work too
    return {"name": name, "attributes": attrs, **extra}


def rslice(devices: list[dict], generation: int = 1, driver: str = "gpu.nvidia.com") -> dict:
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


def pool_slice(name: str, generation: int, count: int, devices: list[dict]) -> dict:
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


def current_nvidia_gpu(minor: int, bus: str) -> dict[str, Any]:
    """A GPU as NVIDIA's DRA driver publishes it since v25.8 (no index, no minor): the
    attributes of kubernetes-sigs/dra-driver-nvidia-gpu v25.12.0
    cmd/gpu-kubelet-plugin/deviceinfo.go, as hack/node/gpusim publishes them too."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{minor:08x}"},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "550.54.15"},
            "cudaDriverVersion": {"version": "12.4.0"},
            "resource.kubernetes.io/pciBusID": {"string": bus},
        },
        "capacity": {"memory": {"value": "40Gi"}},
    }


def test_without_an_index_ids_follow_the_pci_bus_order_not_a_string_sort() -> None:
    # 11 GPUs: a string sort of the names would number gpu-10 as 2 and shift gpu-2..9.
    gpus = [current_nvidia_gpu(m, f"0000:{0x10 + m:02x}:00.0") for m in range(11)]
    offer = slice_offers([rslice(gpus[::-1])])[GPU]
    assert [(d.id, d.name) for d in offer.devices] == [(m, f"gpu-{m}") for m in range(11)]
    assert offer.uuids([2, 10]) == ["GPU-00000002", "GPU-0000000a"]
    # NVML numbers by bus, whatever the minor numbers say.
    swapped = [current_nvidia_gpu(0, "0000:b0:00.0"), current_nvidia_gpu(1, "0000:3b:00.0")]
    offer = slice_offers([rslice(swapped)])[GPU]
    assert [(d.id, d.name) for d in offer.devices] == [(0, "gpu-1"), (1, "gpu-0")]
    assert "PCI bus" in offer.problem
    # Without a bus ID, numbers in names compare as numbers.
    for g in gpus:
        del g["attributes"]["resource.kubernetes.io/pciBusID"]
    offer = slice_offers([rslice(gpus)])[GPU]
    assert [d.name for d in offer.devices] == [f"gpu-{m}" for m in range(11)]


def test_the_mirror_tells_only_real_changes_and_the_claim_book_blocks_holes() -> None:
    changes: list[tuple[str, dict]] = []
    inv = Inventory(on_change=lambda n, o: changes.append((n, o)))
    inv.observe_node(node(0))
    inv.observe_node(node(0))  # a heartbeat: nothing new
    assert len(changes) == 1 and changes[0][1] == {}
    inv.observe_slice(rslice([device("gpu-0", 0, "GPU-0"), device("gpu-2", 2, "GPU-2")]))
    offers = inv.of("n0")
    assert offers[GPU].usable() == [0, 2] and len(changes) == 2
    book = ClaimBook(None, "ns")  # type: ignore[arg-type]
    book.set_offers("n0", offers)
    assert book.tracker.free("n0", GPU) == 2
    assert book.tracker.lowest_free("n0", GPU, 2) == [0, 2]  # the hole at 1 is skipped
    inv.forget_slice(rslice([]) | {"metadata": {"name": "s1"}})
    assert inv.of("n0") == {} and len(changes) == 3
    inv.forget_node(node())
    assert not inv.knows("n0")


def test_sdg_devices_and_explain_show_uuids_and_sources() -> None:
    from controllers.cliviews import devices_view, explain_group

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
