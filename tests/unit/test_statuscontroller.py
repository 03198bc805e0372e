"""The status controller's writes: only when the pod list changes, UID-guarded, its events
coalesced per group, and the cached group never copied nor changed."""

from __future__ import annotations

import copy
from typing import Any

import anyio
import pytest

from api.constants import GROUP_ANNOTATION, SDG_KIND
from api.pods import POD_GROUP_INDEX
from controllers.podevents import PodEvents
from controllers.statuscontroller import StatusController
from sdgruntime import errors
from sdgruntime.envtest import FakeClient, FakeRecorder
from sdgruntime.kinds import PODS
from sdgruntime.reconcile import Request
from tests import factories
from tests.factories import pod

pytestmark = pytest.mark.anyio


class Cache:
    def __init__(self) -> None:
        self.groups: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.copies = 0
        self.lists = 0

    def get(self, kind: Any, name: str, namespace: str | None = None, *, copy: bool = True) -> Any:
        assert kind == SDG_KIND
        if name not in self.groups:
            raise errors.NotFound(f"{name} not found")
        self.copies += copy
        return self.groups[name]

    def list(self, kind: Any, *, index: str, value: str, copy: bool = True) -> list[Any]:
        assert kind == PODS and index == POD_GROUP_INDEX
        self.copies += copy
        self.lists += 1
        return [p for p in self.pods if p["metadata"]["annotations"][GROUP_ANNOTATION] == value]


class Server(FakeClient):
    """The API server's groups (status a subresource). The test's cache is apart, as an
    informer's copy is: ``put`` stores a group in both."""

    def __init__(self) -> None:
        super().__init__(status_subresource=[SDG_KIND])

    def put(self, cache: Cache | None, obj: dict[str, Any]) -> None:
        stored = self.add(SDG_KIND, obj)
        if cache is not None:
            cache.groups[obj["metadata"]["name"]] = stored

    def patched(self) -> list[str]:
        return [a.name or "" for a in self.writes() if a.verb == "patch"]

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.stored(SDG_KIND, name).get("status") or {})


class Recorder(FakeRecorder):
    @property
    def events(self) -> list[tuple[str, str]]:
        """(reason, message) of each event, in order."""
        return [(e.reason, e.message) for e in self.recorded]


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def group(name: str = "g", **status: Any) -> dict[str, Any]:
    """A group as the API server holds it: Bound (no node: this controller reads none),
    its uid ``uid-<name>``, with ``status`` merged in."""
    return factories.group(name, uid=f"uid-{name}", rv=1, phase="Bound", status=status)


def controller() -> tuple[StatusController, Cache, Server, Recorder, Clock]:
    cache, rec, clock = Cache(), Recorder(), Clock()
    server = Server()
    events = PodEvents(rec, quiet=5.0, clock=clock)
    sc = StatusController(server, cache, rec, events=events, clock=clock)  # type: ignore[arg-type]
    return sc, cache, server, rec, clock


async def test_writes_the_pod_list_uid_guarded_and_tells_one_event_per_burst() -> None:
    sc, cache, server, rec, clock = controller()
    server.put(cache, group(podCount=0))
    cache.pods = [pod("a", "g")]
    await sc.reconcile(Request("g"))
    assert server.status("g") == {"phase": "Bound", "allocatedPods": ["ns/a"], "podCount": 1}
    cache.groups["g"]["status"] = server.status("g")  # the write's echo
    cache.pods.append(pod("b", "g"))
    clock.t += sc.batch_period
    await sc.reconcile(Request("g"))
    assert server.status("g")["allocatedPods"] == ["ns/a", "ns/b"]
    assert server.patched() == ["g", "g"]
    assert rec.events == []  # not yet: the burst may go on
    clock.t += 5
    sc.events.flush_due()
    assert rec.events == [("PodsJoined", "pods joined: ns/a, ns/b")]
    # about the group as written last (the write's answer is its metadata alone)
    about = rec.recorded[0].object
    assert about["kind"] == "SharedDeviceGroup" and about["metadata"]["uid"] == "uid-g"
    stored = server.stored(SDG_KIND, "g")["metadata"]["resourceVersion"]
    assert about["metadata"]["resourceVersion"] == stored


async def test_a_group_recreated_under_the_same_name_is_not_written() -> None:
    # The cache still holds the old group (uid-g); the server has a new one of that name.
    sc, cache, server, _, _ = controller()
    server.put(cache, group(podCount=0))
    server.put(None, {**group(podCount=0), "metadata": {"name": "g", "uid": "new"}})
    cache.pods = [pod("a", "g")]
    with pytest.raises(errors.Conflict, match="uid"):
        await sc.reconcile(Request("g"))  # retried, from the cache's new copy by then
    assert server.status("g") == {"phase": "Bound", "podCount": 0}


async def test_a_burst_is_written_once_per_batch_period_and_the_first_at_once() -> None:
    sc, cache, server, _, clock = controller()
    server.put(cache, group(podCount=0))
    cache.pods = [pod("a", "g")]
    assert await sc.reconcile(Request("g")) is None  # the first change: written at once
    cache.groups["g"]["status"] = server.status("g")
    lists = cache.lists
    for i, name in enumerate(("b", "c", "d")):
        clock.t += 0.25
        cache.pods.append(pod(name, "g"))
        result = await sc.reconcile(Request("g"))
        assert result is not None and result.requeue_after == pytest.approx(0.75 - 0.25 * i)
    assert server.patched() == ["g"]  # b, c and d wait for the period's end
    assert cache.lists == lists  # ... and meanwhile no reconcile reads the group's pods
    clock.t += 0.25
    assert await sc.reconcile(Request("g")) is None
    assert server.status("g")["podCount"] == 4  # all three in one write
    # State is kept only for the last period's writes, and not for a deleted group.
    assert len(sc) == 1
    del cache.groups["g"]
    await sc.reconcile(Request("g"))
    assert len(sc) == 0


async def test_writes_of_past_periods_are_forgotten() -> None:
    sc, cache, server, _, clock = controller()
    for name in ("g1", "g2", "g3"):
        server.put(cache, group(name, podCount=0))
        cache.pods.append(pod(f"p-{name}", name))
        await sc.reconcile(Request(name))
    assert len(sc) == 3 and server.patched() == ["g1", "g2", "g3"]
    clock.t += sc.batch_period
    server.put(cache, group("g4", podCount=0))
    cache.pods.append(pod("p-g4", "g4"))
    await sc.reconcile(Request("g4"))
    assert len(sc) == 1  # g1-g3 wrote a period ago: nothing of theirs is kept


async def test_nothing_changed_nothing_written_and_nothing_copied() -> None:
    sc, cache, server, _, _ = controller()
    server.put(cache, group(allocatedPods=["ns/a"], podCount=1))
    cache.pods = [pod("a", "g"), pod("done", "g", phase="Succeeded")]
    before = copy.deepcopy(cache.groups["g"])
    await sc.reconcile(Request("g"))
    assert server.patched() == [] and len(sc.events) == 0
    cache.pods = [pod("b", "g")]
    await sc.reconcile(Request("g"))
    assert cache.copies == 0
    assert cache.groups["g"] == before  # read in place, never edited
    assert server.status("g") == {"phase": "Bound", "allocatedPods": ["ns/b"], "podCount": 1}


async def test_a_new_group_without_the_fields_is_not_written() -> None:
    sc, cache, server, _, _ = controller()
    server.put(cache, group())
    await sc.reconcile(Request("g"))
    assert server.patched() == []


async def test_pods_that_left_are_told_too() -> None:
    sc, cache, server, rec, clock = controller()
    server.put(cache, group(allocatedPods=["ns/a", "ns/b"], podCount=2))
    cache.pods = [pod("b", "g")]
    await sc.reconcile(Request("g"))
    clock.t += 5
    sc.events.flush_due()
    assert rec.events == [("PodsLeft", "pods left: ns/a")]


async def test_a_gone_group_has_its_events_told_and_its_state_dropped() -> None:
    sc, cache, server, rec, _ = controller()
    server.put(cache, group(podCount=0))
    cache.pods = [pod("a", "g")]
    await sc.reconcile(Request("g"))
    assert len(sc.events) == 1
    del cache.groups["g"]
    await sc.reconcile(Request("g"))
    assert rec.events == [("PodsJoined", "pods joined: ns/a")]
    assert len(sc.events) == 0


async def test_a_group_deleted_under_the_write_is_not_an_error() -> None:
    sc, cache, server, rec, _ = controller()
    server.put(cache, group(podCount=0))
    await server.delete(SDG_KIND, "g")  # the cache has not seen it go yet
    cache.pods = [pod("a", "g")]
    assert await sc.reconcile(Request("g")) is None
    assert len(sc.events) == 0 and rec.events == []


async def test_its_own_write_coming_back_needs_no_reconcile_anything_else_does() -> None:
    sc, cache, server, _, _ = controller()
    server.put(cache, group(podCount=0))
    assert not sc.is_echo(cache.groups["g"])  # nothing written yet
    cache.pods = [pod("a", "g")]
    await sc.reconcile(Request("g"))
    echo = copy.deepcopy(server.stored(SDG_KIND, "g"))
    other = copy.deepcopy(echo)
    other["metadata"]["resourceVersion"] = "999"  # another writer's version after ours
    assert not sc.is_echo(other)
    assert sc.is_echo(echo)
    assert not sc.is_echo(echo)  # seen once: the same version again is not skipped
    # A group gone takes its entry with it (at most one per cached group).
    cache.pods.append(pod("b", "g"))
    sc.batch_period = 0
    await sc.reconcile(Request("g"))
    del cache.groups["g"]
    await sc.reconcile(Request("g"))
    assert not sc.is_echo(server.stored(SDG_KIND, "g"))


def held_controller() -> tuple[StatusController, Cache, Server, Clock, list[bool]]:
    """A controller whose writes wait while ``busy[0]`` (pods wait to be bound)."""
    sc, cache, server, _, clock = controller()
    busy = [True]
    sc.busy = lambda: busy[0]
    return sc, cache, server, clock, busy


async def test_writes_wait_for_the_binds_and_go_once_no_pod_waits() -> None:
    sc, cache, server, clock, busy = held_controller()
    for name in ("g1", "g2"):
        server.put(cache, group(name, podCount=0))
        cache.pods.append(pod(f"p-{name}", name))
        assert await sc.reconcile(Request(name)) is None
    assert server.patched() == [] and cache.lists == 0  # held: not even the pods read
    clock.t += 1
    assert sc.due_held(clock.t) == []  # pods still wait to be bound
    busy[0] = False
    assert sc.due_held(clock.t) == ["g1", "g2"]  # the queue emptied: all of them, now
    for name in ("g1", "g2"):
        await sc.reconcile(Request(name))
    assert server.patched() == ["g1", "g2"]
    assert server.status("g1")["podCount"] == 1
    assert sc.due_held(clock.t) == []  # written: nothing of theirs is held


async def test_a_hold_ends_after_hold_seconds_even_while_pods_wait() -> None:
    """A steady stream of pods keeps the queue busy: each group is still written once
    per ``hold``, so its status is never more than that behind."""
    sc, cache, server, clock, _ = held_controller()
    server.put(cache, group("old", podCount=0))
    cache.pods.append(pod("a", "old"))
    await sc.reconcile(Request("old"))
    clock.t += sc.hold / 2
    server.put(cache, group("new", podCount=0))
    cache.pods.append(pod("b", "new"))
    await sc.reconcile(Request("new"))
    clock.t += sc.hold / 2
    assert sc.due_held(clock.t) == ["old"]  # oldest first; "new" has half its hold left
    await sc.reconcile(Request("old"))
    assert server.patched() == ["old"]
    # The next change is held anew, from its own first wait.
    cache.groups["old"]["status"] = server.status("old")
    cache.pods.append(pod("c", "old"))
    clock.t += sc.batch_period
    await sc.reconcile(Request("old"))
    assert server.patched() == ["old"]
    assert sc.due_held(clock.t + sc.hold / 2) == ["new"]


async def test_a_held_group_that_goes_is_forgotten() -> None:
    sc, cache, server, clock, busy = held_controller()
    server.put(cache, group(podCount=0))
    cache.pods.append(pod("a", "g"))
    await sc.reconcile(Request("g"))
    del cache.groups["g"]
    await sc.reconcile(Request("g"))
    busy[0] = False
    assert sc.due_held(clock.t) == [] and server.patched() == []


async def test_held_groups_are_woken_when_due() -> None:
    sc, cache, server, _, busy = held_controller()
    server.put(cache, group(podCount=0))
    cache.pods.append(pod("a", "g"))
    woken: list[Request] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(sc.release_held, woken.append)
        await anyio.sleep(0.3)
        assert woken == []  # nothing held: the runner sleeps
        await sc.reconcile(Request("g"))  # held
        await anyio.sleep(0.3)
        assert woken == []  # pods still wait to be bound
        busy[0] = False
        await anyio.sleep(0.3)  # one HOLD_TICK and a little
        tg.cancel_scope.cancel()
    assert woken and set(woken) == {Request("g")}


async def test_without_busy_nothing_is_held() -> None:
    sc, cache, server, _, clock = controller()
    server.put(cache, group(podCount=0))
    cache.pods.append(pod("a", "g"))
    await sc.reconcile(Request("g"))
    assert server.patched() == ["g"] and sc.due_held(clock.t) == []
