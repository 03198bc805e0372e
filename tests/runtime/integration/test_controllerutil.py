"""controllerutil against the real API server: create_or_update and create_or_patch say
what they did and write only when something changed; owner references and finalizers are
stored as set (no garbage collector runs here, so the stored references are the check)."""

from __future__ import annotations

import base64
from typing import Any

import anyio
import pytest
import yaml

from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.controllerutil import (
    OperationResult,
    add_finalizer,
    create_or_patch,
    create_or_update,
    is_controlled_by,
    remove_finalizer,
    set_controller_reference,
    set_owner_reference,
)
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS, SECRETS, Kind
from tests.runtime.integration.crds import namespaced_crd

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

THINGS = Kind("cutil.example.com", "v1", "Thing", "things", namespaced=True)
CRD = namespaced_crd(
    THINGS,
    {
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
    status_subresource=True,
)


async def owner_cm(client: Client, namespace: str, name: str = "owner") -> dict[str, Any]:
    return await client.create(
        CONFIGMAPS,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}},
        namespace,
    )


async def test_create_or_update_creates_updates_and_leaves_alone(
    client: Client, namespace: str
) -> None:
    owner = await owner_cm(client, namespace)
    calls: list[str] = []
    wanted = {"password": "s3cret"}

    def mirror(secret: dict[str, Any]) -> None:
        calls.append(secret["metadata"].get("resourceVersion", "new"))
        secret["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in wanted.items()}
        set_controller_reference(owner, secret)

    result, created = await create_or_update(client, SECRETS, "mirror", namespace, mirror)
    assert result is OperationResult.CREATED
    stored = await client.get(SECRETS, "mirror", namespace)
    assert stored["data"] == {"password": base64.b64encode(b"s3cret").decode()}
    assert stored["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert is_controlled_by(stored, owner)

    # The same desired state: read, mutated, found equal, not written.
    result, same = await create_or_update(client, SECRETS, "mirror", namespace, mirror)
    assert result is OperationResult.UNCHANGED
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]

    wanted["password"] = "n3w"

    async def async_mirror(secret: dict[str, Any]) -> None:  # mutate may be async
        mirror(secret)

    result, updated = await create_or_update(client, SECRETS, "mirror", namespace, async_mirror)
    assert result is OperationResult.UPDATED
    assert updated["data"] == {"password": base64.b64encode(b"n3w").decode()}
    assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    # mutate saw the stored object each time (its resourceVersion), a skeleton first.
    assert calls[0] == "new" and calls[1] == created["metadata"]["resourceVersion"]


async def test_mutate_may_not_move_the_object_and_a_second_controller_is_refused(
    client: Client, namespace: str
) -> None:
    first, second = await owner_cm(client, namespace, "a"), await owner_cm(client, namespace, "b")

    def rename(obj: dict[str, Any]) -> None:
        obj["metadata"]["name"] = "elsewhere"

    with pytest.raises(ValueError, match="must not change the object's name or namespace"):
        await create_or_update(client, SECRETS, "s", namespace, rename)
    with pytest.raises(errors.NotFound):
        await client.get(SECRETS, "s", namespace)  # nothing was created

    await create_or_update(
        client, SECRETS, "s", namespace, lambda o: set_controller_reference(first, o)
    )
    with pytest.raises(ValueError, match="already controlled by ConfigMap a"):
        await create_or_update(
            client, SECRETS, "s", namespace, lambda o: set_controller_reference(second, o)
        )
    # Many owners, one controller: the stored object has both references.
    await create_or_update(
        client, SECRETS, "s", namespace, lambda o: set_owner_reference(second, o)
    )
    refs = (await client.get(SECRETS, "s", namespace))["metadata"]["ownerReferences"]
    assert [(r["name"], r.get("controller", False)) for r in refs] == [("a", True), ("b", False)]


async def test_a_concurrent_write_is_a_conflict_not_a_lost_update(
    client: Client, namespace: str
) -> None:
    await owner_cm(client, namespace, "c")

    async def meanwhile(obj: dict[str, Any]) -> None:
        # Someone else writes between our read and our update.
        await client.patch(CONFIGMAPS, "c", {"data": {"other": "x"}}, namespace)
        obj["data"]["k"] = "ours"

    with pytest.raises(errors.Conflict):
        await create_or_update(client, CONFIGMAPS, "c", namespace, meanwhile)
    assert (await client.get(CONFIGMAPS, "c", namespace))["data"] == {"k": "v", "other": "x"}


async def test_finalizers_are_stored_and_removed(client: Client, namespace: str) -> None:
    await owner_cm(client, namespace, "f")
    result, stored = await create_or_update(
        client, CONFIGMAPS, "f", namespace, lambda o: add_finalizer(o, "example.com/cleanup")
    )
    assert result is OperationResult.UPDATED
    assert stored["metadata"]["finalizers"] == ["example.com/cleanup"]
    await client.delete(CONFIGMAPS, "f", namespace)
    held = await client.get(CONFIGMAPS, "f", namespace)
    assert held["metadata"].get("deletionTimestamp")  # the finalizer holds it
    await create_or_update(
        client, CONFIGMAPS, "f", namespace, lambda o: remove_finalizer(o, "example.com/cleanup")
    )
    with anyio.fail_after(10):
        while True:
            try:
                await client.get(CONFIGMAPS, "f", namespace)
            except errors.NotFound:
                break
            await anyio.sleep(0.05)


async def test_create_or_patch_patches_only_what_changed_and_the_status_apart(
    control_plane: ControlPlane, client: Client, namespace: str
) -> None:
    path = control_plane.work_dir / "thing-crd.yaml"
    path.write_text(yaml.safe_dump(CRD))
    control_plane.install_crds([path])

    def desired(**status: Any) -> Any:
        def mutate(obj: dict[str, Any]) -> None:
            obj.setdefault("spec", {})["size"] = 3
            if status:
                obj["status"] = status

        return mutate

    result, created = await create_or_patch(
        client, THINGS, "t", namespace, desired(phase="Pending")
    )
    assert result is OperationResult.CREATED
    assert created["spec"] == {"size": 3}
    assert created["status"] == {"phase": "Pending"}  # written through the subresource

    result, _ = await create_or_patch(client, THINGS, "t", namespace, desired(phase="Pending"))
    assert result is OperationResult.UNCHANGED

    # A field someone else set survives: a merge patch carries only our change.
    await client.patch(THINGS, "t", {"spec": {"color": "red"}}, namespace)
    result, stored = await create_or_patch(client, THINGS, "t", namespace, desired(phase="Ready"))
    assert result is OperationResult.UPDATED_STATUS_ONLY
    assert stored["status"] == {"phase": "Ready"}

    def grow(obj: dict[str, Any]) -> None:
        obj["spec"]["size"] = 4
        obj["status"]["phase"] = "Resizing"

    result, stored = await create_or_patch(client, THINGS, "t", namespace, grow)
    assert result is OperationResult.UPDATED_STATUS
    assert stored["spec"] == {"size": 4, "color": "red"}
    assert stored["status"] == {"phase": "Resizing"}

    def recolor(obj: dict[str, Any]) -> None:
        del obj["spec"]["color"]

    result, stored = await create_or_patch(client, THINGS, "t", namespace, recolor)
    assert result is OperationResult.UPDATED
    assert stored["spec"] == {"size": 4}
