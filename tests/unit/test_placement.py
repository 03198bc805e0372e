"""Group placement: every filter with its reason, both strategies, and the Pending message."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.constants import MAX_DEVICES_PER_RESOURCE, SHARED_TAINT_KEY, SHARED_TAINT_VALUE
from controllers.ledger.tracker import DeviceTracker
from controllers.placement import (
    PlacementDecision,
    filter_node,
    node_device_capacity,
    pending_message,
    place,
    too_many_devices_reason,
    unaddressable_devices,
)
from tests import factories
from tests.factories import GPU

Obj = dict[str, Any]
NPU = "huawei.com/Ascend910"


def node(name: str, *, allocatable: dict[str, str] | None = None, **kwargs: Any) -> Obj:
    """The shared node, with 4 GPUs unless ``allocatable`` says exactly what it has."""
    four = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "4"}
    return factories.node(name, allocatable=four if allocatable is None else allocatable, **kwargs)


CAP_REASON = f"advertise 1000000000 {GPU}, more than the 1024 devices SDG addresses per node"


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
    t.add_claim("other", "b", {GPU: [0]})
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
    t.add_claim("g1", "a", {GPU: [0, 1, 2]})
    t.add_claim("g2", "b", {GPU: [0, 1, 2, 3]})
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
            t.add_claim(f"g{i}", f"n{i}", {GPU: list(range(min(held, cap)))})
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


# --- the per-node device cap --------------------------------------------------------------


@pytest.mark.parametrize(
    ("qty", "offered", "advertised"),
    [
        ("1024", 1024, None),
        (str(MAX_DEVICES_PER_RESOURCE + 1), 0, MAX_DEVICES_PER_RESOURCE + 1),
        ("1000000000", 0, 10**9),
        ("1G", 0, 10**9),
        ("1Ki", 1024, None),
        ("2Ki", 0, 2048),
        ("1E", 0, 10**18),
        ("1e60", 0, 10**60),
        ("1e1000000000", 0, None),  # malformed (exponent): offers nothing, nothing to explain
        ("9" * 100_000, 0, None),  # malformed (length)
    ],
)
def test_a_node_offers_no_more_than_the_cap(qty: str, offered: int, advertised: int | None) -> None:
    n = node("x", allocatable={GPU: qty, NPU: "8"})
    assert node_device_capacity(n) == {GPU: offered, NPU: 8}
    assert unaddressable_devices(n) == ({GPU: advertised} if advertised else {})
    t = tracker_for([n])
    assert t.capacity("x", GPU) == offered  # the tracker never sees more than the cap


def test_a_node_over_the_cap_is_filtered_with_the_reason() -> None:
    huge = node("huge", allocatable={GPU: "1000000000"})
    bytes_ = node("bytes", allocatable={GPU: "1G"})
    small = node("small", allocatable={GPU: "1"})
    nodes = [huge, bytes_, small]
    assert too_many_devices_reason(GPU, 10**9) == CAP_REASON
    for free in (tracker_for(nodes), {"huge": {}, "bytes": {}, "small": {GPU: 1}}):
        assert filter_node(spec(), huge, free) == (CAP_REASON,)  # type: ignore[arg-type]
        d = place(spec(), nodes, free)
        assert d.node is None
        assert d.reasons == {
            "huge": (CAP_REASON,),
            "bytes": (CAP_REASON,),
            "small": (f"have 1 free {GPU} (need 2)",),
        }
        assert d.message() == (
            f"0/3 nodes are available: 2 {CAP_REASON}, 1 have 1 free {GPU} (need 2)."
        )


def test_the_cap_filters_only_the_resource_over_it() -> None:
    n = node("x", allocatable={GPU: "1000000000", NPU: "4"})
    t = tracker_for([n])
    assert place({"resources": {NPU: 2}}, [n], t).node == "x"
    assert filter_node({"resources": {GPU: 1, NPU: 8}}, n, t) == (
        f"have 4 free {NPU} (need 8)",  # resources in name order
        CAP_REASON,
    )
    # A native resource is not a device, however much of it there is.
    assert unaddressable_devices(node("y", allocatable={"memory": "1Ti"})) == {}


def test_a_huge_request_is_judged_by_counts_only() -> None:
    n = node("x", allocatable={GPU: "1024"})
    d = place({"resources": {GPU: 10**9}}, [n], tracker_for([n]))
    assert d.reasons == {"x": (f"have 1024 free {GPU} (need 1000000000)",)}
    assert place({"resources": {GPU: 1024}}, [n], tracker_for([n])).free_after == {"x": 0}


# --- the shared-node taint ----------------------------------------------------------------


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_group_placement_tolerates_the_shared_node_taint(effect: str) -> None:
    shared_taint = {"key": SHARED_TAINT_KEY, "value": SHARED_TAINT_VALUE, "effect": effect}
    n = node("x", taints=[shared_taint])
    assert filter_node(spec(), n, tracker_for([n])) == ()
    other = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    both = node("y", taints=[shared_taint, other])
    assert filter_node(spec(), both, tracker_for([both])) == (
        "have untolerated taint {dedicated: ml}",
    )


@pytest.mark.parametrize(
    "taint",
    [
        {"key": SHARED_TAINT_KEY, "value": "exclusive", "effect": "NoSchedule"},
        {"key": SHARED_TAINT_KEY, "effect": "NoExecute"},
        {"key": "example.com/mode", "value": SHARED_TAINT_VALUE, "effect": "NoSchedule"},
    ],
)
def test_only_the_exact_shared_taint_is_tolerated(taint: dict[str, str]) -> None:
    n = node("x", taints=[taint])
    assert filter_node(spec(), n, tracker_for([n])) == (
        f"have untolerated taint {{{taint['key']}: {taint.get('value', '')}}}",
    )


# --- devices used outside SDG (``blocked``) ----------------------------------------------

FOREIGN = f"have {GPU} used by pods outside any group"


def test_a_blocked_resource_filters_the_node_with_the_callers_reason() -> None:
    nodes = [node("a"), node("b", allocatable={GPU: "8"})]
    t = tracker_for(nodes)
    blocked = {"b": {GPU: FOREIGN}}
    assert filter_node(spec(), nodes[1], t, blocked) == (FOREIGN,)
    assert filter_node(spec(), nodes[0], t, blocked) == ()
    d = place(spec("spread"), nodes, t, blocked)
    assert d.node == "a" and d.reasons == {"b": (FOREIGN,)}
    assert d.message() == f"1/2 nodes are available: 1 {FOREIGN}."


def test_blocked_comes_before_the_free_count_and_after_the_node_checks() -> None:
    full = node("full", allocatable={GPU: "2", NPU: "2"})
    t = tracker_for([full])
    t.add_claim("other", "full", {GPU: [0, 1]})
    s = {"resources": {GPU: 1, NPU: 4}}
    blocked = {"full": {GPU: FOREIGN}}
    # Blocked replaces "0 free" for that resource; other resources are still checked.
    assert filter_node(s, full, t, blocked) == (f"have 2 free {NPU} (need 4)", FOREIGN)
    # A node that does not offer the resource says so; a filtered node says why first.
    lacking = node("lacking", allocatable={NPU: "4"})
    assert filter_node(s, lacking, tracker_for([lacking]), {"lacking": {GPU: FOREIGN}}) == (
        f"have no {GPU}",
    )
    cordoned = node("c", unschedulable=True)
    assert filter_node(spec(), cordoned, tracker_for([cordoned]), {"c": {GPU: FOREIGN}}) == (
        "unschedulable (cordoned)",
    )


def test_blocking_a_resource_the_group_does_not_ask_for_changes_nothing() -> None:
    nodes = [node("a", allocatable={GPU: "4", NPU: "4"})]
    t = tracker_for(nodes)
    assert place(spec(), nodes, t, {"a": {NPU: "busy"}}) == place(spec(), nodes, t)
    assert place(spec(), nodes, t, {}) == place(spec(), nodes, t, None)


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.booleans()), max_size=8),
    st.integers(1, 4),
    st.sampled_from(["binpack", "spread"]),
)
def test_blocking_only_removes_the_blocked_nodes(
    shapes: list[tuple[int, int, bool]], need: int, strategy: str
) -> None:
    nodes = [node(f"n{i}", allocatable={GPU: str(cap)}) for i, (cap, _, _) in enumerate(shapes)]
    t = tracker_for(nodes)
    for i, (cap, held, _) in enumerate(shapes):
        if min(held, cap) > 0:
            t.add_claim(f"g{i}", f"n{i}", {GPU: list(range(min(held, cap)))})
    blocked = {f"n{i}": {GPU: FOREIGN} for i, (_, _, b) in enumerate(shapes) if b}
    s = {"resources": {GPU: need}, "schedulingStrategy": strategy}
    free, held_back = place(s, nodes, t), place(s, nodes, t, blocked)
    assert held_back.scores == {n: v for n, v in free.scores.items() if n not in blocked}
    assert held_back.node == next((n for n in free.ranked if n not in blocked), None)
    for name in blocked:
        if t.capacity(name, GPU) > 0:
            assert held_back.reasons[name] == (FOREIGN,)
        else:
            assert held_back.reasons[name] == (f"have no {GPU}",)
