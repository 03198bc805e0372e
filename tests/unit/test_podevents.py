"""PodsJoined / PodsLeft coalescing: one event per group per burst (told once the group is
quiet, and not later than a bound), nothing lost, bounded."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from controllers.podevents import EVENT_PODS, BurstTeller, PodEvents
from sdgruntime.envtest import FakeRecorder
from tests import factories


class Recorder(FakeRecorder):
    @property
    def events(self) -> list[tuple[str, str, str, str]]:
        """(uid, type, reason, message) of each event, in order."""
        return [(e.uid, e.type, e.reason, e.message) for e in self.recorded]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def group(name: str = "g", uid: str = "u1", rv: str = "1") -> dict[str, Any]:
    return factories.group(name, uid=uid, rv=rv, phase="Bound")


def make(quiet: float = 5.0, longest: float = 30.0) -> tuple[PodEvents, Recorder, Clock]:
    rec, clock = Recorder(), Clock()
    ev = PodEvents(rec, quiet=quiet, longest=longest, clock=clock)
    return ev, rec, clock


def test_a_burst_of_writes_is_one_event_once_the_group_is_quiet() -> None:
    ev, rec, clock = make()
    ev.record(group(rv="1"), ["ns/a"], [])
    clock.t += 4
    ev.record(group(rv="2"), ["ns/b"], [])
    clock.t += 4.9  # 8.9 s after the first change, 4.9 s after the last
    assert ev.flush_due() == pytest.approx(0.1)
    assert rec.events == []
    clock.t += 0.1
    assert ev.flush_due() is None
    assert rec.events == [("u1", "Normal", "PodsJoined", "pods joined: ns/a, ns/b")]
    assert len(ev) == 0 and ev._heap == []  # nothing kept once told


def test_a_group_that_never_rests_is_told_after_the_longest_wait() -> None:
    ev, rec, clock = make(quiet=5, longest=30)
    for i in range(10):  # a pod every 4 s, for 40 s
        ev.flush_due()  # as the runner would
        ev.record(group(), [f"ns/p{i}"], [])
        clock.t += 4
    # the first eight (t = 0..28) went out at t = 30; the last two wait for quiet
    assert [m for *_, m in rec.events] == [
        "pods joined: " + ", ".join(f"ns/p{i}" for i in range(8))
    ]
    clock.t += 1
    ev.flush_due()
    assert rec.events[-1][3] == "pods joined: ns/p8, ns/p9"


def test_joined_and_left_are_both_told() -> None:
    ev, rec, clock = make()
    ev.record(group(), ["ns/a", "ns/b"], [])
    ev.record(group(), [], ["ns/a"])
    clock.t += 5
    ev.flush_due()
    assert [(r, m) for _, _, r, m in rec.events] == [
        ("PodsJoined", "pods joined: ns/a, ns/b"),
        ("PodsLeft", "pods left: ns/a"),
    ]


def test_a_pod_told_twice_is_named_once() -> None:
    ev, rec, clock = make()
    ev.record(group(rv="1"), ["ns/a"], [])
    ev.record(group(rv="2"), ["ns/a", "ns/b"], [])  # the cache was behind our first write
    clock.t += 5
    ev.flush_due()
    assert [m for *_, m in rec.events] == ["pods joined: ns/a, ns/b"]


def test_names_are_capped_and_the_rest_counted_across_writes() -> None:
    ev, rec, clock = make()
    ev.record(group(), [f"ns/p{i:02d}" for i in range(7)], [])
    ev.record(group(), [f"ns/p{i:02d}" for i in range(7, 15)], [])
    clock.t += 5
    ev.flush_due()
    ((_, _, _, message),) = rec.events
    named = ", ".join(f"ns/p{i:02d}" for i in range(EVENT_PODS))
    assert message == f"pods joined: {named} and {15 - EVENT_PODS} more"


def test_each_group_has_its_own_window_in_order() -> None:
    ev, rec, clock = make()
    ev.record(group("g1", "u1"), ["ns/a"], [])
    clock.t += 2
    ev.record(group("g2", "u2"), ["ns/b"], [])
    clock.t += 3
    assert ev.flush_due() == pytest.approx(2)
    assert [m for *_, m in rec.events] == ["pods joined: ns/a"]
    clock.t += 2
    ev.flush_due()
    assert [m for *_, m in rec.events] == ["pods joined: ns/a", "pods joined: ns/b"]


def test_the_event_names_the_newest_write_of_the_group() -> None:
    seen: list[dict[str, Any]] = []
    ev, rec, clock = make()
    rec.emit = lambda obj, *_a: seen.append(obj)  # type: ignore[method-assign]
    ev.record(group(rv="1"), ["ns/a"], [])
    ev.record(group(rv="7"), ["ns/b"], [])
    clock.t += 5
    ev.flush_due()
    assert seen[0]["metadata"] == {"name": "g", "uid": "u1", "resourceVersion": "7"}
    assert seen[0]["kind"] == "SharedDeviceGroup"
    assert "status" not in seen[0]  # a reference, not the whole object kept for 5 s


def test_a_recreated_group_does_not_inherit_the_old_ones_pods() -> None:
    ev, rec, clock = make()
    ev.record(group(uid="old"), ["ns/a"], [])
    ev.record(group(uid="new"), ["ns/b"], [])
    assert rec.events == [("old", "Normal", "PodsJoined", "pods joined: ns/a")]
    clock.t += 5
    ev.flush_due()
    assert rec.events[1] == ("new", "Normal", "PodsJoined", "pods joined: ns/b")


def test_a_gone_group_is_told_at_once_and_forgotten() -> None:
    ev, rec, _ = make()
    ev.record(group(), [], ["ns/a"])
    ev.flush("g")
    assert rec.events == [("u1", "Normal", "PodsLeft", "pods left: ns/a")]
    assert len(ev) == 0
    ev.flush("g")  # nothing pending: nothing more
    assert len(rec.events) == 1


def test_no_change_no_state() -> None:
    ev, rec, _ = make()
    ev.record(group(), [], [])
    assert len(ev) == 0 and rec.events == []


def test_zero_quiet_tells_every_write() -> None:
    ev, rec, _ = make(quiet=0)
    ev.record(group(), ["ns/a"], [])
    ev.record(group(), ["ns/b"], [])
    assert [m for *_, m in rec.events] == ["pods joined: ns/a", "pods joined: ns/b"]
    assert len(ev) == 0


@pytest.mark.parametrize("delay", [-1.0, float("nan"), float("inf")])
def test_waits_must_be_real_waits(delay: float) -> None:
    with pytest.raises(ValueError, match="quiet"):
        PodEvents(Recorder(), quiet=delay)
    with pytest.raises(ValueError, match="longest"):
        PodEvents(Recorder(), longest=delay)


@pytest.mark.anyio
async def test_run_tells_when_due_and_what_is_left_when_stopped() -> None:
    rec = Recorder()
    ev = PodEvents(rec, quiet=0.05)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ev.run)
        await anyio.sleep(0.01)
        ev.record(group("g1", "u1"), ["ns/a"], [])  # wakes the idle runner
        with anyio.fail_after(2):
            await rec.emitted.wait()
        assert rec.events == [("u1", "Normal", "PodsJoined", "pods joined: ns/a")]
        ev.record(group("g2", "u2"), ["ns/b"], [])
        tg.cancel_scope.cancel()  # leadership lost before it was due
    assert rec.events[-1] == ("u2", "Normal", "PodsJoined", "pods joined: ns/b")
    assert len(ev) == 0


@pytest.mark.anyio
async def test_one_wake_tells_every_group_due_by_then() -> None:
    """A burst over many groups has a due per group: the runner tells them in a few wakes
    (at most one per EVENT_TICK), not one wake per group, and loses none."""
    rec = Recorder()
    ev = PodEvents(rec, quiet=0.3)
    wakes = 0
    flush_due = ev.flush_due

    def counted() -> float | None:
        nonlocal wakes
        wakes += 1
        return flush_due()

    ev.flush_due = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(ev.run)
        for i in range(50):  # dues 2 ms apart
            ev.record(group(f"g{i}", f"u{i}"), [f"ns/p{i}"], [])
            await anyio.sleep(0.002)
        with anyio.fail_after(5):
            while len(rec.events) < 50:
                rec.emitted = anyio.Event()
                await rec.emitted.wait()
        tg.cancel_scope.cancel()
    assert sorted(e[0] for e in rec.events) == sorted(f"u{i}" for i in range(50))
    assert wakes <= 12  # before: a wake per group (51)


def teller(quiet: float = 5.0, longest: float = 30.0) -> tuple[BurstTeller, Clock]:
    clock = Clock()
    return BurstTeller(quiet=quiet, longest=longest, clock=clock), clock


def test_a_burst_of_binds_tells_its_first_bind_only() -> None:
    tell, clock = teller()
    told = []
    for _ in range(10):
        told.append(tell.tell("g"))
        clock.t += 1.0  # closer together than quiet
    assert told == [True] + [False] * 9
    clock.t += 5.0  # the group rested: a new burst
    assert tell.tell("g")


def test_a_group_that_never_rests_tells_one_bind_per_longest() -> None:
    tell, clock = teller(quiet=5.0, longest=30.0)
    told_at = []
    for _ in range(40):
        if tell.tell("g"):
            told_at.append(clock.t)
        clock.t += 4.0
    assert told_at == [100.0, 132.0, 164.0, 196.0, 228.0]  # 40 binds, 4 s apart


def test_each_group_has_its_own_burst() -> None:
    tell, clock = teller()
    assert tell.tell("a") and tell.tell("b")
    clock.t += 1.0
    assert not tell.tell("a") and not tell.tell("b")
    assert tell.tell("c")


def test_groups_bound_longest_ago_are_forgotten() -> None:
    tell, clock = teller(quiet=5.0, longest=30.0)
    for i in range(100):
        tell.tell(f"g{i}")
    assert len(tell) == 100
    clock.t += 30.0
    assert tell.tell("g0")  # long rested: told, and the stale entries are gone
    assert len(tell) == 1
