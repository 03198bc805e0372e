"""The pod scheduler's assumed pods: what a fit check counts on a node before the cache
shows a bind, and when it stops counting it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from api.pods import POD_NODE_INDEX, index_by_node
from controllers.podscheduler import AssumedPods, PodScheduler
from sdgruntime.cache import Cache
from sdgruntime.envtest import FakeClient
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import NODES, PODS, Kind
from sdgruntime.reconcile import Request, Result
from tests import factories
from tests.factories import GPU, as_client, pod, running_cache, settle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_assumed_pod_counts_on_its_node_only() -> None:
    assumed = AssumedPods(ttl=30, clock=Clock())
    assumed.assume("ns/a", "n1", pod("a"))
    assert assumed.on("n1", []) == [pod("a")]
    assert assumed.on("n2", []) == []


def test_once_the_cache_shows_the_pod_it_is_not_counted_twice_and_is_dropped() -> None:
    assumed = AssumedPods(ttl=30, clock=Clock())
    assumed.assume("ns/a", "n1", pod("a"))
    assumed.assume("ns/b", "n1", pod("b"))
    assert assumed.on("n1", [pod("a")]) == [pod("b")]
    assert len(assumed) == 1
    assert assumed.on("n1", []) == [pod("b")]  # a is gone for good


def test_an_unconfirmed_bind_expires_after_the_ttl() -> None:
    clock = Clock()
    assumed = AssumedPods(ttl=30, clock=clock)
    assumed.assume("ns/a", "n1", pod("a"))
    clock.now += 29
    assert assumed.on("n1", []) == [pod("a")]
    clock.now += 2
    assert assumed.on("n1", []) == []
    assert len(assumed) == 0


def test_reassuming_moves_the_pod_and_forget_removes_it() -> None:
    assumed = AssumedPods(ttl=30, clock=Clock())
    assumed.assume("ns/a", "n1", pod("a"))
    assumed.assume("ns/a", "n2", pod("a"))
    assert assumed.on("n1", []) == []
    assert assumed.on("n2", []) == [pod("a")]
    assumed.forget("ns/a")
    assumed.forget("ns/a")  # idempotent
    assert assumed.on("n2", []) == [] and len(assumed) == 0


def test_expired_pods_on_nodes_nobody_checks_are_swept_by_later_assumes() -> None:
    clock = Clock()
    assumed = AssumedPods(ttl=30, clock=clock)
    for i in range(100):
        assumed.assume(f"ns/p{i}", f"idle-{i}", pod(f"p{i}"))
    clock.now += 31
    assumed.assume("ns/new", "busy", pod("new"))
    assert len(assumed) == 1  # memory stays bounded by the binds of the last ttl


class SlowBinds(FakeClient):
    """An API server whose Binding POSTs wait until ``release`` is set."""

    def __init__(self, *objects: tuple[Kind, dict[str, Any]]) -> None:
        super().__init__(objects)
        self.release = anyio.Event()

    async def bind(
        self, namespace: str, pod_name: str, node_name: str, *, pod_uid: str | None = None
    ) -> None:
        await self.release.wait()
        await super().bind(namespace, pod_name, node_name, pod_uid=pod_uid)


@pytest.mark.anyio
async def test_two_pods_reconciled_at_once_never_both_take_a_nodes_last_room() -> None:
    """While the first pod's bind is in flight, the second pod's fit check counts it (it is
    assumed before the bind is sent): one binds, the other is told why not."""
    group = factories.group("g", {GPU: 1}, node="n1", devices={GPU: "0"})
    room = factories.node("n1", {GPU: 8}, allocatable={"cpu": "1", "memory": "1Gi", "pods": "10"})
    pods = [factories.pod(name, "g", cpu="600m") for name in ("a", "b")]
    server = SlowBinds((SDG_KIND, group), (NODES, room), *((PODS, p) for p in pods))
    cache = Cache(as_client(server))
    cache.add_index(PODS, POD_NODE_INDEX, index_by_node)
    client = as_client(server)
    async with running_cache(cache, SDG_KIND, NODES, PODS):
        sched = PodScheduler(client, cache, EventRecorder(client, "deviceshare-scheduler"))
        results: dict[str, Any] = {}

        async def reconcile(name: str) -> None:
            results[name] = await sched.reconcile(Request(name, "ns"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(reconcile, "a")
            tg.start_soon(reconcile, "b")
            await settle()
            server.release.set()
    bound = {
        p["metadata"]["name"]: (p.get("spec") or {}).get("nodeName")
        for p in [server.stored(PODS, n, "ns") for n in ("a", "b")]
    }
    assert sorted(bound.values(), key=str) == [None, "n1"]
    refused = next(name for name, node in bound.items() if node is None)
    assert isinstance(results[refused], Result)
    condition = server.stored(PODS, refused, "ns")["status"]["conditions"][0]
    assert condition["reason"] == "Unschedulable" and "cpu" in condition["message"]
