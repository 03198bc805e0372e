"""The S4 control run's bookkeeping (``hack/bench/status_floor.py``): which groups it
writes and what it writes, from the pod events it sees."""

from __future__ import annotations

from typing import Any

import pytest

from hack.bench.status_floor import StatusFloor


def pod(name: str, group: str | None, phase: str = "Pending") -> dict[str, Any]:
    annotations = {"deviceshare.io/group": group} if group else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "status": {"phase": phase},
    }


class Recorder:
    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []

    async def request(self, method: str, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.patches.append((path.split("/")[-2], body["status"]))
        return {}


def floor() -> tuple[StatusFloor, Recorder]:
    kube = Recorder()
    return StatusFloor(kube, writers=1), kube  # type: ignore[arg-type]


def test_groups_are_dirty_oldest_first_and_once() -> None:
    f, _ = floor()
    for name, group in (("a", "g1"), ("b", "g2"), ("c", "g1"), ("d", None)):
        f.on_pod("ADDED", pod(name, group))
    assert list(f.dirty) == ["g1", "g2"]
    assert f.pods == {"g1": {"ns/a", "ns/c"}, "g2": {"ns/b"}}


def test_finished_deleted_and_moved_pods_leave_their_group() -> None:
    f, _ = floor()
    f.on_pod("ADDED", pod("a", "g1"))
    f.on_pod("ADDED", pod("b", "g1"))
    f.on_pod("MODIFIED", pod("a", "g1", phase="Succeeded"))
    f.on_pod("MODIFIED", pod("b", "g2"))
    assert f.pods == {"g1": set(), "g2": {"ns/b"}}
    f.on_pod("DELETED", pod("b", "g2"))
    assert f.pods == {"g1": set(), "g2": set()}


@pytest.mark.anyio
async def test_a_write_is_the_sorted_pods_and_an_unchanged_one_is_skipped() -> None:
    f, kube = floor()
    f.on_pod("ADDED", pod("b", "g1"))
    f.on_pod("ADDED", pod("a", "g1"))
    await f.write("g1")
    await f.write("g1")
    assert kube.patches == [("g1", {"allocatedPods": ["ns/a", "ns/b"], "podCount": 2})]
    assert f.counts["writes"] == 1 and f.counts["skipped"] == 1
