"""What the pod webhook keeps per group under churn (issue 24): the groups it warned about
an unverified delivery are forgotten when they are deleted, so its book is back to its
size once they are gone; a new group of the same name is warned about again."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import SDG_KIND
from sdgruntime.kinds import NODES
from tests.factories import as_client, settle
from tests.unit.test_podmutator import Recorder, bound, cached, labelled, live, new_pod, review
from webhooks.podmutator import PodMutator

pytestmark = pytest.mark.anyio


def pod_of(group: str) -> dict[str, Any]:
    pod = new_pod()
    pod["metadata"]["annotations"]["deviceshare.io/group"] = group
    return pod


async def test_deleted_groups_are_forgotten_and_the_book_is_back_to_empty() -> None:
    names = [f"g{i}" for i in range(200)]
    groups = {n: bound(n, f"uid-{n}") for n in names}
    recorder = Recorder()
    objects = [*((SDG_KIND, g) for g in groups.values()), (NODES, labelled("n1", None))]
    async with cached(*objects) as (cache, _):
        mutator = PodMutator(cache, as_client(live()), recorder=recorder)
        for n in names:
            assert (await mutator.mutate(review("CREATE", pod_of(n)))).allowed
    assert len(recorder.events) == 200
    assert len(mutator._warned) == 200
    for n in names:
        mutator.forget_group(groups[n])
    assert len(mutator._warned) == 0


async def test_a_recreated_group_is_warned_about_again() -> None:
    recorder = Recorder()
    async with cached((SDG_KIND, bound("g", "uid-1")), (NODES, labelled("n1", None))) as (
        cache,
        server,
    ):
        mutator = PodMutator(cache, as_client(live()), recorder=recorder)
        await mutator.mutate(review("CREATE", pod_of("g")))
        gone = await server.delete(SDG_KIND, "g")
        mutator.forget_group(gone)  # as the manager's handler of the group's delete does
        await server.create(SDG_KIND, bound("g", "uid-2"))
        await settle()  # the informer delivers the new group
        await mutator.mutate(review("CREATE", pod_of("g")))
    assert [e[2] for e in recorder.events] == ["DeliveryUnverified", "DeliveryUnverified"]
