"""One set of books on a DRA node, with the manager running beside kube-scheduler and
kube-controller-manager: a group Bound on ResourceSlice devices is entered in DRA's books
(kube-scheduler gives its devices to no pod's claim), and devices a pod's claim holds are
never given to a group (issue 18, done-when (a) and (b))."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from api.constants import SDG_KIND
from controllers.draclaims import RESOURCECLAIMS, allocated_devices, group_claim_name
from controllers.inventory import DEVICETAINTRULES
from hack.node.simulators import DRA_DRIVER
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    SHARED,
    eventually,
    group,
    run_sdg,
    wait_bound,
)
from tests.e2e.test_dra_books import (
    NODE,
    allocation,
    bound,
    dra_cluster,
    plain_claim,
    unschedulable,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPUS = 8


@pytest.fixture(scope="module")
def dra_cp() -> Iterator[ControlPlane]:
    """test_dra_books' cluster with its node labelled shared, and kube-controller-manager
    without the node lifecycle controller (the fake node sends no heartbeats)."""
    with dra_cluster(SHARED, ("--controllers=*,-node-lifecycle-controller",)) as cp:
        yield cp


@pytest.fixture
async def admin(dra_cp: ControlPlane) -> AsyncIterator[Client]:
    async with Client.from_kubeconfig(str(dra_cp.kubeconfig_path)) as c:
        yield c


@pytest.fixture
async def ns(dra_cp: ControlPlane, admin: Client) -> AsyncIterator[str]:
    """A namespace for the test's pods and claims; emptied of them and of every group
    (their claims go with them) afterwards."""
    name = f"dra-{uuid.uuid4().hex[:10]}"
    dra_cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    # A test that failed half-way leaves its groups: the next test must not find their
    # devices held. No manager runs now to lift the finalizer; the next one gives their
    # records and claims back as orphans (a live read finds the groups gone).
    left, _ = await admin.list_all(SDG_KIND)
    for g in left:
        with contextlib.suppress(errors.NotFound):
            await admin.patch(SDG_KIND, g["metadata"]["name"], {"metadata": {"finalizers": None}})
            await admin.delete(SDG_KIND, g["metadata"]["name"])

    async def no_groups() -> bool:
        return not (await admin.list_all(SDG_KIND))[0]

    if left:
        await eventually(no_groups, within=30, what="the test's groups deleted")
    dra_cp.http.delete(f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": 0})
    dra_cp.http.delete(f"/apis/resource.k8s.io/v1/namespaces/{name}/resourceclaims")
    dra_cp.http.delete(f"/api/v1/namespaces/{name}")


def group_devices(g: dict[str, Any]) -> set[str]:
    """The DRA names (``gpu-<minor>``) of a Bound group's devices, by its IDs: IDs follow
    the PCI bus order, which the fixture's GPUs share with their minors."""
    return {f"gpu-{i}" for i in g["status"]["selectedDevices"][GPU].split(",")}


async def delete_group(admin: Client, name: str) -> None:
    await admin.delete(SDG_KIND, name)

    async def gone() -> bool:
        try:
            await admin.get(SDG_KIND, name)
        except errors.NotFound:
            return True
        return False

    await eventually(gone, within=30, what=f"group {name} deleted")


async def test_a_bound_group_keeps_kube_scheduler_off_its_devices(
    dra_cp: ControlPlane, admin: Client, ns: str
) -> None:
    async with run_sdg(dra_cp, webhooks=False):
        await admin.create(SDG_KIND, group("four", {GPU: 4}))
        g = await wait_bound(admin, "four")
        held = group_devices(g)
        claim = await admin.get(RESOURCECLAIMS, group_claim_name("four"), MANAGER_NS)
        # In DRA's books, exactly the group's devices, reserved for the group.
        assert {d.device for d in allocated_devices(claim)} == held
        assert claim["status"]["reservedFor"][0]["name"] == "four"
        await plain_claim(admin, ns, "six", 6)
        await eventually(lambda: unschedulable(admin, ns, "wants-six"), what="6 unschedulable")
        assert await allocation(admin, ns, "six") is None
        await plain_claim(admin, ns, "rest", 4)
        await eventually(lambda: bound(admin, ns, "wants-rest"), what="the 4 bound")
        rest = await allocation(admin, ns, "rest")
        assert rest is not None and rest.isdisjoint(held) and len(rest | held) == GPUS
        # The group goes, and its claim with it; once 'rest' is gone too, the 6 fit.
        await delete_group(admin, "four")

        async def claim_gone() -> bool:
            try:
                await admin.get(RESOURCECLAIMS, group_claim_name("four"), MANAGER_NS)
            except errors.NotFound:
                return True
            return False

        await eventually(claim_gone, within=30, what="the group's claim removed")
        await admin.delete(PODS, "wants-rest", ns, grace_period_seconds=0)
        await admin.delete(RESOURCECLAIMS, "rest", ns)
        await eventually(lambda: bound(admin, ns, "wants-six"), within=60, what="the 6 bound")


async def test_devices_a_claim_holds_are_never_given_to_a_group(
    dra_cp: ControlPlane, admin: Client, ns: str
) -> None:
    await plain_claim(admin, ns, "first", 6)
    await eventually(lambda: bound(admin, ns, "wants-first"), what="the claim for 6 bound")
    taken = await allocation(admin, ns, "first")
    assert taken is not None and len(taken) == 6
    async with run_sdg(dra_cp, webhooks=False):
        await admin.create(SDG_KIND, group("too-many", {GPU: 4}))

        def pending_with(free: str) -> Callable[[], Awaitable[str | None]]:
            async def check() -> str | None:
                live = await admin.get(SDG_KIND, "too-many")
                conds = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}
                message = conds.get("Scheduled", {}).get("message")
                return message if message and free in message else None

            return check

        # The claim's 6 leave 2: not enough for 4.
        await eventually(pending_with("2 free"), what="too-many Pending, 2 free")
        await admin.create(SDG_KIND, group("two", {GPU: 2}))
        g = await wait_bound(admin, "two")
        assert group_devices(g).isdisjoint(taken)
        # The claim's 6 and the group's 2: nothing left, and the Pending message says so.
        message = await eventually(pending_with("0 free"), what="too-many Pending, 0 free")
        assert (await admin.get(SDG_KIND, "too-many"))["status"]["phase"] == "Pending"
        assert "0 free nvidia.com/gpu (need 4)" in message, message
        await delete_group(admin, "too-many")
        await delete_group(admin, "two")


async def test_a_claim_given_a_groups_device_behind_the_books_is_reported(
    dra_cp: ControlPlane, admin: Client, ns: str
) -> None:
    """The books are not fenced against each other: a claim another client allocates on a
    group's device (written by hand here, as a racing allocator would) flags the group."""
    async with run_sdg(dra_cp, webhooks=False):
        await admin.create(SDG_KIND, group("held", {GPU: 1}))
        g = await wait_bound(admin, "held")
        (device,) = group_devices(g)
        spec = {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER, "count": 1}}]
        }
        claim = await admin.create(
            RESOURCECLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "sneaky"},
                "spec": {"devices": spec},
            },
            ns,
        )
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRA_DRIVER, "pool": NODE, "device": device}
                    ]
                }
            }
        }
        await admin.update(RESOURCECLAIMS, claim, subresource="status")

        async def flagged() -> dict[str, Any] | None:
            live = await admin.get(SDG_KIND, "held")
            ready = {c["type"]: c for c in live["status"]["conditions"]}["Ready"]
            return ready if ready.get("reason") == "DevicesConflict" else None

        ready = await eventually(flagged, what="DevicesConflict on the group")
        assert f"ResourceClaim {ns}/sneaky" in ready["message"]
        await admin.delete(RESOURCECLAIMS, "sneaky", ns)
        await delete_group(admin, "held")


async def test_device_taint_rules_keep_their_devices_from_groups(
    dra_cp: ControlPlane, admin: Client, ns: str
) -> None:
    """DeviceTaintRules (resource.k8s.io/v1, 1.37) tainting a free GPU and a held one
    NoSchedule: no group is given the free one, and the group holding the other is told
    its device is unhealthy."""

    def rule(name: str, device: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {
                "deviceSelector": {"driver": DRA_DRIVER, "pool": NODE, "device": device},
                "taint": {"key": "example.com/broken", "effect": "NoSchedule"},
            },
        }

    async with run_sdg(dra_cp, webhooks=False):
        await admin.create(SDG_KIND, group("early", {GPU: 1}))
        (held,) = group_devices(await wait_bound(admin, "early"))
        free = next(f"gpu-{i}" for i in range(GPUS) if f"gpu-{i}" != held)
        rules = [f"held-{ns}", f"free-{ns}"]
        await admin.create(DEVICETAINTRULES, rule(rules[0], held))
        await admin.create(DEVICETAINTRULES, rule(rules[1], free))
        try:

            async def unhealthy() -> dict[str, Any] | None:
                live = await admin.get(SDG_KIND, "early")
                conds = {c["type"]: c for c in live["status"]["conditions"]}
                node = conds.get("NodeHealthy", {})
                return node if node.get("reason") == "DevicesMissing" else None

            await eventually(unhealthy, what="the tainted device reported on its group")
            # 7 GPUs are not held, but one of them is tainted: 7 do not fit, 6 do.
            await admin.create(SDG_KIND, group("seven", {GPU: GPUS - 1}))

            async def seven_pending() -> str | None:
                live = await admin.get(SDG_KIND, "seven")
                conds = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}
                message = conds.get("Scheduled", {}).get("message")
                return message if message and "free" in message else None

            await eventually(seven_pending, what="'seven' Pending")
            await delete_group(admin, "seven")
            await admin.create(SDG_KIND, group("six", {GPU: GPUS - 2}))
            six = group_devices(await wait_bound(admin, "six"))
            assert free not in six and held not in six
            await delete_group(admin, "six")
        finally:
            for name in rules:
                await admin.delete(DEVICETAINTRULES, name)
            await delete_group(admin, "early")
