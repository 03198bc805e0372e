"""The group's status builders: what each condition says, decided once."""

from __future__ import annotations

from api.constants import MAX_ALLOCATED_PODS
from controllers.groupstatus import (
    bound_status,
    conflict_of,
    pending_status,
    with_ready_problem,
)
from tests import factories
from tests.factories import GPU

NODE = factories.node("n0", allocatable={GPU: "4"}, ready="True")


def cond(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def group() -> dict:
    """A new group (no node yet) asking for 2 GPUs, at generation 2."""
    return factories.group(resources={GPU: 2}, generation=2)


def test_a_new_binding_is_scheduled_healthy_and_ready() -> None:
    status = bound_status(group(), "n0", {GPU: [0, 1]}, NODE, newly_bound=True)
    assert status["phase"] == "Bound" and status["selectedDevices"] == {GPU: "0,1"}
    assert cond(status, "Scheduled")["message"] == f"bound to node n0 with {GPU} 0,1"
    assert cond(status, "Ready")["status"] == "True" and status["observedGeneration"] == 2


def test_a_conflict_makes_ready_false_and_is_what_conflict_of_reads() -> None:
    g = group()
    g["status"] = bound_status(g, "n0", {GPU: [0, 1]}, NODE, newly_bound=True)
    g["status"] = bound_status(g, "n0", {GPU: [0, 1]}, NODE, problem=("ForeignDevicePods", "x"))
    assert conflict_of(g) == ("ForeignDevicePods", "x")
    g["status"] = with_ready_problem(g, ("RecoveryFailed", "y"))
    assert conflict_of(g) is None  # not a conflict: pods may still join


def test_devices_beyond_the_node_are_missing() -> None:
    status = bound_status(group(), "n0", {GPU: [3, 7]}, NODE, newly_bound=True)
    assert cond(status, "NodeHealthy")["reason"] == "DevicesMissing"
    assert cond(status, "Ready")["status"] == "False"


def test_pods_listed_appears_only_while_the_list_is_truncated() -> None:
    g = group()
    g["status"] = bound_status(g, "n0", {GPU: [0]}, NODE, newly_bound=True, pod_count=5000)
    listed = cond(g["status"], "PodsListed")
    assert (
        listed["status"] == "False" and f"first {MAX_ALLOCATED_PODS} of 5000" in listed["message"]
    )
    g["status"] = bound_status(g, "n0", {GPU: [0]}, NODE, pod_count=3)
    assert all(c["type"] != "PodsListed" for c in g["status"]["conditions"])


def test_pending_says_why_and_is_not_ready() -> None:
    status = pending_status(group(), "0/1 nodes are available: 1 not Ready.")
    assert status["phase"] == "Pending" and status["podCount"] == 0
    assert cond(status, "Scheduled")["message"] == "0/1 nodes are available: 1 not Ready."
    assert cond(status, "NodeHealthy")["status"] == "Unknown"
    assert cond(status, "Ready")["reason"] == "NotReady"


def test_a_node_that_renumbers_a_groups_devices_is_reported_by_uuid() -> None:
    from controllers.inventory import parse_annotation

    g = group()
    offers = {GPU: parse_annotation(GPU, "GPU-a,GPU-b,GPU-c")}
    g["status"] = bound_status(g, "n0", {GPU: [1, 2]}, NODE, newly_bound=True, offers=offers)
    assert g["status"]["physicalDevices"] == {GPU: "GPU-b,GPU-c"}
    assert cond(g["status"], "NodeHealthy")["status"] == "True"
    # GPU-a dropped from the annotation: IDs 1, 2 are GPU-c and a GPU-d now.
    offers = {GPU: parse_annotation(GPU, "GPU-b,GPU-c,GPU-d")}
    status = bound_status(g, "n0", {GPU: [1, 2]}, NODE, offers=offers)
    healthy = cond(status, "NodeHealthy")
    assert (healthy["status"], healthy["reason"]) == ("False", "DevicesMissing")
    assert f"{GPU} 1 was GPU-b, is GPU-c" in healthy["message"]
    assert status["physicalDevices"] == {GPU: "GPU-b,GPU-c"}  # what the pods got, kept
