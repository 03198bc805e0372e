"""Group placement: every filter with its reason, both strategies, and the Pending message."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.placement import (
    PlacementDecision,
    filter_node,
    node_device_capacity,
    pending_message,
    place,
)
from controllers.tracker import DeviceTracker

GPU = "nvidia.com/gpu"
NPU = "huawei.com/Ascend910"


def node(
    name: str,
    *,
    shared: bool = True,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    ready: str | None = "True",
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if shared:
        all_labels["deviceshare.io/mode"] = "shared"
    obj: dict[str, Any] = {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "4"}
            if allocatable is None
            else allocatable
        },
    }
    if taints:
        obj["spec"]["taints"] = taints
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    if ready is not None:
        obj["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    return obj


def tracker_for(nodes: list[dict[str, Any]]) -> DeviceTracker:
    t = DeviceTracker()
    for n in nodes:
        t.set_node_capacity(n["metadata"]["name"], node_device_capacity(n))
    return t


def spec(strategy: str = "binpack", **resources: int) -> dict[str, Any]:
    return {
        "resources": {GPU: 2}
        if not resources
        else {k.replace("_", "/"): v for k, v in resources.items()},
        "schedulingStrategy": strategy,
    }


def test_node_device_capacity_keeps_only_extended_integer_resources() -> None:
    n = node(
        "n",
        allocatable={
            "cpu": "8",
            "memory": "1Gi",
            "hugepages-2Mi": "0",
            GPU: "4",
            NPU: "8",
            "example.com/frac": "500m",
            "example.com/bad": "x",
            "kubernetes.io/batch": "3",
            "foo.kubernetes.io/x": "3",
        },
    )
    assert node_device_capacity(n) == {
        GPU: 4,
        NPU: 8,
        "example.com/frac": 0,
        "example.com/bad": 0,
    }


def test_binpack_prefers_fewest_free_devices_left() -> None:
    nodes = [node("a"), node("b"), node("c", allocatable={GPU: "8"})]
    t = tracker_for(nodes)
    t.allocate("other", "b", {GPU: 1})
    d = place(spec(), nodes, t)
    assert d.node == "b"
    assert d.free_after == {"a": 2, "b": 1, "c": 6}
    assert d.scores == {"a": -2, "b": -1, "c": -6}
    assert d.ranked == ("b", "a", "c")
    assert d.candidates == 3 and d.feasible == 3 and d.reasons == {}


def test_spread_prefers_most_free_devices_left() -> None:
    nodes = [node("a"), node("b"), node("c", allocatable={GPU: "8"})]
    d = place(spec("spread"), nodes, tracker_for(nodes))
    assert d.node == "c" and d.ranked == ("c", "a", "b")


def test_ties_break_by_node_name_whatever_the_input_order() -> None:
    nodes = [node("z"), node("m"), node("a")]
    for strategy in ("binpack", "spread"):
        assert place(spec(strategy), nodes, tracker_for(nodes)).node == "a"
        assert place(spec(strategy), nodes[::-1], tracker_for(nodes)).node == "a"


def test_score_sums_over_every_requested_resource() -> None:
    nodes = [
        node("a", allocatable={GPU: "2", NPU: "8"}),
        node("b", allocatable={GPU: "4", NPU: "2"}),
    ]
    d = place({"resources": {GPU: 1, NPU: 1}}, nodes, tracker_for(nodes))
    assert d.free_after == {"a": 8, "b": 4}
    assert d.node == "b"  # binpack is the default strategy


def test_free_counts_may_be_a_plain_mapping() -> None:
    nodes = [node("a"), node("b")]
    d = place(spec(), nodes, {"a": {GPU: 3}, "b": {GPU: 1}})
    assert d.node == "a"
    assert d.reasons == {"b": (f"have 1 free {GPU} (need 2)",)}


@pytest.mark.parametrize(
    ("n", "reason"),
    [
        (node("x", shared=False), "not labelled deviceshare.io/mode=shared"),
        (node("x", unschedulable=True), "unschedulable (cordoned)"),
        (node("x", ready="False"), "not Ready"),
        (node("x", ready="Unknown"), "not Ready"),
        (
            node("x", taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
            "have untolerated taint {node.kubernetes.io/not-ready: }",
        ),
        (
            node("x", taints=[{"key": "dedicated", "value": "ml", "effect": "NoExecute"}]),
            "have untolerated taint {dedicated: ml}",
        ),
        (node("x", allocatable={"cpu": "8"}), f"have no {GPU}"),
        (node("x", allocatable={GPU: "0"}), f"have no {GPU}"),
        (node("x", allocatable={GPU: "1"}), f"have 1 free {GPU} (need 2)"),
    ],
)
def test_each_filter_names_its_reason(n: dict[str, Any], reason: str) -> None:
    s = {"resources": {GPU: 2}}
    assert filter_node(s, n, tracker_for([n])) == (reason,)
    d = place(s, [n], tracker_for([n]))
    assert d.node is None and d.reasons == {"x": (reason,)}


def test_node_selector_must_match_every_label() -> None:
    s = {"resources": {GPU: 1}, "nodeSelector": {"gpu-type": "a100", "zone": "z1"}}
    good = node("good", labels={"gpu-type": "a100", "zone": "z1", "extra": "x"})
    half = node("half", labels={"gpu-type": "a100"})
    wrong = node("wrong", labels={"gpu-type": "t4", "zone": "z1"})
    d = place(s, [half, good, wrong], tracker_for([half, good, wrong]))
    assert d.node == "good"
    assert d.reasons == {
        "half": ("didn't match the group's nodeSelector",),
        "wrong": ("didn't match the group's nodeSelector",),
    }


def test_prefer_no_schedule_taints_and_missing_conditions_do_not_filter() -> None:
    n = node("x", taints=[{"key": "k", "effect": "PreferNoSchedule"}], ready=None)
    assert filter_node(spec(), n, tracker_for([n])) == ()


def test_device_filter_names_every_short_resource() -> None:
    n = node("x", allocatable={GPU: "1"})
    s = {"resources": {GPU: 2, NPU: 1}}
    assert filter_node(s, n, tracker_for([n])) == (f"have no {NPU}", f"have 1 free {GPU} (need 2)")


def test_held_devices_are_not_free() -> None:
    nodes = [node("a"), node("b")]
    t = tracker_for(nodes)
    t.allocate("g1", "a", {GPU: 3})
    t.allocate("g2", "b", {GPU: 4})
    d = place(spec(), nodes, t)
    assert d.node is None
    assert (
        d.message()
        == f"0/2 nodes are available: 1 have 0 free {GPU} (need 2), 1 have 1 free {GPU} (need 2)."
    )


def test_pending_message_groups_reasons_by_count_then_text() -> None:
    nodes = [
        node("n1", shared=False),
        node("n2", shared=False),
        node("n3", shared=False),
        node("n4", allocatable={GPU: "1"}),
        node("n5", allocatable={GPU: "1"}),
    ]
    d = place(spec(), nodes, tracker_for(nodes))
    assert pending_message(d) == (
        "0/5 nodes are available: 3 not labelled deviceshare.io/mode=shared, "
        f"2 have 1 free {GPU} (need 2)."
    )
    tie = [node("b", unschedulable=True), node("a", shared=False)]
    assert place(spec(), tie, tracker_for(tie)).message() == (
        "0/2 nodes are available: 1 not labelled deviceshare.io/mode=shared, "
        "1 unschedulable (cordoned)."
    )


def test_pending_message_without_nodes_says_what_to_do() -> None:
    d = place(spec(), [], DeviceTracker())
    assert d.node is None and d.candidates == 0
    assert d.message() == (
        "0/0 nodes are available: no nodes exist; label a node deviceshare.io/mode=shared "
        "to offer its devices."
    )


def test_message_of_a_successful_decision_counts_the_rest() -> None:
    nodes = [node("a"), node("b", shared=False)]
    d = place(spec(), nodes, tracker_for(nodes))
    assert d.node == "a"
    assert d.message() == "1/2 nodes are available: 1 not labelled deviceshare.io/mode=shared."
    assert pending_message(PlacementDecision(node=None, strategy="binpack", candidates=1)) == (
        "0/1 nodes are available."
    )


def test_invalid_specs_raise() -> None:
    with pytest.raises(ValueError):
        place({"resources": {}}, [node("a")], DeviceTracker())
    with pytest.raises(ValueError):
        place({"resources": {GPU: 1}, "schedulingStrategy": "random"}, [], DeviceTracker())


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 6)), min_size=0, max_size=8
    ),
    st.integers(1, 4),
    st.sampled_from(["binpack", "spread"]),
)
def test_choice_is_feasible_and_best_scored(
    shapes: list[tuple[bool, int, int]], need: int, strategy: str
) -> None:
    nodes = [
        node(f"n{i}", shared=shared, allocatable={GPU: str(cap)})
        for i, (shared, cap, _held) in enumerate(shapes)
    ]
    t = tracker_for(nodes)
    for i, (_shared, cap, held) in enumerate(shapes):
        if min(held, cap) > 0:
            t.allocate(f"g{i}", f"n{i}", {GPU: min(held, cap)})
    d = place({"resources": {GPU: need}, "schedulingStrategy": strategy}, nodes, t)
    assert set(d.reasons) | set(d.scores) == {n["metadata"]["name"] for n in nodes}
    assert not set(d.reasons) & set(d.scores)
    for name in d.scores:
        assert t.free(name, GPU) >= need
    if d.node is None:
        assert not d.scores and d.message().startswith(f"0/{len(nodes)} nodes are available")
    else:
        best = max(d.scores.values())
        assert d.scores[d.node] == best
        assert d.node == min(n for n, s in d.scores.items() if s == best)
