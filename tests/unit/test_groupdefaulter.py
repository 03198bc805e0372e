"""The group defaulting webhook gives a new group the protection finalizer, keeps the
user's own finalizers, and leaves everything else alone."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import FINALIZER
from sdgruntime.webhook import AdmissionRequest
from webhooks.groupdefaulter import GroupDefaulter

pytestmark = pytest.mark.anyio

KIND = {"group": "deviceshare.io", "version": "v1alpha1", "kind": "SharedDeviceGroup"}


def request(obj: Any, operation: str = "CREATE", kind: dict[str, str] = KIND) -> AdmissionRequest:
    return AdmissionRequest.from_dict(
        {"uid": "u", "operation": operation, "kind": kind, "object": obj, "name": "g"}
    )


def group(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "g", **meta}, "spec": {"resources": {"nvidia.com/gpu": 1}}}


async def test_a_new_group_gets_the_finalizer() -> None:
    answer = await GroupDefaulter().mutate(request(group()))
    assert answer.allowed
    assert answer.patch == [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]


async def test_the_users_finalizers_are_kept_and_ours_appended() -> None:
    answer = await GroupDefaulter().mutate(request(group(finalizers=["example.com/keep"])))
    assert answer.patch == [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]


@pytest.mark.parametrize(
    "req",
    [
        request(group(finalizers=["example.com/keep", FINALIZER])),  # there already
        request(group(), operation="UPDATE"),  # only creates are defaulted
        request(group(), kind={**KIND, "kind": "Pod"}),
        request({"metadata": "not an object"}),  # the API server refuses it anyway
        request(group(finalizers="not a list")),
        request(None),
    ],
)
async def test_nothing_else_is_changed(req: AdmissionRequest) -> None:
    answer = await GroupDefaulter().mutate(req)
    assert answer.allowed and answer.patch is None
