"""Device tracker: claims recorded (the lowest free IDs, or given ones) and released,
capacity changes, and the claim codec."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from api.constants import MAX_DEVICES_PER_RESOURCE
from controllers.ledger.records import decode_claims, encode_claims
from controllers.ledger.tracker import (
    AllocationError,
    Claim,
    Conflict,
    DeviceTracker,
    Holding,
    InsufficientDevices,
    format_ids,
    lowest_free_ids,
    parse_ids,
)

GPU = "nvidia.com/gpu"
NPU = "huawei.com/Ascend910"


def tracker(**caps: dict[str, int]) -> DeviceTracker:
    t = DeviceTracker()
    for node, per_res in caps.items():
        t.set_node_capacity(node, per_res)
    return t


def test_the_lowest_free_ids_recorded_and_released() -> None:
    # What the claim book does: pick with lowest_free, record with add_claim.
    t = tracker(n1={GPU: 4})
    assert t.lowest_free("n1", GPU, 2) == [0, 1]
    assert t.add_claim("a", "n1", {GPU: t.lowest_free("n1", GPU, 2)}) == []
    assert t.lowest_free("n1", GPU, 1) == [2]
    assert t.add_claim("b", "n1", {GPU: t.lowest_free("n1", GPU, 1)}) == []
    t.release("a")
    assert t.lowest_free("n1", GPU, 1) == [0]
    assert t.add_claim("c", "n1", {GPU: [0]}) == []
    assert t.free("n1", GPU) == 2
    assert t.free_ids("n1", GPU) == [1, 3]
    assert t.holder("n1", GPU, 2) == "b" and t.holder("n1", GPU, 1) is None
    t.check_invariants()


def test_add_claim_is_all_or_nothing_across_resources() -> None:
    t = tracker(n1={GPU: 2, NPU: 1})
    assert t.add_claim("a", "n1", {NPU: [0]}) == []
    assert t.add_claim("b", "n1", {GPU: [0], NPU: [0]}) == [Conflict("b", "n1", NPU, 0, "a")]
    assert t.free("n1", GPU) == 2 and t.claims_of("b") is None
    assert t.lowest_free("n1", NPU, 2) == []  # fewer than asked: the caller says so
    t.check_invariants()


def test_insufficient_devices_says_what_is_short() -> None:
    err = InsufficientDevices("n1", NPU, 1, 2)
    assert str(err) == f"node n1 has 1 free {NPU} (need 2)"
    assert (err.node, err.resource, err.free, err.need) == ("n1", NPU, 1, 2)
    assert isinstance(err, AllocationError)


def test_unknown_node_or_resource_has_nothing_free() -> None:
    t = DeviceTracker()
    assert t.free("nope", GPU) == 0 and t.capacity("nope", GPU) == 0
    assert t.lowest_free("nope", GPU, 1) == [] and t.free_ids("nope", GPU) == []


def test_release_returns_the_claim_and_is_idempotent() -> None:
    t = tracker(n1={GPU: 2})
    t.add_claim("a", "n1", {GPU: [0, 1]})
    claim = t.release("a")
    assert claim == Claim("n1", {GPU: (0, 1)})
    assert t.release("a") is None
    assert t.free("n1", GPU) == 2 and t.groups() == []
    t.check_invariants()


def test_shrinking_capacity_keeps_holdings_and_reports_them() -> None:
    t = tracker(n1={GPU: 4})
    t.add_claim("a", "n1", {GPU: [0, 1]})
    t.add_claim("b", "n1", {GPU: [2, 3]})
    stranded = t.set_capacity("n1", GPU, 3)
    assert stranded == [Holding("n1", GPU, 3, "b")]
    assert str(stranded[0]) == "nvidia.com/gpu 3 on node n1 held by group b"
    assert t.holder("n1", GPU, 3) == "b"  # not lost
    assert t.free("n1", GPU) == 0
    assert t.stranded() == stranded
    t.set_capacity("n1", GPU, 4)
    assert t.stranded() == [] and t.free("n1", GPU) == 0


def test_removing_a_node_strands_its_holdings() -> None:
    t = tracker(n1={GPU: 2, NPU: 2}, n2={GPU: 1})
    t.add_claim("a", "n1", {GPU: [0], NPU: [0]})
    assert t.remove_node("n1") == [Holding("n1", NPU, 0, "a"), Holding("n1", GPU, 0, "a")]
    assert t.nodes() == ["n1", "n2"]  # n1 still listed: it has holdings
    t.release("a")
    assert t.nodes() == ["n2"]


def test_set_node_capacity_zeroes_unlisted_resources() -> None:
    t = tracker(n1={GPU: 2, NPU: 2})
    t.set_node_capacity("n1", {GPU: 3})
    assert t.capacity("n1", GPU) == 3 and t.capacity("n1", NPU) == 0
    with pytest.raises(ValueError):
        t.set_node_capacity("n1", {GPU: -1})
    with pytest.raises(ValueError):
        t.set_capacity("n1", GPU, True)  # type: ignore[arg-type]


def test_add_claim_records_exact_devices_or_reports_conflicts() -> None:
    t = tracker(n1={GPU: 4})
    assert t.add_claim("a", "n1", {GPU: [1, 3]}) == []
    assert t.free_ids("n1", GPU) == [0, 2]
    assert t.add_claim("a", "n1", {GPU: "1,3"}) == []  # same claim again: no-op
    conflicts = t.add_claim("b", "n1", {GPU: [0, 3]})
    assert conflicts == [Conflict("b", "n1", GPU, 3, "a")]
    assert str(conflicts[0]) == (
        "group b claims nvidia.com/gpu 3 on node n1, already held by group a"
    )
    assert t.holder("n1", GPU, 0) is None  # all or nothing
    other_node = t.add_claim("a", "n2", {GPU: [0]})
    assert other_node == [Conflict("a", "n2", None, None, "a")]
    assert "already holds other devices" in str(other_node[0])
    with pytest.raises(ValueError):
        t.add_claim("c", "n1", {})
    with pytest.raises(ValueError):
        t.add_claim("c", "n1", {GPU: []})
    with pytest.raises(ValueError):
        t.add_claim("c", "n1", {GPU: [2, 2]})
    t.check_invariants()


def test_add_claim_accepts_claims_beyond_known_capacity() -> None:
    # Records and statuses are mirrored before (or without) the node's inventory.
    t = DeviceTracker()
    assert t.add_claim("a", "n1", {GPU: [5]}) == []
    assert t.stranded() == [Holding("n1", GPU, 5, "a")]
    t.set_capacity("n1", GPU, 8)
    assert t.stranded() == [] and t.free("n1", GPU) == 7


# --- bounded work: the per-node cap and the lazy free-ID search ------------------------


class CountingSet(set[int]):
    """A set that counts membership tests: the cost of a free-ID search."""

    lookups = 0

    def __contains__(self, item: object) -> bool:
        self.lookups += 1
        return super().__contains__(item)


def test_capacity_above_the_cap_is_refused_and_changes_nothing() -> None:
    t = tracker(n1={GPU: 2})
    with pytest.raises(ValueError, match="more than the 1024 devices"):
        t.set_capacity("n1", GPU, MAX_DEVICES_PER_RESOURCE + 1)
    with pytest.raises(ValueError, match="more than the 1024 devices"):
        t.set_node_capacity("n1", {NPU: 4, GPU: 10**9})
    assert t.capacities("n1") == {GPU: 2}


def test_a_full_1024_device_node() -> None:
    t = tracker(n1={GPU: MAX_DEVICES_PER_RESOURCE})
    assert t.add_claim("all", "n1", {GPU: t.lowest_free("n1", GPU, 1024)}) == []
    assert t.claims_of("all") == Claim("n1", {GPU: tuple(range(1024))})
    assert t.free("n1", GPU) == 0 and t.lowest_free("n1", GPU, 5) == []
    t.release("all")
    for i in range(0, 1024, 2):  # every even ID held by its own group
        assert t.add_claim(f"g{i}", "n1", {GPU: [i]}) == []
    assert t.free("n1", GPU) == 512
    assert t.lowest_free("n1", GPU, 3) == [1, 3, 5]
    assert t.free_ids("n1", GPU, limit=2) == [1, 3]
    assert t.free_ids("n1", GPU) == list(range(1, 1024, 2))
    assert t.lowest_free("n1", GPU, 512) == list(range(1, 1024, 2))
    assert t.add_claim("odd", "n1", {GPU: t.lowest_free("n1", GPU, 512)}) == []
    assert t.free("n1", GPU) == 0
    t.check_invariants()


def test_a_huge_request_is_bounded_by_the_capacity() -> None:
    t = tracker(n1={GPU: 1024, NPU: 8})
    assert t.lowest_free("n1", GPU, 10**9) == list(range(1024))
    assert t.free_ids("n1", GPU, limit=10**9) == list(range(1024))
    assert t.free("n1", GPU) == 1024 and t.free("n1", NPU) == 8


def test_lowest_free_costs_need_plus_held_not_capacity() -> None:
    taken = CountingSet(range(100))
    assert lowest_free_ids(1024, taken, 3) == [100, 101, 102]
    assert taken.lookups == 103
    taken = CountingSet({5, 7})
    assert lowest_free_ids(1024, taken, 0) == [] and taken.lookups == 0
    assert lowest_free_ids(1024, taken, 2) == [0, 1] and taken.lookups == 2


@given(
    st.integers(0, MAX_DEVICES_PER_RESOURCE),
    st.sets(st.integers(0, MAX_DEVICES_PER_RESOURCE + 200), max_size=1100),
    st.integers(-1, MAX_DEVICES_PER_RESOURCE + 100),
)
def test_lowest_free_matches_the_naive_search(capacity: int, held: set[int], n: int) -> None:
    taken = CountingSet(held)
    got = lowest_free_ids(capacity, taken, n)
    assert got == [i for i in range(capacity) if i not in held][: max(n, 0)]
    assert taken.lookups <= max(n, 0) + len(held)


@given(
    st.integers(1, 64),
    st.lists(st.integers(0, 80), max_size=60, unique=True),
    st.integers(1, 70),
)
def test_tracker_free_search_agrees_with_its_counts(cap: int, held: list[int], need: int) -> None:
    t = tracker(n1={GPU: cap})
    for i in held:
        assert t.add_claim(f"g{i}", "n1", {GPU: [i]}) == []
    free = [i for i in range(cap) if i not in set(held)]
    assert t.free("n1", GPU) == len(free)
    assert t.free_ids("n1", GPU) == free
    assert t.lowest_free("n1", GPU, need) == free[:need]
    if free:
        assert t.add_claim("new", "n1", {GPU: t.lowest_free("n1", GPU, need)}) == []
        assert t.free("n1", GPU) == max(0, len(free) - need)
    t.check_invariants()


# --- codec ------------------------------------------------------------------------------


def test_encode_claims_is_compact_sorted_json() -> None:
    text = encode_claims({"b": {GPU: [1, 0]}, "a": {NPU: "2", GPU: [3]}})
    assert text == (
        '{"a":{"huawei.com/Ascend910":"2","nvidia.com/gpu":"3"},"b":{"nvidia.com/gpu":"0,1"}}'
    )
    assert decode_claims(text) == {"a": {NPU: [2], GPU: [3]}, "b": {GPU: [0, 1]}}
    assert encode_claims({}) == "{}" and decode_claims("") == {} and decode_claims("{}") == {}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        ('{"a": []}', "non-empty object"),
        ('{"a": {}}', "non-empty object"),
        ('{"": {"a.io/b": "0"}}', "empty group name"),
        ('{"a": {"gpu": "0"}}', "bad resource name"),
        ('{"a": {"a.io/b": 0}}', "must be a string"),
        ('{"a": {"a.io/b": "x"}}', "not an integer"),
        ('{"a": {"a.io/b": "1,1"}}', "listed twice"),
        ('{"a": {"a.io/b": ""}}', "no device IDs"),
    ],
)
def test_decode_claims_rejects_malformed_records(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        decode_claims(text)


def test_encode_claims_refuses_what_decode_would_reject() -> None:
    for bad in ({"": {GPU: [0]}}, {"a": {}}, {"a": {"gpu": [0]}}, {"a": {GPU: [0, 0]}}):
        with pytest.raises(ValueError):
            encode_claims(bad)


group_names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,10}[a-z0-9])?", fullmatch=True)
resource_names = st.sampled_from([GPU, NPU, "amd.com/gpu", "example.com/x_y"])
id_lists = st.lists(st.integers(0, 10_000), min_size=1, max_size=8, unique=True).map(sorted)
claim_maps = st.dictionaries(
    group_names, st.dictionaries(resource_names, id_lists, min_size=1, max_size=3), max_size=6
)


@given(claim_maps)
def test_claims_codec_round_trips(claims: dict[str, dict[str, list[int]]]) -> None:
    text = encode_claims(claims)
    assert decode_claims(text) == claims
    assert encode_claims(decode_claims(text)) == text
    assert json.loads(text) == {
        g: {r: format_ids(i) for r, i in d.items()} for g, d in claims.items()
    }


@given(st.lists(st.integers(0, 10_000), unique=True))
def test_ids_round_trip(ids: list[int]) -> None:
    assert parse_ids(format_ids(ids)) == sorted(ids)


# --- properties over random operation sequences -----------------------------------------

NODES = ["n1", "n2", "n3"]
RESOURCES = [GPU, NPU]
GROUPS = [f"g{i}" for i in range(8)]


class TrackerMachine(RuleBasedStateMachine):
    """Random capacity/claim/release sequences, as the claim book makes them, against a
    simple model."""

    def __init__(self) -> None:
        super().__init__()
        self.t = DeviceTracker()
        self.caps: dict[tuple[str, str], int] = {}

    @rule(node=st.sampled_from(NODES), res=st.sampled_from(RESOURCES), total=st.integers(0, 6))
    def set_capacity(self, node: str, res: str, total: int) -> None:
        held_before = self._held()
        stranded = self.t.set_capacity(node, res, total)
        self.caps[(node, res)] = total
        assert self._held() == held_before  # shrinking never loses holdings
        assert {(h.device, h.group) for h in stranded} == {
            (i, g) for (n, r, i), g in held_before.items() if (n, r) == (node, res) and i >= total
        }

    @rule(node=st.sampled_from(NODES))
    def remove_node(self, node: str) -> None:
        held_before = self._held()
        stranded = self.t.remove_node(node)
        for res in RESOURCES:
            self.caps[(node, res)] = 0
        assert self._held() == held_before
        assert {(h.resource, h.device, h.group) for h in stranded} == {
            (r, i, g) for (n, r, i), g in held_before.items() if n == node
        }

    @rule(
        group=st.sampled_from(GROUPS),
        node=st.sampled_from(NODES),
        request=st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 3), min_size=1),
    )
    def claim_lowest_free(self, group: str, node: str, request: dict[str, int]) -> None:
        """What ``Ledger.reserve`` does: the lowest free IDs of each resource, recorded
        only if every resource has enough."""
        before = self._held()
        picked = {res: self.t.lowest_free(node, res, n) for res, n in request.items()}
        for res, ids in picked.items():
            free = [i for i in range(self.caps.get((node, res), 0)) if (node, res, i) not in before]
            assert ids == free[: request[res]]  # lowest free IDs first, below capacity
        if any(len(ids) < request[res] for res, ids in picked.items()):
            return
        existing = self.t.claims_of(group)
        conflicts = self.t.add_claim(group, node, picked)
        if existing is None:
            assert conflicts == []
            assert self._held() == {
                **before,
                **{(node, r, i): group for r, ids in picked.items() for i in ids},
            }
        else:
            assert conflicts == [Conflict(group, node, None, None, group)]
            assert self._held() == before

    @rule(group=st.sampled_from(GROUPS), node=st.sampled_from(NODES), devices=st.data())
    def add_claim(self, group: str, node: str, devices: st.DataObject) -> None:
        """Specific devices (a record or a status), maybe overlapping others: all or
        nothing, and every overlap reported."""
        claim = devices.draw(
            st.dictionaries(
                st.sampled_from(RESOURCES),
                st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True).map(sorted),
                min_size=1,
            )
        )
        before = self._held()
        existing = self.t.claims_of(group)
        conflicts = self.t.add_claim(group, node, claim)
        if existing is not None:
            same = existing.node == node and existing.as_dict() == claim
            assert conflicts == ([] if same else [Conflict(group, node, None, None, group)])
            assert self._held() == before
            return
        taken = [
            Conflict(group, node, r, i, before[(node, r, i)])
            for r, ids in sorted(claim.items())
            for i in ids
            if (node, r, i) in before
        ]
        assert conflicts == taken
        if taken:
            assert self._held() == before
        else:
            assert self.t.claims_of(group) == Claim(node, {r: tuple(i) for r, i in claim.items()})

    @rule(group=st.sampled_from(GROUPS))
    def release(self, group: str) -> None:
        had = self.t.claims_of(group)
        assert self.t.release(group) == had
        assert self.t.claims_of(group) is None
        assert group not in set(self._held().values())

    @invariant()
    def consistent(self) -> None:
        self.t.check_invariants()
        held = self._held()
        for node in NODES:
            for res in RESOURCES:
                cap = self.caps.get((node, res), 0)
                in_range = sum(1 for (n, r, i) in held if (n, r) == (node, res) and i < cap)
                assert self.t.free(node, res) == cap - in_range
                assert len(self.t.free_ids(node, res)) == cap - in_range
            assert {
                (node, r, i): g
                for r, ids in self.t.holders_on(node).items()
                for i, g in ids.items()
            } == {k: g for k, g in held.items() if k[0] == node}

    def _held(self) -> dict[tuple[str, str, int], str]:
        out = {}
        for g in self.t.groups():
            claim = self.t.claims_of(g)
            assert claim is not None
            for res, ids in claim.devices.items():
                for i in ids:
                    assert (claim.node, res, i) not in out, "ID held by two groups"
                    out[(claim.node, res, i)] = g
        return out


TestTrackerMachine = TrackerMachine.TestCase
TestTrackerMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_holders_on_a_node_agree_with_its_claims_and_follow_releases() -> None:
    t = tracker(n1={GPU: 4, NPU: 2}, n2={GPU: 4})
    t.add_claim("a", "n1", {GPU: [0, 1]})
    t.add_claim("b", "n1", {GPU: [2], NPU: [0]})
    t.add_claim("c", "n2", {GPU: [0]})
    expected: dict[str, dict[int, str]] = {}
    for group, devices in t.claims_on("n1").items():
        for res, ids in devices.items():
            for i in parse_ids(ids) if isinstance(ids, str) else ids:
                expected.setdefault(res, {})[i] = group
    assert {res: dict(ids) for res, ids in t.holders_on("n1").items()} == expected
    assert dict(t.holders_on("n1")[GPU]) == {0: "a", 1: "a", 2: "b"}
    t.release("a")
    assert dict(t.holders_on("n1")[GPU]) == {2: "b"}
    assert dict(t.holders_on("n3")) == {}
    with pytest.raises(TypeError):
        t.holders_on("n1")["x"] = {}  # type: ignore[index]
