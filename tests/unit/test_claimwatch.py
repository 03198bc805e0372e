"""Which claim record events wake the Pending groups: those that can free devices at
once, those that take devices after a delay (a Pending message counts free devices)."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.watches import record_frees_devices, record_takes_devices
from tests.factories import GPU, record


def cm(claims: Any, node: str = "n0", uids: Any = None) -> dict:
    """Node ``node``'s claim record holding ``claims``."""
    return record(node, claims, uids=uids)


A = {"a": {GPU: "0,1"}}
AB = {"a": {GPU: "0,1"}, "b": {GPU: "2"}}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (cm(A), cm(AB)),  # a claim added
        (cm({}), cm(A)),
        (cm(A), cm(A, uids={"a": "u1"})),  # a UID recorded
        (cm(A), cm({"a": {GPU: "1,0"}})),  # the same devices, written otherwise
        (cm(AB), cm({"a": {GPU: "0,1"}, "c": {GPU: "2"}})),  # handed from b to c at once
        (cm("["), cm("{")),  # malformed before and after: still blocked
    ],
    ids=["claim-added", "first-claim", "uid", "same", "handed-over", "still-malformed"],
)
def test_updates_that_free_nothing_do_not_wake_pending_groups(old: dict, new: dict) -> None:
    assert not record_frees_devices.update(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (cm(AB), cm(A)),  # b released
        (cm(A), cm({"a": {GPU: "0"}})),  # a shrank
        (cm(A), cm({})),
        (cm("["), cm(A)),  # repaired
        (cm(A, uids={"ghost": "u"}), cm(A)),  # a malformed uids entry repaired
        (cm(A), cm(A, node="n1")),  # edited to name another node
    ],
    ids=["released", "shrank", "emptied", "repaired", "uids-repaired", "renamed"],
)
def test_updates_that_can_free_devices_wake_pending_groups(old: dict, new: dict) -> None:
    assert record_frees_devices.update(old, new)


def test_creates_free_nothing_and_deletes_may() -> None:
    assert not record_frees_devices.create(cm(A))
    assert record_frees_devices.delete(cm(A))


@pytest.mark.parametrize(
    ("old", "new", "takes"),
    [
        (cm(A), cm(AB), True),  # a claim added: Pending groups' free counts drop
        (cm({}), cm(A), True),
        (cm(A), cm({"a": {GPU: "0"}, "b": {GPU: "1,2"}}), True),  # one given, one taken
        (cm(AB), cm(A), False),  # only released: record_frees_devices wakes them
        (cm(A), cm(A, uids={"a": "u1"}), False),
        (cm(A), cm("["), False),  # broken: the group scheduler reports that instead
    ],
    ids=["claim-added", "first-claim", "swapped", "released", "uid", "broken"],
)
def test_updates_that_take_devices_recheck_pending_messages(
    old: dict, new: dict, takes: bool
) -> None:
    assert record_takes_devices.update(old, new) is takes


def test_a_created_record_with_claims_takes_devices_and_a_delete_takes_none() -> None:
    assert record_takes_devices.create(cm(A))
    assert not record_takes_devices.create(cm({}))
    assert not record_takes_devices.delete(cm(A))
