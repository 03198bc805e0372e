"""The binding webhook: a group pod's Binding names its group's node, and it fails closed
for group pods (a pod or group it cannot read refuses the bind)."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.cache import CacheNotSynced
from sdgruntime.kinds import PODS, Kind
from sdgruntime.webhook import AdmissionRequest
from webhooks.bindingvalidator import BindingValidator

pytestmark = pytest.mark.anyio

BOUND = {"metadata": {"name": "g"}, "status": {"phase": "Bound", "nodeName": "n1"}}
MEMBER = {
    "metadata": {"name": "p", "namespace": "ns", "annotations": {"deviceshare.io/group": "g"}}
}


class Unsynced:
    def get(self, kind: Kind, name: str, namespace: str | None = None, *, copy: bool = True) -> Any:
        raise CacheNotSynced("not synced")


class Live:
    """The API server: objects by (kind, name), or an error for every read."""

    def __init__(self, objects: dict[tuple[Kind, str], Any], error: int = 0) -> None:
        self.objects, self.error = objects, error

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Any:
        if self.error:
            raise errors.ApiError("etcdserver: request timed out", code=self.error)
        if (kind, name) not in self.objects:
            raise errors.NotFound(f"{name} not found", code=404)
        return self.objects[(kind, name)]


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


async def judge(objects: dict[tuple[Kind, str], Any], node: str, error: int = 0) -> Any:
    validator = BindingValidator(Unsynced(), Live(objects, error))  # type: ignore[arg-type]
    return await validator.validate(review(node))


async def test_a_group_pod_binds_only_to_its_groups_node() -> None:
    objects = {(PODS, "p"): MEMBER, (SDG_KIND, "g"): BOUND}
    assert (await judge(objects, "n1")).allowed
    response = await judge(objects, "n2")
    assert not response.allowed
    assert "whose devices are on node n1: it may be bound only there, not to n2" in (
        response.message
    )


async def test_pods_outside_any_group_and_missing_pods_are_not_judged() -> None:
    plain = {"metadata": {"name": "p", "namespace": "ns", "annotations": {"x": "y"}}}
    assert (await judge({(PODS, "p"): plain}, "n2")).allowed
    assert (await judge({}, "n2")).allowed


async def test_it_fails_closed_for_group_pods() -> None:
    missing = await judge({(PODS, "p"): MEMBER}, "n1")
    assert not missing.allowed and "'g', which does not exist" in missing.message
    pending = {"metadata": {"name": "g"}, "status": {"phase": "Pending"}}
    response = await judge({(PODS, "p"): MEMBER, (SDG_KIND, "g"): pending}, "n1")
    assert not response.allowed and "which is not Bound to a node yet" in response.message
    # A pod it cannot read may be a group's.
    unread = await judge({}, "n1", error=500)
    assert not unread.allowed
    assert "cannot tell whether pod ns/p is in a SharedDeviceGroup" in unread.message
    assert "etcdserver: request timed out" in unread.message
