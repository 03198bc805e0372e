"""A wrong view can only make SDG hand out less, never twice: records deleted or damaged
by hand, stale claims, pods that run without a record."""

from __future__ import annotations

import pytest

from api.constants import SDG_KIND
from controllers.ledger.records import record_name
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS, PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    add_node,
    eventually,
    group,
    pod,
    remove_webhooks,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def write_record(client: Client, node: str, claims: str) -> None:
    """A claim record as a human (or a lost writer) leaves it."""
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": record_name(node),
            "namespace": MANAGER_NS,
            "labels": {"deviceshare.io/claims": "node"},
        },
        "data": {"node": node, "claims": claims},
    }
    await client.create(CONFIGMAPS, cm, MANAGER_NS)


async def _scheduled(client: Client, name: str) -> dict | None:
    g = await client.get(SDG_KIND, name)
    for c in (g.get("status") or {}).get("conditions") or []:
        if c["type"] == "Scheduled":
            return g
    return None


async def test_record_deleted_at_runtime_frees_nothing_and_is_written_back(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "n0", 2)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("a", {GPU: 2}))
        await wait_bound(client, "a")
        await client.delete(CONFIGMAPS, record_name("n0"), MANAGER_NS)
        await client.create(SDG_KIND, group("b", {GPU: 2}))
        b = await eventually(lambda: _scheduled(client, "b"), what="b judged")
        assert b["status"]["phase"] == "Pending"  # a's status still holds 0,1

        async def restored() -> dict | None:
            cm = await client.get(CONFIGMAPS, record_name("n0"), MANAGER_NS)
            return cm if '"a"' in cm["data"]["claims"] else None

        cm = await eventually(restored, what="record written back from a's status")
        assert cm["data"]["claims"] == '{"a":{"nvidia.com/gpu":"0,1"}}'
        assert (await client.get(SDG_KIND, "b"))["status"]["phase"] == "Pending"


async def test_malformed_record_blocks_its_node_and_is_not_overwritten(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "n0", 4)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("first", {GPU: 1}))
        await wait_bound(client, "first")
        cm = await client.get(CONFIGMAPS, record_name("n0"), MANAGER_NS)
        cm["data"]["claims"] = '{"first": {"nvidia.com/gpu": "0"}, '  # a bad hand edit
        await client.update(CONFIGMAPS, cm)
        await client.create(SDG_KIND, group("second", {GPU: 1}))
        second = await eventually(lambda: _scheduled(client, "second"), what="judged")
        assert second["status"]["phase"] == "Pending"
        assert "1 have a malformed claim record" in next(
            c["message"] for c in second["status"]["conditions"] if c["type"] == "Scheduled"
        )
        kept = await client.get(CONFIGMAPS, record_name("n0"), MANAGER_NS)
        assert kept["data"]["claims"] == '{"first": {"nvidia.com/gpu": "0"}, '
        # Repaired by a human: the node offers its free devices again.
        kept["data"]["claims"] = '{"first":{"nvidia.com/gpu":"0"}}'
        await client.update(CONFIGMAPS, kept)
        g = await wait_bound(client, "second")
        assert g["status"]["selectedDevices"] == {GPU: "1"}


async def test_pod_may_not_preset_another_node(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "home", 2)
    await add_node(client, "elsewhere", 2)
    async with run_sdg(cluster):
        await client.create(
            SDG_KIND, group("g", {GPU: 2}, nodeSelector={"kubernetes.io/hostname": "home"})
        )
        await wait_bound(client, "g")
        with pytest.raises(errors.ApiError) as info:
            await client.create(PODS, pod("sneaky", "g", nodeName="elsewhere"), namespace)
        assert "sets spec.nodeName elsewhere, but SharedDeviceGroup 'g' is bound to node home" in (
            info.value.message
        )


async def test_stale_claim_for_an_older_spec_is_not_adopted(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "n0", 4)
    await client.create(SDG_KIND, group("grown", {GPU: 3}))
    # A claim for the spec before an edit (1 GPU), as an interrupted bind leaves it.
    await write_record(client, "n0", '{"grown":{"nvidia.com/gpu":"3"}}')
    async with run_sdg(cluster):
        g = await wait_bound(client, "grown")
    assert g["status"]["selectedDevices"] == {GPU: "0,1,2"}
    cm = await client.get(CONFIGMAPS, record_name("n0"), MANAGER_NS)
    assert cm["data"]["claims"] == '{"grown":{"nvidia.com/gpu":"0,1,2"}}'


async def test_group_whose_pods_run_unrecorded_is_not_placed_again(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n0", 4)
    remove_webhooks(cluster)
    await client.create(SDG_KIND, group("lost", {GPU: 1}))
    for name, ids in (("p1", "0"), ("p2", "1")):  # they disagree: nothing to restore
        p = pod(name, "lost", nodeName="n0")
        p["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": ids}]
        await client.create(PODS, p, namespace)
    async with run_sdg(cluster):
        g = await eventually(lambda: _scheduled(client, "lost"), what="lost judged")
        assert g["status"]["phase"] == "Pending"
        cond = next(c for c in g["status"]["conditions"] if c["type"] == "Scheduled")
        assert "2 pod(s) of this group still run from an earlier binding" in cond["message"]
        for name in ("p1", "p2"):
            await client.delete(PODS, name, namespace, grace_period_seconds=0)
        g = await wait_bound(client, "lost")
        assert g["status"]["nodeName"] == "n0"


async def test_claim_left_on_another_node_is_released(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "n0", 2)
    await add_node(client, "n1", 1)
    async with run_sdg(cluster):
        await client.create(
            SDG_KIND, group("g", {GPU: 1}, nodeSelector={"kubernetes.io/hostname": "n0"})
        )
        await wait_bound(client, "g")
        # As a bind that lost to another manager leaves it: g also claimed on n1.
        await write_record(client, "n1", '{"g":{"nvidia.com/gpu":"0"}}')

        async def released() -> bool:
            cm = await client.get(CONFIGMAPS, record_name("n1"), MANAGER_NS)
            return cm["data"]["claims"] == "{}"

        await eventually(released, what="stale claim on n1 released")
        await client.create(
            SDG_KIND, group("h", {GPU: 1}, nodeSelector={"kubernetes.io/hostname": "n1"})
        )
        h = await wait_bound(client, "h")
        assert h["status"]["selectedDevices"] == {GPU: "0"}
        g = await client.get(SDG_KIND, "g")
        assert g["status"]["nodeName"] == "n0"
