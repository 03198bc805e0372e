"""The pod scheduler's assumed pods: what a fit check counts on a node before the cache
shows a bind, and when it stops counting it."""

from __future__ import annotations

from controllers.podscheduler import AssumedPods
from tests.factories import pod


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_assumed_pod_counts_on_its_node_only() -> None:
    assumed = AssumedPods(ttl=30, clock=Clock())
    assumed.assume("ns/a", "n1", pod("a"))
    assert assumed.on("n1", set()) == [pod("a")]
    assert assumed.on("n2", set()) == []


def test_once_the_cache_shows_the_pod_it_is_not_counted_twice_and_is_dropped() -> None:
    assumed = AssumedPods(ttl=30, clock=Clock())
    assumed.assume("ns/a", "n1", pod("a"))
    assumed.assume("ns/b", "n1", pod("b"))
    assert assumed.on("n1", {"ns/a"}) == [pod("b")]
    assert len(assumed) == 1
    assert assumed.on("n1", set()) == [pod("b")]  # a is gone for good


def test_an_unconfirmed_bind_expires_after_the_ttl() -> None:
    clock = Clock()
    assumed = AssumedPods(ttl=30, clock=clock)
    assumed.assume("ns/a", "n1", pod("a"))
    clock.now += 29
    assert assumed.on("n1", set()) == [pod("a")]
    clock.now += 2
    assert assumed.on("n1", set()) == []
    assert len(assumed) == 0


def test_reassuming_moves_the_pod_and_forget_removes_it() -> None:
    assumed = AssumedPods(ttl=30, clock=Clock())
    assumed.assume("ns/a", "n1", pod("a"))
    assumed.assume("ns/a", "n2", pod("a"))
    assert assumed.on("n1", set()) == []
    assert assumed.on("n2", set()) == [pod("a")]
    assumed.forget("ns/a")
    assumed.forget("ns/a")  # idempotent
    assert assumed.on("n2", set()) == [] and len(assumed) == 0


def test_expired_pods_on_nodes_nobody_checks_are_swept_by_later_assumes() -> None:
    clock = Clock()
    assumed = AssumedPods(ttl=30, clock=clock)
    for i in range(100):
        assumed.assume(f"ns/p{i}", f"idle-{i}", pod(f"p{i}"))
    clock.now += 31
    assumed.assume("ns/new", "busy", pod("new"))
    assert len(assumed) == 1  # memory stays bounded by the binds of the last ttl
