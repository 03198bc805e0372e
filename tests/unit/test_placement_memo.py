"""place()/filter_node() with memoised node facts decide exactly as a plain reference does.

The reference below filters every node from scratch each call (the placement code as it
was before the memo). Random fleets are edited between calls the ways a cluster changes
them: informer-style (a new object with a new resourceVersion), in place with a new
resourceVersion, in place without one (a hand-built Node), capacity changes, claims coming
and going, nodes deleted and added. A stale memo would show up as a different decision.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.constants import (
    FILTERING_TAINT_EFFECTS,
    MAX_DEVICES_PER_RESOURCE,
    SHARED_TAINT_KEY,
    SHARED_TAINT_VALUE,
)
from controllers import placement
from controllers.ledger.tracker import DeviceTracker
from controllers.placement import (
    PlacementDecision,
    filter_node,
    node_device_capacity,
    place,
    too_many_devices_reason,
)
from controllers.quantity import parse_quantity

GPU = "nvidia.com/gpu"
NPU = "huawei.com/Ascend910"
SHARED_LABEL = {"deviceshare.io/mode": "shared"}


# --- the reference: every filter read from the Node, every call --------------------------


def _count(qty: Any) -> int:
    try:
        value = parse_quantity(qty)
    except ValueError:
        return 0
    return int(value) if value.denominator == 1 and value > 0 else 0


def ref_filter(
    spec: Mapping[str, Any],
    node: Mapping[str, Any],
    free: Any,
    blocked: Mapping[str, Mapping[str, str]] | None,
) -> tuple[tuple[str, ...], int]:
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = meta.get("labels") or {}
    if labels.get("deviceshare.io/mode") != "shared":
        return ("not labelled deviceshare.io/mode=shared",), 0
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return ("didn't match the group's nodeSelector",), 0
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable"):
        return ("unschedulable (cordoned)",), 0
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            if cond.get("status") != "True":
                return ("not Ready",), 0
            break
    for t in node_spec.get("taints") or ():
        shared = t.get("key") == SHARED_TAINT_KEY and t.get("value", "") == SHARED_TAINT_VALUE
        if t.get("effect") in FILTERING_TAINT_EFFECTS and not shared:
            return (f"have untolerated taint {{{t.get('key', '')}: {t.get('value', '')}}}",), 0
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    node_blocked = (blocked or {}).get(name) or {}
    short: list[str] = []
    left = 0
    for res, need in sorted(spec["resources"].items()):
        if hasattr(free, "capacity"):
            cap = free.capacity(name, res)
        else:
            cap = node_device_capacity(node).get(res, 0)
        if cap <= 0:
            advertised = _count(allocatable[res]) if res in allocatable else 0
            short.append(
                too_many_devices_reason(res, advertised)
                if advertised > MAX_DEVICES_PER_RESOURCE
                else f"have no {res}"
            )
            continue
        if res in node_blocked:
            short.append(node_blocked[res])
            continue
        available = (
            free.free(name, res) if hasattr(free, "free") else free.get(name, {}).get(res, 0)
        )
        if available < need:
            short.append(f"have {available} free {res} (need {need})")
        left += available - need
    return tuple(short), left


def ref_place(
    spec: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    free: Any,
    blocked: Mapping[str, Mapping[str, str]] | None = None,
) -> PlacementDecision:
    strategy = spec.get("schedulingStrategy") or "binpack"
    sign = -1 if strategy == "binpack" else 1
    reasons: dict[str, tuple[str, ...]] = {}
    scores: dict[str, int] = {}
    free_after: dict[str, int] = {}
    candidates = 0
    for node in nodes:
        candidates += 1
        name = str((node.get("metadata") or {}).get("name") or "")
        why, left = ref_filter(spec, node, free, blocked)
        if why:
            reasons[name] = why
        else:
            free_after[name] = left
            scores[name] = sign * left
    ranked = tuple(sorted(scores, key=lambda n: (-scores[n], n)))
    return PlacementDecision(
        node=ranked[0] if ranked else None,
        strategy=strategy,
        candidates=candidates,
        reasons=reasons,
        scores=scores,
        free_after=free_after,
        ranked=ranked,
    )


def assert_same(got: PlacementDecision, want: PlacementDecision) -> None:
    assert got == want
    assert got.message() == want.message()


# --- random fleets and edits ----------------------------------------------------------

_versions = itertools.count(1)


def new_version() -> str:
    return str(next(_versions))


class OwnClaimBack:
    """Free counts with some devices handed back (the scheduler's _FreeWithOwnClaim):
    free may exceed capacity here, unlike in a DeviceTracker."""

    def __init__(self, tracker: DeviceTracker, extra: int) -> None:
        self.tracker = tracker
        self.extra = extra

    def free(self, node: str, resource: str) -> int:
        return self.tracker.free(node, resource) + self.extra

    def capacity(self, node: str, resource: str) -> int:
        return self.tracker.capacity(node, resource)


QUANTITIES = ("0", "1", "2", "4", "8", "2000", "500m", "x")
TAINTS = (
    None,
    {"key": SHARED_TAINT_KEY, "value": SHARED_TAINT_VALUE, "effect": "NoSchedule"},
    {"key": "dedicated", "value": "training", "effect": "NoSchedule"},
    {"key": "soft", "value": "", "effect": "PreferNoSchedule"},
    {"key": "evict", "effect": "NoExecute"},
)


@st.composite
def node_objects(draw: st.DrawFn, name: str) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "gpu": draw(st.sampled_from(("a", "b")))}
    if draw(st.booleans()) or draw(st.booleans()):
        labels.update(SHARED_LABEL)
    allocatable = {"cpu": "8"}
    for res in (GPU, NPU):
        if draw(st.booleans()) or res == GPU:
            qty = draw(st.sampled_from((*QUANTITIES, None)))
            if qty is not None:
                allocatable[res] = qty
    obj: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": allocatable},
    }
    if draw(st.booleans()):
        obj["metadata"]["resourceVersion"] = new_version()
    taint = draw(st.sampled_from(TAINTS))
    if taint is not None:
        obj["spec"]["taints"] = [dict(taint)]
    if draw(st.integers(0, 9)) == 0:
        obj["spec"]["unschedulable"] = True
    ready = draw(st.sampled_from(("True", "True", "False", None)))
    if ready is not None:
        obj["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    return obj


def edit(data: st.DataObject, node: dict[str, Any]) -> None:
    """One change to a Node's filter inputs, made in place."""
    what = data.draw(st.sampled_from(("shared", "gpu", "taint", "cordon", "ready", "capacity")))
    labels = node["metadata"]["labels"]
    if what == "shared":
        if labels.pop("deviceshare.io/mode", None) is None:
            labels.update(SHARED_LABEL)
    elif what == "gpu":
        labels["gpu"] = "b" if labels.get("gpu") == "a" else "a"
    elif what == "taint":
        taint = data.draw(st.sampled_from(TAINTS))
        node["spec"]["taints"] = [] if taint is None else [dict(taint)]
    elif what == "cordon":
        node["spec"]["unschedulable"] = not node["spec"].get("unschedulable")
    elif what == "ready":
        status = data.draw(st.sampled_from(("True", "False")))
        node["status"]["conditions"] = [{"type": "Ready", "status": status}]
    else:
        node["status"]["allocatable"][GPU] = data.draw(st.sampled_from(QUANTITIES))


#: Placing is drawn three times as often as each kind of change.
OPS: tuple[str, ...] = ("place", "place", "place", "replace", "in-place", "claim")
OPS += ("release", "shrink", "delete", "add", "duplicate")

group_specs = st.fixed_dictionaries(
    {
        "resources": st.one_of(
            st.fixed_dictionaries({GPU: st.integers(1, 3)}),
            st.fixed_dictionaries({GPU: st.integers(1, 2), NPU: st.integers(1, 2)}),
            st.fixed_dictionaries({NPU: st.integers(1, 2)}),
        ),
        "schedulingStrategy": st.sampled_from(("binpack", "spread")),
    },
    optional={"nodeSelector": st.sampled_from(({"gpu": "a"}, {"gpu": "b"}, {}))},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_memoised_placement_decides_as_the_reference_through_edits(data: st.DataObject) -> None:
    memo = placement.NodeMemo()
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 10)))]
    nodes = [data.draw(node_objects(n)) for n in names]
    tracker = DeviceTracker()
    group_ids = itertools.count()

    def sync(node: Mapping[str, Any]) -> None:
        # The node informer keeps the tracker's capacity in step with the Node.
        tracker.set_node_capacity(node["metadata"]["name"], node_device_capacity(node))

    for node in nodes:
        sync(node)
    for _ in range(data.draw(st.integers(0, 40))):
        op = data.draw(st.sampled_from(OPS))
        if op == "place" or not nodes:
            spec = data.draw(group_specs)
            free_kind = data.draw(st.sampled_from(("tracker", "mapping", "own-claim")))
            free: Any = tracker
            if free_kind == "mapping":
                free = {n: {r: tracker.free(n, r) for r in (GPU, NPU)} for n in tracker.nodes()}
            elif free_kind == "own-claim":
                free = OwnClaimBack(tracker, data.draw(st.integers(0, 3)))
            blocked = {
                n: {GPU: f"have {GPU} used by pods outside any group"}
                for n in data.draw(st.lists(st.sampled_from(names)))
            }
            for b in (None, blocked):
                assert_same(place(spec, nodes, free, b, memo=memo), ref_place(spec, nodes, free, b))
                if free_kind == "mapping":
                    continue  # filter_node takes FreeCounts only
                for node in nodes:
                    got = filter_node(spec, node, free, b, memo=memo)
                    assert got == ref_filter(spec, node, free, b)[0]
            continue
        i = data.draw(st.integers(0, len(nodes) - 1))
        node = nodes[i]
        if op == "replace":  # the informer: a new object, a new resourceVersion
            fresh = copy.deepcopy(node)
            edit(data, fresh)
            fresh["metadata"]["resourceVersion"] = new_version()
            nodes[i] = fresh
            sync(fresh)
        elif op == "in-place":  # same object: with a new version, or a hand-built Node
            edit(data, node)
            if data.draw(st.booleans()):
                node["metadata"]["resourceVersion"] = new_version()
            else:
                node["metadata"].pop("resourceVersion", None)
            sync(node)
        elif op == "claim":
            name = node["metadata"]["name"]
            res = data.draw(st.sampled_from((GPU, NPU)))
            if tracker.free(name, res) > 0:  # the lowest free ID, as the claim book picks
                ids = tracker.lowest_free(name, res, 1)
                assert tracker.add_claim(f"g{next(group_ids)}", name, {res: ids}) == []
        elif op == "release":
            if tracker.groups():
                tracker.release(data.draw(st.sampled_from(tracker.groups())))
        elif op == "shrink":  # capacity below held IDs: stranded holdings stay
            tracker.set_capacity(node["metadata"]["name"], GPU, data.draw(st.integers(0, 2)))
        elif op == "delete":
            gone = nodes.pop(i)
            tracker.remove_node(gone["metadata"]["name"])
        elif op == "duplicate":  # two objects with one name in one list
            nodes.append(copy.deepcopy(node))
        else:
            name = f"n{len(names)}"
            names.append(name)
            nodes.append(data.draw(node_objects(name)))
            sync(nodes[-1])
    tracker.check_invariants()


def shared_node(name: str, gpus: str = "4", version: str | None = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(SHARED_LABEL)}
    if version is not None:
        meta["resourceVersion"] = version
    return {"metadata": meta, "spec": {}, "status": {"allocatable": {GPU: gpus}}}


def fresh_tracker(nodes: list[dict[str, Any]]) -> DeviceTracker:
    t = DeviceTracker()
    for n in nodes:
        t.set_node_capacity(n["metadata"]["name"], node_device_capacity(n))
    return t


SPEC = {"resources": {GPU: 1}}


def test_facts_are_reused_for_the_same_object_and_version() -> None:
    memo = placement.NodeMemo()
    nodes = [shared_node("a"), shared_node("b")]
    t = fresh_tracker(nodes)
    place(SPEC, nodes, t, memo=memo)
    first = dict(memo.entries)
    place(SPEC, nodes, t, memo=memo)
    assert first == memo.entries and all(memo.entries[n] is first[n] for n in first)


@pytest.mark.parametrize("version", ["1", "2"])
def test_an_edited_copy_never_reuses_the_originals_facts(version: str) -> None:
    # Same name; the copy is cordoned. Whether or not it kept the resourceVersion, the
    # memo (keyed by identity and version) must not answer for it.
    memo = placement.NodeMemo()
    original = shared_node("a", version="1")
    t = fresh_tracker([original])
    assert place(SPEC, [original], t, memo=memo).node == "a"
    edited = copy.deepcopy(original)
    edited["spec"]["unschedulable"] = True
    edited["metadata"]["resourceVersion"] = version
    d = place(SPEC, [edited], t, memo=memo)
    assert d.node is None and d.reasons == {"a": ("unschedulable (cordoned)",)}


def test_nodes_without_a_resource_version_are_never_memoised() -> None:
    memo = placement.NodeMemo()
    node = shared_node("a", version=None)
    t = fresh_tracker([node])
    assert place(SPEC, [node], t, memo=memo).node == "a"
    assert memo.entries == {}
    node["spec"]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    assert place(SPEC, [node], t, memo=memo).reasons == {"a": ("have untolerated taint {k: v}",)}


def test_the_memo_stays_about_the_size_of_the_fleet() -> None:
    memo = placement.NodeMemo()
    fleet = [shared_node(f"n{i}") for i in range(500)]
    t = fresh_tracker(fleet)
    for round_ in range(10):  # every node updated, and a tenth of the fleet replaced
        fleet = [shared_node(n["metadata"]["name"], version=str(round_ + 2)) for n in fleet]
        fleet[round_ * 50 : round_ * 50 + 50] = [shared_node(f"r{round_}-{i}") for i in range(50)]
        place(SPEC, fleet, t, memo=memo)
        assert len(memo.entries) <= len(fleet) + len(fleet) // 4 + 64
    small = [shared_node("x")]
    place(SPEC, small, t, memo=memo)
    assert set(memo.entries) == {"x"}


def test_a_tracker_with_stranded_holdings_is_not_trusted_past_its_capacity() -> None:
    # Holdings beyond a shrunk capacity do not count against it: free stays <= capacity.
    memo = placement.NodeMemo()
    node = shared_node("a", gpus="4")
    t = fresh_tracker([node])
    assert t.add_claim("g", "a", {GPU: [0, 1, 2, 3]}) == []
    t.set_capacity("a", GPU, 0)
    assert place(SPEC, [node], t, memo=memo).reasons == {"a": (f"have no {GPU}",)}
    t.set_capacity("a", GPU, 8)
    assert place(SPEC, [node], t, memo=memo).free_after == {"a": 3}
