"""The ledger's typed read model: holder names round-trip, and ``Ledger.view`` says who
holds each device in the same merge placement reads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controllers.holders import KubeletHold
from controllers.ledger.book import Ledger
from controllers.ledger.records import encode_claims
from controllers.ledger.view import (
    Conflict,
    Group,
    Holder,
    Malformed,
    Pod,
    ResourceClaim,
    SameDevice,
    Unavailable,
    describe,
    groups_in,
    key,
    parse,
)
from tests.factories import group, record

GPU = "nvidia.com/gpu"

names = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)
simple: st.SearchStrategy[Holder] = st.one_of(
    st.builds(Group, names),
    st.builds(ResourceClaim, names, names),
    st.builds(Pod, names, names),
    st.just(Malformed()),
    st.just(Unavailable()),
)
holders = st.one_of(
    simple,
    st.builds(SameDevice, simple),
    st.builds(
        lambda hs: Conflict(tuple(sorted(hs, key=key))),
        st.lists(st.one_of(simple, st.builds(SameDevice, simple)), min_size=2, unique_by=key),
    ),
)


@given(holders)
def test_every_holder_name_reads_back_as_its_holder(holder: Holder) -> None:
    assert parse(key(holder)) == holder
    assert describe(holder)


def test_the_view_names_groups_conflicts_pods_and_unreadable_records() -> None:
    book = Ledger(None, "ns")
    book.set_capacity("n0", {GPU: 4})
    book.observe(record("n0", encode_claims({"a": {GPU: [0]}, "b": {GPU: [1]}})))
    book.observe_group(group("c", node="n0", devices={GPU: "1"}))
    book.set_kubelet_hold("n0", "ml/train", KubeletHold({GPU: 1}, {GPU: ("3",)}))
    view = book.view("n0")
    assert view.holders[(GPU, 0)] == Group("a")
    assert view.holders[(GPU, 1)] == Conflict((Group("b"), Group("c")))
    assert view.holders[(GPU, 3)] == Pod("ml", "train")
    assert view.free(GPU) == [2]
    assert view.held_by("a") == {GPU: [0]}
    assert groups_in(view.holders[(GPU, 1)]) == {"b", "c"}
    assert list(view.conflicts()) == [(GPU, 1)]
    assert view.broken is None

    book.observe(record("n0", "not json", rv=2))
    broken = book.view("n0")
    assert broken.broken and "not JSON" in broken.broken
    assert broken.free(GPU) == [] and Malformed() in broken.holders.values()
