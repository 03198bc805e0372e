"""Which claim record events wake the Pending groups: those that can free devices at
once, those that take devices after a delay (a Pending message counts free devices),
and how that delayed pass folds a burst into one."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from controllers.groupscheduler import PendingRecheck
from controllers.watches import record_frees_devices, record_takes_devices
from sdgruntime.reconcile import Request
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


class Gate:
    """A ``sleep`` the test ends: records each delay asked for."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.release = anyio.Event()

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.release = anyio.Event()
        await self.release.wait()


@pytest.mark.anyio
async def test_a_burst_of_takes_costs_one_pass_over_the_groups_pending_then() -> None:
    pending, gate = ["a"], Gate()
    queued: list[Request] = []
    recheck = PendingRecheck(3.0, lambda: [Request(n) for n in pending], sleep=gate.sleep)
    async with anyio.create_task_group() as tg:
        tg.start_soon(recheck.run, queued.append)
        await anyio.wait_all_tasks_blocked()
        assert gate.delays == []  # nothing taken yet: no pass waits
        recheck.poke()
        recheck.poke()
        await anyio.wait_all_tasks_blocked()
        assert gate.delays == [3.0]
        recheck.poke()  # while the pass waits: it joins that pass
        pending.append("b")  # Pending when the pass runs: judged too
        gate.release.set()
        await anyio.wait_all_tasks_blocked()
        assert queued == [Request("a"), Request("b")]
        assert gate.delays == [3.0]  # no poke since the pass: nothing more
        recheck.poke()
        await anyio.wait_all_tasks_blocked()
        assert gate.delays == [3.0, 3.0]
        gate.release.set()
        await anyio.wait_all_tasks_blocked()
        assert queued == [Request("a"), Request("b"), Request("a"), Request("b")]
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_take_before_the_pass_runs_is_not_lost() -> None:
    queued: list[Request] = []
    gate = Gate()
    recheck = PendingRecheck(3.0, lambda: [Request("a")], sleep=gate.sleep)
    recheck.poke()  # before run (e.g. before leadership): the first pass owes it
    async with anyio.create_task_group() as tg:
        tg.start_soon(recheck.run, queued.append)
        await anyio.wait_all_tasks_blocked()
        assert gate.delays == [3.0]
        gate.release.set()
        await anyio.wait_all_tasks_blocked()
        assert queued == [Request("a")]
        tg.cancel_scope.cancel()
