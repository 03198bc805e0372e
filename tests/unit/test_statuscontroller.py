"""The status controller's writes: only when the pod list changes, UID-guarded, its events
coalesced per group, and the cached group never copied nor changed."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from api.constants import SDG_KIND
from api.pods import POD_GROUP_INDEX
from controllers.podevents import PodEvents
from controllers.statuscontroller import StatusController
from sdgruntime import errors
from sdgruntime.kinds import PODS
from sdgruntime.reconcile import Request

pytestmark = pytest.mark.anyio


class Cache:
    def __init__(self) -> None:
        self.groups: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.copies = 0

    def get(self, kind: Any, name: str, namespace: str | None = None, *, copy: bool = True) -> Any:
        assert kind == SDG_KIND
        if name not in self.groups:
            raise errors.NotFound(f"{name} not found")
        self.copies += copy
        return self.groups[name]

    def list(self, kind: Any, *, index: str, value: str, copy: bool = True) -> list[Any]:
        assert kind == PODS and index == POD_GROUP_INDEX
        self.copies += copy
        return [p for p in self.pods if p["metadata"]["annotations"]["g"] == value]


class Client:
    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.gone = False

    async def patch(self, kind: Any, name: str, body: dict[str, Any], **kw: Any) -> Any:
        assert kw == {"subresource": "status"}
        if self.gone:
            raise errors.NotFound(name)
        self.patches.append((name, copy.deepcopy(body)))
        obj = copy.deepcopy(self.cache.groups[name])
        obj["status"].update(body["status"])
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return obj


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def emit(self, obj: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def group(name: str = "g", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "status": {"phase": "Bound", **status},
    }


def pod(name: str, grp: str = "g", phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": {"g": grp}},
        "status": {"phase": phase},
    }


def controller() -> tuple[StatusController, Cache, Client, Recorder, Clock]:
    cache, rec, clock = Cache(), Recorder(), Clock()
    client = Client(cache)
    events = PodEvents(rec, quiet=5.0, clock=clock)  # type: ignore[arg-type]
    sc = StatusController(client, cache, rec, events=events, clock=clock)  # type: ignore[arg-type]
    return sc, cache, client, rec, clock


async def test_writes_the_pod_list_uid_guarded_and_tells_one_event_per_burst() -> None:
    sc, cache, client, rec, clock = controller()
    cache.groups["g"] = group(podCount=0)
    cache.pods = [pod("a")]
    await sc.reconcile(Request("g"))
    cache.groups["g"] = group(allocatedPods=["ns/a"], podCount=1)  # the write's echo
    cache.pods.append(pod("b"))
    clock.t += sc.batch_period
    await sc.reconcile(Request("g"))
    assert client.patches == [
        ("g", {"metadata": {"uid": "uid-g"}, "status": {"allocatedPods": ["ns/a"], "podCount": 1}}),
        (
            "g",
            {
                "metadata": {"uid": "uid-g"},
                "status": {"allocatedPods": ["ns/a", "ns/b"], "podCount": 2},
            },
        ),
    ]
    assert rec.events == []  # not yet: the burst may go on
    clock.t += 5
    sc.events.flush_due()
    assert rec.events == [("PodsJoined", "pods joined: ns/a, ns/b")]


async def test_a_burst_is_written_once_per_batch_period_and_the_first_at_once() -> None:
    sc, cache, client, _, clock = controller()
    cache.groups["g"] = group(podCount=0)
    cache.pods = [pod("a")]
    assert await sc.reconcile(Request("g")) is None  # the first change: written at once
    cache.groups["g"] = group(allocatedPods=["ns/a"], podCount=1)
    for i, name in enumerate(("b", "c", "d")):
        clock.t += 0.25
        cache.pods.append(pod(name))
        result = await sc.reconcile(Request("g"))
        assert result is not None and result.requeue_after == pytest.approx(0.75 - 0.25 * i)
    assert len(client.patches) == 1  # b, c and d wait for the period's end
    clock.t += 0.25
    assert await sc.reconcile(Request("g")) is None
    assert client.patches[-1][1]["status"]["podCount"] == 4  # all three in one write
    # State is kept only for the last period's writes, and not for a deleted group.
    assert len(sc) == 1
    del cache.groups["g"]
    await sc.reconcile(Request("g"))
    assert len(sc) == 0


async def test_writes_of_past_periods_are_forgotten() -> None:
    sc, cache, client, _, clock = controller()
    for name in ("g1", "g2", "g3"):
        cache.groups[name] = group(name, podCount=0)
        cache.pods.append(pod(f"p-{name}", grp=name))
        await sc.reconcile(Request(name))
    assert len(sc) == 3 and len(client.patches) == 3
    clock.t += sc.batch_period
    cache.groups["g4"] = group("g4", podCount=0)
    cache.pods.append(pod("p-g4", grp="g4"))
    await sc.reconcile(Request("g4"))
    assert len(sc) == 1  # g1-g3 wrote a period ago: nothing of theirs is kept


async def test_nothing_changed_nothing_written_and_nothing_copied() -> None:
    sc, cache, client, _, _ = controller()
    cache.groups["g"] = group(allocatedPods=["ns/a"], podCount=1)
    cache.pods = [pod("a"), pod("done", phase="Succeeded")]
    before = copy.deepcopy(cache.groups["g"])
    await sc.reconcile(Request("g"))
    assert client.patches == [] and len(sc.events) == 0
    cache.pods = [pod("b")]
    await sc.reconcile(Request("g"))
    assert cache.copies == 0
    assert cache.groups["g"] == before  # read in place, never edited
    assert client.patches[0][1]["status"] == {"allocatedPods": ["ns/b"], "podCount": 1}


async def test_a_new_group_without_the_fields_is_not_written() -> None:
    sc, cache, client, _, _ = controller()
    cache.groups["g"] = group()
    await sc.reconcile(Request("g"))
    assert client.patches == []


async def test_pods_that_left_are_told_too() -> None:
    sc, cache, _, rec, clock = controller()
    cache.groups["g"] = group(allocatedPods=["ns/a", "ns/b"], podCount=2)
    cache.pods = [pod("b")]
    await sc.reconcile(Request("g"))
    clock.t += 5
    sc.events.flush_due()
    assert rec.events == [("PodsLeft", "pods left: ns/a")]


async def test_a_gone_group_has_its_events_told_and_its_state_dropped() -> None:
    sc, cache, _, rec, _ = controller()
    cache.groups["g"] = group(podCount=0)
    cache.pods = [pod("a")]
    await sc.reconcile(Request("g"))
    assert len(sc.events) == 1
    del cache.groups["g"]
    await sc.reconcile(Request("g"))
    assert rec.events == [("PodsJoined", "pods joined: ns/a")]
    assert len(sc.events) == 0


async def test_a_group_deleted_under_the_write_is_not_an_error() -> None:
    sc, cache, client, rec, _ = controller()
    cache.groups["g"] = group(podCount=0)
    cache.pods = [pod("a")]
    client.gone = True
    assert await sc.reconcile(Request("g")) is None
    assert len(sc.events) == 0 and rec.events == []
