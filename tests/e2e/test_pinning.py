"""Pinned devices (``spec.devices``) end to end: a pinned group binds to exactly its
devices, stays Pending naming the holder or saying the device is missing, and the API
server itself refuses bad pins and any change of them once the group is Bound."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from cli import main as cli
from controllers.holders import holder_name
from controllers.inventory import annotation_key
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import NODES, PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    add_node,
    assert_no_device_shared,
    env_of,
    eventually,
    group,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(4)]


async def uuid_node(client: Client, name: str) -> None:
    """A shared node with 4 GPUs whose UUIDs the node annotation gives."""
    node = await add_node(client, name, 4)
    node["metadata"].setdefault("annotations", {})[annotation_key(GPU)] = ",".join(UUIDS)
    await client.update(NODES, node)


async def pending_message(client: Client, name: str, needle: str) -> str | None:
    g = await client.get(SDG_KIND, name)
    for cond in (g.get("status") or {}).get("conditions") or ():
        if cond["type"] == "Scheduled" and cond["status"] == "False" and needle in cond["message"]:
            assert g["status"]["phase"] == "Pending"
            return str(cond["message"])
    return None


async def sdg_cli(capsys: pytest.CaptureFixture[str], kubeconfig: str, *args: str) -> str:
    argv = ["--kubeconfig", kubeconfig, "--claims-namespace", MANAGER_NS, *args]
    code = await anyio.to_thread.run_sync(cli.main, argv)
    out = capsys.readouterr()
    assert (code, out.err) == (0, ""), (code, out.err)
    return out.out


async def test_pinned_groups_bind_to_exactly_their_devices_or_say_why_not(
    cluster: ControlPlane,
    client: Client,
    namespace: str,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await uuid_node(client, "n1")
    await add_node(client, "n2", 4)  # a count-only inventory: IDs, no UUIDs
    async with run_sdg(cluster):
        # By UUID: the devices at IDs 3 and 1 of n1, not the lowest free ones.
        await client.create(
            SDG_KIND, group("by-uuid", {GPU: 2}, devices={GPU: [UUIDS[3], UUIDS[1]]})
        )
        g = await wait_bound(client, "by-uuid")
        assert g["status"]["nodeName"] == "n1"
        assert g["status"]["selectedDevices"] == {GPU: "1,3"}
        assert g["status"]["physicalDevices"] == {GPU: f"{UUIDS[1]},{UUIDS[3]}"}
        member = await client.create(PODS, pod("member", "by-uuid"), namespace)
        assert env_of(member)["NVIDIA_VISIBLE_DEVICES"] == f"{UUIDS[1]},{UUIDS[3]}"

        # By ID: n1's device 3 is held, so the pin lands on n2's device 3.
        await client.create(SDG_KIND, group("by-id", {GPU: 1}, devices={GPU: ["3"]}))
        g = await wait_bound(client, "by-id")
        assert (g["status"]["nodeName"], g["status"]["selectedDevices"]) == ("n2", {GPU: "3"})

        # A pin to a held device stays Pending, naming the holder.
        await client.create(SDG_KIND, group("wants-3", {GPU: 1}, devices={GPU: [UUIDS[3]]}))
        message = await eventually(
            lambda: pending_message(client, "wants-3", "held by"), what="wants-3: held"
        )
        assert f"1 have pinned {GPU} {UUIDS[3]} held by group by-uuid" in message
        assert f"1 have no pinned {GPU} {UUIDS[3]} (missing: the node's inventory" in message

        # A pin to a device no node has says it is missing.
        ghost = "GPU-deadbeef-0000-0000-0000-000000000000"
        await client.create(SDG_KIND, group("ghost", {GPU: 1}, devices={GPU: [ghost]}))
        message = await eventually(
            lambda: pending_message(client, "ghost", "missing"), what="ghost: missing"
        )
        assert f"1 have no pinned {GPU} {ghost} (missing from the node's inventory)" in message

        # sdg explain reads the same decision.
        text = await sdg_cli(capsys, kubeconfig, "explain", "wants-3")
        assert f"{GPU}={UUIDS[3]}" in text.split("Pinned:", 1)[1].splitlines()[0]
        assert "Pending: 0/2 nodes are available: " in text
        facts = json.loads(await sdg_cli(capsys, kubeconfig, "explain", "wants-3", "-o", "json"))
        verdicts = {v["node"]: (v["fits"], v["reason"]) for v in facts["nodes"]}
        assert verdicts["n1"] == (False, f"have pinned {GPU} {UUIDS[3]} held by group by-uuid")
        assert facts["pinned"] == {GPU: [UUIDS[3]]}

        # The holder goes: the pinned group binds to exactly that device.
        await client.delete(PODS, "member", namespace, grace_period_seconds=0)
        await eventually(
            lambda: _gone(client, namespace, "member"), what="member pod gone", within=30
        )
        await client.delete(SDG_KIND, "by-uuid")
        g = await wait_bound(client, "wants-3", within=30)
        assert (g["status"]["nodeName"], g["status"]["selectedDevices"]) == ("n1", {GPU: "3"})
        await assert_no_device_shared(client)


async def _gone(client: Client, namespace: str, name: str) -> bool | None:
    try:
        await client.get(PODS, name, namespace)
    except errors.NotFound:
        return True
    return None


async def create_refused(client: Client, obj: dict[str, Any]) -> str:
    with pytest.raises(errors.Invalid) as err:
        await client.create(SDG_KIND, obj)
    return err.value.message


async def test_the_api_server_refuses_bad_pins_and_changes_once_bound(
    cluster: ControlPlane, client: Client
) -> None:
    # No manager, no webhook: these are the CRD's own rules.
    msg = await create_refused(client, group("short", {GPU: 2}, devices={GPU: ["0"]}))
    assert "spec.devices must list exactly as many devices of a resource as" in msg
    msg = await create_refused(client, group("twice", {GPU: 2}, devices={GPU: ["0", "0"]}))
    assert "Duplicate value" in msg and '"0"' in msg
    msg = await create_refused(client, group("other", {GPU: 1}, devices={"amd.com/gpu": ["0"]}))
    assert "spec.devices may pin only resources that spec.resources requests" in msg
    msg = await create_refused(client, group("big-id", {GPU: 1}, devices={GPU: ["5000"]}))
    assert "device IDs are numbers below 1024" in msg
    msg = await create_refused(client, group("bad", {GPU: 1}, devices={GPU: ["GPU 1"]}))
    assert "each pinned device is a device ID (a number" in msg

    await add_node(client, "n1", 4)
    # Pending pins may change (here to a device that exists); Bound ones may not.
    await client.create(SDG_KIND, group("pinned", {GPU: 1}, devices={GPU: ["7"]}))
    await client.patch(SDG_KIND, "pinned", {"spec": {"devices": {GPU: ["1"]}}})
    async with run_sdg(cluster, webhooks=False):
        g = await wait_bound(client, "pinned")
        assert g["status"]["selectedDevices"] == {GPU: "1"}
    with pytest.raises(errors.Invalid) as err:
        await client.patch(SDG_KIND, "pinned", {"spec": {"devices": {GPU: ["2"]}}})
    assert "spec.devices cannot change once the group is Bound" in err.value.message
    assert "delete the group and create a new one" in err.value.message
    with pytest.raises(errors.Invalid) as err:
        await client.patch(SDG_KIND, "pinned", {"spec": {"devices": None}})
    assert "spec.devices cannot change once the group is Bound" in err.value.message
    assert (await client.get(SDG_KIND, "pinned"))["spec"]["devices"] == {GPU: ["1"]}

    # A group Bound without pins cannot gain them either.
    await client.create(SDG_KIND, group("free", {GPU: 1}))
    async with run_sdg(cluster, webhooks=False):
        await wait_bound(client, "free")
    with pytest.raises(errors.Invalid) as err:
        await client.patch(SDG_KIND, "free", {"spec": {"devices": {GPU: ["3"]}}})
    assert "spec.devices cannot change once the group is Bound" in err.value.message


HOLDER_REASON = (
    f"1 give {GPU} through holder pods, and the kubelet picks which devices: pinned devices "
    "need a DRA node or the manager's --holders off"
)


async def test_with_holder_pods_the_kubelet_picks_so_pins_wait_with_the_reason(
    cluster: ControlPlane, client: Client
) -> None:
    """With --holders auto a device-plugin node's devices are the kubelet's choice: a pinned
    group is never placed there (no holder pod is made), and a Pending group whose holder
    waits is taken back from it once it pins devices."""
    await add_node(client, "dp-1", 4)
    async with run_sdg(cluster, holders="auto"):  # no kubelet: a holder waits forever
        await client.create(SDG_KIND, group("pinned", {GPU: 1}, devices={GPU: ["1"]}))
        message = await eventually(
            lambda: pending_message(client, "pinned", "holder pods"), what="pinned: reason"
        )
        assert HOLDER_REASON in message
        assert await holder_pod(client, "pinned") is None

        await client.create(SDG_KIND, group("later", {GPU: 1}))
        await eventually(lambda: holder_pod(client, "later"), what="later: holder pod")
        await client.patch(SDG_KIND, "later", {"spec": {"devices": {GPU: ["2"]}}})
        message = await eventually(
            lambda: pending_message(client, "later", "holder pods"), what="later: reason"
        )
        assert HOLDER_REASON in message
        await eventually(lambda: _no_holder(client, "later"), what="later: holder gone")


async def holder_pod(client: Client, group_name: str) -> dict[str, Any] | None:
    try:
        return await client.get(PODS, holder_name(group_name), MANAGER_NS)
    except errors.NotFound:
        return None


async def _no_holder(client: Client, group_name: str) -> bool | None:
    return True if await holder_pod(client, group_name) is None else None
