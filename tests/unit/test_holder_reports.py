"""What the kubelet reports about a holder pod becomes the group's devices by SDG's IDs:
by UUID where the node lists them, by index otherwise, and a report SDG cannot name is a
refusal that says how to fix it (the NVIDIA device plugin names GPUs by UUID)."""

from __future__ import annotations

from typing import Any

from controllers.holders import Given, Refused, Waiting, read_holder
from controllers.inventory import annotation_key, count_offer, node_offers

GPU = "nvidia.com/gpu"


def holder(*reported: str, want: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": "sdg-holder.g", "namespace": "deviceshare-system"},
        "spec": {"containers": [{"name": "hold", "resources": {"limits": {GPU: str(want)}}}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "hold",
                    "allocatedResourcesStatus": [
                        {
                            "name": GPU,
                            "resources": [{"resourceID": r, "health": "Healthy"} for r in reported],
                        }
                    ],
                }
            ],
        },
    }


def annotated(*uuids: str) -> dict[str, Any]:
    node = {
        "metadata": {"name": "n1", "annotations": {annotation_key(GPU): ",".join(uuids)}},
        "status": {"allocatable": {GPU: str(len(uuids))}},
    }
    return node_offers(node)


def test_uuids_are_matched_through_the_nodes_annotation() -> None:
    got = read_holder(holder("GPU-c", "GPU-a"), annotated("GPU-a", "GPU-b", "GPU-c"))
    assert got == Given({GPU: [0, 2]}, {GPU: ["GPU-a", "GPU-c"]})


def test_index_ids_are_taken_as_sdgs_ids() -> None:
    got = read_holder(holder("1", "3"), {GPU: count_offer(GPU, 4)})
    assert isinstance(got, Given) and got.devices == {GPU: [1, 3]}


def test_uuids_on_a_count_only_node_are_refused_with_the_fix() -> None:
    got = read_holder(holder("GPU-a", "GPU-b"), {GPU: count_offer(GPU, 4)})
    assert isinstance(got, Refused)
    assert "cannot match" in got.why and annotation_key(GPU) in got.why
    assert "GPU-a, GPU-b" in got.why


def test_a_partial_report_is_waited_for() -> None:
    got = read_holder(holder("0"), {GPU: count_offer(GPU, 4)})
    assert isinstance(got, Waiting) and "1 of its 2" in got.why
