"""``--allocated-pods counts``: the status controller writes pods per namespace, no pod
names (nor PodsJoined/PodsLeft events), and switching the mode either way leaves no list of
the other mode behind."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import GROUP_ANNOTATION
from controllers.podevents import PodEvents
from controllers.statuscontroller import StatusController, namespace_counts
from sdgruntime.reconcile import Request
from tests.unit.test_statuscontroller import Cache, Clock, Recorder, Server, group

pytestmark = pytest.mark.anyio


def pod(name: str, namespace: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": {GROUP_ANNOTATION: "g"}},
        "status": {"phase": phase},
    }


def controller(mode: str) -> tuple[StatusController, Cache, Server, Recorder, Clock]:
    cache, rec, clock = Cache(), Recorder(), Clock()
    server = Server()
    events = PodEvents(rec, quiet=5.0, clock=clock)  # type: ignore[arg-type]
    sc = StatusController(
        server,  # type: ignore[arg-type]
        cache,  # type: ignore[arg-type]
        rec,  # type: ignore[arg-type]
        events=events,
        clock=clock,
        allocated_pods=mode,  # type: ignore[arg-type]
    )
    return sc, cache, server, rec, clock


def test_namespace_counts_sorted_and_bounded() -> None:
    keys = ["b/x", "a/y", "b/z", "b/x", "c/w"]
    assert namespace_counts(keys) == {"a": 1, "b": 2, "c": 1}
    assert list(namespace_counts(keys)) == ["a", "b", "c"]
    assert namespace_counts(keys, limit=2) == {"a": 1, "b": 2}


async def test_counts_mode_writes_no_pod_names_and_tells_no_names() -> None:
    sc, cache, server, rec, clock = controller("counts")
    server.put(cache, group(podCount=0))
    cache.pods = [pod("a", "team-a"), pod("b", "team-a"), pod("c", "team-b")]
    await sc.reconcile(Request("g"))
    status = server.status("g")
    assert status["allocatedPods"] == []
    assert status["allocatedPodCounts"] == {"team-a": 2, "team-b": 1}
    assert status["podCount"] == 3
    assert "team-a/a" not in str(status)
    # The write's echo changes nothing: no second write.
    cache.groups["g"]["status"] = status
    clock.t += sc.batch_period
    assert await sc.reconcile(Request("g")) is None
    assert server.patched() == ["g"]
    # A namespace whose last pod ended goes from the map.
    cache.pods = [pod("a", "team-a"), pod("c", "team-b", phase="Succeeded")]
    await sc.reconcile(Request("g"))
    assert server.status("g")["allocatedPodCounts"] == {"team-a": 1}
    assert server.status("g")["podCount"] == 1
    clock.t += 60
    sc.events.flush_due()
    assert rec.events == []  # PodsJoined/PodsLeft would name the pods


async def test_switching_modes_drops_the_other_modes_field() -> None:
    sc, cache, server, _, _ = controller("counts")
    server.put(cache, group(podCount=2, allocatedPods=["team-a/a", "team-b/c"]))
    cache.pods = [pod("a", "team-a"), pod("c", "team-b")]
    await sc.reconcile(Request("g"))  # names written by a manager in names mode
    assert server.status("g")["allocatedPods"] == []
    assert server.status("g")["allocatedPodCounts"] == {"team-a": 1, "team-b": 1}

    back, _, _, _, _ = controller("names")
    back.client, back.cache = server, cache  # type: ignore[assignment]
    cache.groups["g"]["status"] = server.status("g")
    await back.reconcile(Request("g"))
    status = server.status("g")
    assert status["allocatedPods"] == ["team-a/a", "team-b/c"]
    assert "allocatedPodCounts" not in status


async def test_a_new_group_is_not_written_in_counts_mode() -> None:
    sc, cache, server, _, _ = controller("counts")
    server.put(cache, {**group(), "status": {}})
    assert await sc.reconcile(Request("g")) is None
    assert server.patched() == []
