"""What a node's pods take (``NodeBook``): the cached ones and the assumed ones a fit
check counts before the cache shows a bind, and when each stops counting."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from api.pods import is_active
from controllers.nodebook import NodeBook
from controllers.podfit import NO_SHARE, NodeUsage, Share, share_of, usage_of
from controllers.podscheduler import PodScheduler
from sdgruntime.cache import Cache
from sdgruntime.envtest import FakeClient
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import NODES, PODS, Kind, spec_of
from sdgruntime.reconcile import Request, Result
from tests import factories
from tests.factories import GPU, as_client, running_cache, settle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cpu_pod(name: str, cpu: str = "500m", node: str | None = None, **kw: Any) -> dict[str, Any]:
    return factories.pod(name, cpu=cpu, node=node, **kw)


def share(cpu: str = "500m") -> Share:
    return share_of(cpu_pod("x", cpu))


def test_an_assumed_pod_counts_on_its_node_only() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    book.assume("ns/a", "n1", share())
    assert book.usage("n1") == NodeUsage(1, {"cpu": 500})
    assert book.usage("n2") == NodeUsage()


def test_once_the_cache_shows_the_pod_it_is_counted_once_and_no_longer_assumed() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    book.assume("ns/a", "n1", share())
    book.assume("ns/b", "n1", share())
    book.pod_updated(cpu_pod("a"), cpu_pod("a", node="n1"))
    assert book.usage("n1") == NodeUsage(2, {"cpu": 1000})
    assert (len(book), book.assumed) == (2, 1)


def test_an_unconfirmed_bind_expires_after_the_ttl_a_confirmed_one_stays() -> None:
    clock = Clock()
    book = NodeBook(ttl=30, clock=clock)
    book.assume("ns/a", "n1", share())
    book.assume("ns/b", "n1", share())
    book.pod_added(cpu_pod("b", node="n1"))
    clock.now += 29
    assert book.usage("n1").pods == 2
    clock.now += 2
    assert book.usage("n1") == NodeUsage(1, {"cpu": 500})
    assert (len(book), book.assumed) == (1, 0)


def test_reassuming_moves_the_pod_and_forget_removes_only_an_assumed_one() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    book.assume("ns/a", "n1", share())
    book.assume("ns/a", "n2", share())
    assert book.usage("n1") == NodeUsage() and book.usage("n2").pods == 1
    book.forget("ns/a")
    book.forget("ns/a")  # idempotent
    assert book.usage("n2") == NodeUsage() and len(book) == 0
    book.pod_added(cpu_pod("c", node="n1"))
    book.forget("ns/c")  # the cache shows it bound: a failed bind elsewhere changes nothing
    assert book.usage("n1").pods == 1


def test_expired_binds_on_nodes_nobody_checks_go_at_the_next_assume() -> None:
    clock = Clock()
    book = NodeBook(ttl=30, clock=clock)
    for i in range(100):
        book.assume(f"ns/p{i}", f"idle-{i}", share())
    clock.now += 31
    book.assume("ns/new", "busy", share())
    assert len(book) == 1  # memory stays bounded by the binds of the last ttl
    assert book._nodes.keys() == {"busy"}


def test_a_finished_or_deleted_pod_frees_its_share_a_status_change_keeps_it() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    running = cpu_pod("a", node="n1", phase="Running")
    book.pod_added(running)
    book.pod_added(cpu_pod("b", node="n1", phase="Running"))
    book.pod_updated(running, {**running, "status": {"phase": "Running", "podIP": "10.0.0.9"}})
    assert book.usage("n1").pods == 2
    book.pod_updated(running, cpu_pod("a", node="n1", phase="Succeeded"))
    book.pod_deleted(cpu_pod("b", node="n1"))
    assert book.usage("n1") == NodeUsage() and book._nodes == {}


def test_a_resized_pod_counts_its_new_requests() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    before = cpu_pod("a", "500m", node="n1", phase="Running")
    book.pod_added(before)
    book.pod_updated(before, cpu_pod("a", "2", node="n1", phase="Running"))
    assert book.usage("n1") == NodeUsage(1, {"cpu": 2000})


def test_the_pod_itself_is_left_out_of_its_nodes_usage() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    book.assume("ns/a", "n1", share("1"))
    book.assume("ns/b", "n1", share("250m"))
    assert book.usage("n1", but="ns/a") == NodeUsage(1, {"cpu": 250})
    assert book.usage("n1") == NodeUsage(2, {"cpu": 1250})  # the totals are untouched


def test_host_ports_count_and_free_with_their_pods() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    web = cpu_pod("web", node="n1", phase="Running")
    web["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    book.pod_added(web)
    assert book.usage("n1").ports == Counter({("TCP", "0.0.0.0", 8080): 1})
    book.pod_deleted(web)
    assert book.usage("n1").ports == Counter()


def test_pods_that_take_nothing_cost_the_book_no_share_each() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    for i in range(3):
        book.pod_added(factories.pod(f"p{i}", node="n1", phase="Running"))
    assert book.usage("n1") == NodeUsage(3, {})
    assert {id(e.share) for e in book._entries.values()} == {id(NO_SHARE)}


def test_a_request_that_does_not_parse_counts_the_pod_without_it() -> None:
    book = NodeBook(ttl=30, clock=Clock())
    odd = cpu_pod("odd", "lots", node="n1", phase="Running")
    book.pod_added(odd)
    assert book.usage("n1") == NodeUsage(1, {})


def test_the_book_matches_the_pods_it_was_told_of_after_any_events() -> None:
    """Random adds, resizes, finishes, deletes, assumes of cached pending pods (as the
    scheduler makes them), failed binds and expiry: the book's usage of every node equals
    ``usage_of`` over the pods the cache holds bound there plus the cached versions of the
    live assumed ones, the pod itself left out."""
    rng = random.Random(7)
    clock = Clock()
    book = NodeBook(ttl=30, clock=clock)
    cached: dict[str, dict[str, Any]] = {}
    assumed: dict[str, tuple[str, float]] = {}
    for _ in range(3000):
        name = f"p{rng.randrange(40)}"
        key = f"ns/{name}"
        step = rng.random()
        clock.now += rng.random()
        old = cached.get(key)
        if step < 0.35:
            node = rng.choice([None, None, None, "n1", "n2", "n3"])  # most wait a while
            if old is not None and spec_of(old).get("nodeName"):
                node = spec_of(old)["nodeName"]  # a pod's node never changes
            new = cpu_pod(
                name,
                rng.choice(["100m", "1", "250m"]),
                node=node,
                phase=rng.choice(["Pending", "Running", "Succeeded"]),
            )
            cached[key] = new
            if old is None:
                book.pod_added(new)
            else:
                book.pod_updated(old, new)
            if node or not is_active(new):
                assumed.pop(key, None)
        elif step < 0.45 and old is not None:
            del cached[key]
            assumed.pop(key, None)
            book.pod_deleted(old)
        elif step < 0.8 and old is not None and not spec_of(old).get("nodeName"):
            if is_active(old):  # the scheduler binds only pods that wait
                node = rng.choice(["n1", "n2", "n3"])
                assumed[key] = (node, clock.now)
                book.assume(key, node, share_of(old))
        elif step < 0.9:
            assumed.pop(key, None)
            book.forget(key)
        for node in ("n1", "n2", "n3"):
            but = f"ns/p{rng.randrange(40)}"
            live = [p for k, p in cached.items() if k != but and spec_of(p).get("nodeName") == node]
            live += [
                cached[k]
                for k, (n, at) in assumed.items()
                if k != but and n == node and clock.now - at <= 30
            ]
            assert book.usage(node, but=but) == usage_of(live), node


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
