"""The binding webhook: a group pod's Binding names its group's node, and it fails closed
for group pods (a pod or group it cannot read refuses the bind)."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.envtest import FakeClient
from sdgruntime.kinds import PODS, Kind
from sdgruntime.webhook import AdmissionRequest
from tests.factories import as_client, group, pod
from webhooks.bindingvalidator import BindingValidator

pytestmark = pytest.mark.anyio

BOUND = group("g", node="n1")
MEMBER = pod("p", "g")


class Unreadable(FakeClient):
    """An API server that answers every read with the HTTP status ``error``."""

    def __init__(self, error: int) -> None:
        super().__init__()
        self.error = error

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Any:
        raise errors.ApiError("etcdserver: request timed out", code=self.error)


def review(node: str) -> AdmissionRequest:
    return AdmissionRequest.from_dict(
        {
            "uid": "u",
            "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "namespace": "ns",
            "name": "p",
            "object": {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "p", "namespace": "ns"},
                "target": {"kind": "Node", "name": node},
            },
        }
    )


async def judge(objects: list[tuple[Kind, Any]], node: str, error: int = 0) -> Any:
    """The validator's answer, its cache not synced: what it reads comes from the API
    server, which holds ``objects`` (or fails every read with ``error``)."""
    client = Unreadable(error) if error else FakeClient(objects)
    validator = BindingValidator(Cache(as_client(FakeClient())), as_client(client))
    return await validator.validate(review(node))


async def test_a_group_pod_binds_only_to_its_groups_node() -> None:
    objects = [(PODS, MEMBER), (SDG_KIND, BOUND)]
    assert (await judge(objects, "n1")).allowed
    response = await judge(objects, "n2")
    assert not response.allowed
    assert "whose devices are on node n1: it may be bound only there, not to n2" in (
        response.message
    )


async def test_pods_outside_any_group_and_missing_pods_are_not_judged() -> None:
    plain = pod("p", annotations={"x": "y"})
    assert (await judge([(PODS, plain)], "n2")).allowed
    assert (await judge([], "n2")).allowed


async def test_it_fails_closed_for_group_pods() -> None:
    missing = await judge([(PODS, MEMBER)], "n1")
    assert not missing.allowed and "'g', which does not exist" in missing.message
    response = await judge([(PODS, MEMBER), (SDG_KIND, group("g"))], "n1")  # Pending
    assert not response.allowed and "which is not Bound to a node yet" in response.message
    # A pod it cannot read may be a group's.
    unread = await judge([], "n1", error=500)
    assert not unread.allowed
    assert "cannot tell whether pod ns/p is in a SharedDeviceGroup" in unread.message
    assert "etcdserver: request timed out" in unread.message
