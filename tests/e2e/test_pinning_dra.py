"""Pinned devices on a DRA node, beside kube-scheduler and kube-controller-manager: a pin
to a device a pod's ResourceClaim holds waits naming that claim; a pin by the slice's UUID
binds to exactly that device, and DRA's books hold exactly it for the group."""

from __future__ import annotations

import pytest

from api.constants import SDG_KIND
from controllers.draclaims import RESOURCECLAIMS, allocated_devices, group_claim_name
from hack.node.simulators import sim_uuid
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from tests.e2e.harness import GPU, MANAGER_NS, eventually, group, run_sdg, wait_bound
from tests.e2e.test_dra_books import allocation, bound, plain_claim
from tests.e2e.test_dra_groups import admin, delete_group, dra_cp, ns  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def uuid_of(device: str) -> str:
    """The UUID the fixture's slice publishes for ``gpu-<minor>``."""
    return sim_uuid("dra-books", int(device.removeprefix("gpu-")))


async def test_pins_on_a_dra_node_name_the_claim_holding_them_or_bind_exactly(
    dra_cp: ControlPlane,  # noqa: F811
    admin: Client,  # noqa: F811
    ns: str,  # noqa: F811
) -> None:
    await plain_claim(admin, ns, "theirs", 2)
    await eventually(lambda: bound(admin, ns, "wants-theirs"), what="the claim's pod bound")
    taken = await allocation(admin, ns, "theirs")
    assert taken is not None and len(taken) == 2
    held = sorted(taken)[0]
    free = next(f"gpu-{i}" for i in range(8) if f"gpu-{i}" not in taken)
    async with run_sdg(dra_cp, webhooks=False, holders="auto"):
        await admin.create(SDG_KIND, group("on-theirs", {GPU: 1}, devices={GPU: [uuid_of(held)]}))

        async def waits() -> str | None:
            g = await admin.get(SDG_KIND, "on-theirs")
            for c in (g.get("status") or {}).get("conditions") or ():
                if c["type"] == "Scheduled" and "ResourceClaim" in c["message"]:
                    return str(c["message"])
            return None

        message = await eventually(waits, what="on-theirs Pending naming the claim")
        assert f"have pinned {GPU} {uuid_of(held)} held by ResourceClaim {ns}/theirs" in message
        assert (await admin.get(SDG_KIND, "on-theirs"))["status"]["phase"] == "Pending"

        # Slice devices are SDG's to assign even with holder pods on: the pin binds.
        await admin.create(SDG_KIND, group("exact", {GPU: 1}, devices={GPU: [uuid_of(free)]}))
        g = await wait_bound(admin, "exact")
        assert g["status"]["physicalDevices"] == {GPU: uuid_of(free)}
        claim = await admin.get(RESOURCECLAIMS, group_claim_name("exact"), MANAGER_NS)
        assert {d.device for d in allocated_devices(claim)} == {free}
        await delete_group(admin, "exact")
        await delete_group(admin, "on-theirs")
