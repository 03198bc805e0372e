"""The claim book's view of records: identified by name, claims with UIDs; and the live-read
decision that gives claims back."""

from __future__ import annotations

import pytest

from controllers.ledger.book import Ledger
from controllers.ledger.records import record_name
from controllers.ledger.release import should_release
from tests.factories import GPU, group, record


def book(*nodes: tuple[str, int]) -> Ledger:
    b = Ledger(None, "ns")  # reads only
    for node, gpus in nodes:
        b.set_capacity(node, {GPU: gpus})
    return b


def test_a_genuine_record_is_mirrored_with_its_uids() -> None:
    b = book(("n0", 4))
    assert b.observe(record("n0", {"a": {GPU: "0,1"}}, uids={"a": "uid-a"})) == "n0"
    assert b.claim_on("n0", "a") == {GPU: [0, 1]} and b.uid_of("n0", "a") == "uid-a"
    assert b.tracker.free("n0", GPU) == 2 and b.broken == {}


def test_a_record_without_uids_is_legacy_not_malformed() -> None:
    b = book(("n0", 4))
    b.observe(record("n0", {"a": {GPU: "0"}}))
    assert b.uid_of("n0", "a") == "" and b.broken == {}


@pytest.mark.parametrize("uids", ['{"a": 1}', "[", '{"ghost": "u"}'])
def test_malformed_uids_make_the_record_malformed(uids: str) -> None:
    b = book(("n0", 4))
    b.observe(record("n0", {"a": {GPU: "0"}}, uids=uids))
    assert "n0" in b.broken and b.tracker.free("n0", GPU) == 0


def test_a_labelled_decoy_blocks_the_node_it_names_and_is_no_second_fence() -> None:
    b = book(("n0", 4))
    b.observe(record("n0", {"a": {GPU: "0"}}))
    assert b.observe(record("n0", {}, name="decoy", rv=5)) is None
    assert b.claim_on("n0", "a") == {GPU: [0]}  # the real record still stands
    assert "decoy" in b.broken["n0"] and b.tracker.free("n0", GPU) == 0
    b.forget(record("n0", {}, name="decoy"))
    assert b.broken == {} and b.tracker.free("n0", GPU) == 3 and b.claim_on("n0", "a") == {GPU: [0]}


def test_a_record_whose_contents_name_another_node_blocks_both_and_frees_nothing() -> None:
    b = book(("n0", 2), ("n1", 2))
    b.observe(record("n1", {"b": {GPU: "0"}}))
    b.observe(record("n1", {}, name=record_name("n0")))  # n0's record edited to describe n1
    assert set(b.broken) == {"n0", "n1"}
    assert b.claim_on("n1", "b") == {GPU: [0]}  # n1's own record is not replaced by it
    assert b.tracker.free("n0", GPU) == 0 and b.tracker.free("n1", GPU) == 0
    # Repaired in place: n0 is readable again, n1 no longer disputed.
    b.observe(record("n0", {}, rv=2))
    assert b.broken == {} and b.tracker.free("n0", GPU) == 2


def test_deleting_a_genuine_record_forgets_it_and_older_versions_are_ignored() -> None:
    b = book(("n0", 2))
    b.observe(record("n0", {"a": {GPU: "0"}}, rv=3))
    assert b.observe(record("n0", {}, rv=2)) is None  # a late event
    assert b.claim_on("n0", "a") == {GPU: [0]}
    assert b.forget(record("n0", {})) == "n0"
    assert b.claim_on("n0", "a") is None and b.tracker.free("n0", GPU) == 2


@pytest.mark.parametrize(
    ("live", "node", "claim_uid", "adoptable", "release"),
    [
        (None, "n0", "u1", False, True),  # the group is gone
        (group(uid="u2"), "n0", "u1", True, True),  # recreated: an earlier g's claim
        (group(uid="u1", node="n0"), "n0", "u1", False, False),  # its own, bound there
        (group(uid="u1", node="n1"), "n0", "u1", False, True),  # bound elsewhere
        (group(uid="u1", node="n0"), "n0", "", False, False),  # legacy claim, bound there
        (group(uid="u1"), "n0", "u1", True, False),  # to be adopted
        (group(uid="u1"), "n0", "u1", False, True),  # not adoptable: re-place
    ],
    ids=["gone", "recreated", "own-bound", "bound-elsewhere", "legacy", "adoptable", "stale-spec"],
)
def test_should_release_on_a_live_read(
    live: dict | None, node: str, claim_uid: str, adoptable: bool, release: bool
) -> None:
    assert should_release(live, node, claim_uid, adoptable=adoptable) is release


ASCEND = "huawei.com/Ascend910"
ASCEND_2C = "huawei.com/Ascend910-2c"


def test_resources_of_one_device_env_var_share_one_id_space() -> None:
    """Ascend910 and Ascend910-2c both name NPUs by ASCEND_VISIBLE_DEVICES: NPU 0 held
    under one name is not free under the other."""
    from api.constants import DEFAULT_ENV_TABLE
    from api.envvars import env_var_for

    b = Ledger(None, "ns", family=lambda r: env_var_for(r, DEFAULT_ENV_TABLE))
    b.set_capacity("n0", {ASCEND: 4, ASCEND_2C: 4, GPU: 4})
    b.observe(record("n0", {"a": {ASCEND: "0,1"}}))
    assert b.tracker.free("n0", ASCEND) == 2
    assert b.tracker.free("n0", ASCEND_2C) == 2
    assert b.tracker.lowest_free("n0", ASCEND_2C, 2) == [2, 3]
    assert b.tracker.free("n0", GPU) == 4  # another family: untouched
    b.observe(record("n0", {}, rv=2))
    assert b.tracker.free("n0", ASCEND_2C) == 4


def test_without_a_family_resources_keep_their_own_ids() -> None:
    b = book(("n0", 4))
    b.set_capacity("n0", {ASCEND: 4, ASCEND_2C: 4})
    b.observe(record("n0", {"a": {ASCEND: "0"}}))
    assert b.tracker.free("n0", ASCEND_2C) == 4


def test_a_renumbered_node_keeps_a_groups_very_devices_by_uuid() -> None:
    """The node annotation dropped a dead GPU-a: GPU-b, which group 'a' holds as ID 1 and
    its pods use, is ID 0 now. Neither ID is given to anyone else."""
    from controllers.inventory import parse_annotation

    b = book(("n0", 3))
    b.set_offers("n0", {GPU: parse_annotation(GPU, "GPU-a,GPU-b,GPU-c")})
    b.observe(record("n0", {"a": {GPU: "1"}}))
    b.observe_group(
        group("a", node="n0", devices={GPU: "1"}, status={"physicalDevices": {GPU: "GPU-b"}})
    )
    assert b.tracker.lowest_free("n0", GPU, 2) == [0, 2]
    b.set_offers("n0", {GPU: parse_annotation(GPU, "GPU-b,GPU-c")})
    assert b.tracker.free("n0", GPU) == 0  # ID 0 is GPU-b (by UUID), ID 1 by the record
    b.forget_group(group("a", node="n0", devices={GPU: "1"}))
    b.observe(record("n0", {}, rv=2))
    assert b.tracker.free("n0", GPU) == 2
