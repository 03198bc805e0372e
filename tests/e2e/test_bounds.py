"""Bounded work for any input, end to end: nodes advertising byte-sized "device" counts
offer nothing and say why, the manager stays responsive, and the API server refuses
group counts no node could offer."""

from __future__ import annotations

import time

import pytest

from api.constants import SDG_KIND, SHARED_TAINT_KEY, SHARED_TAINT_VALUE
from api.validation import COUNT_TOO_LARGE
from cli.explain import explain_group
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    add_node,
    eventually,
    group,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

CAP = f"advertise 1000000000 {GPU}, more than the 1024 devices SDG addresses per node"


async def scheduled_false(client: Client, name: str) -> dict | None:
    g = await client.get(SDG_KIND, name)
    for cond in (g.get("status") or {}).get("conditions") or ():
        if cond["type"] == "Scheduled" and cond["status"] == "False":
            return cond
    return None


async def test_nodes_over_the_device_cap_offer_nothing_and_say_why(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "huge", extra={GPU: "1000000000"})
    await add_node(client, "bytes", extra={GPU: "1G"})
    # The taint users put on shared nodes to keep other pods away does not keep groups away.
    shared_taint = {"key": SHARED_TAINT_KEY, "value": SHARED_TAINT_VALUE, "effect": "NoSchedule"}
    await add_node(client, "normal", 4, taints=[shared_taint])
    async with run_sdg(cluster) as sdg:
        await client.create(SDG_KIND, group("pair", {GPU: 2}))
        pair = await wait_bound(client, "pair")
        assert pair["status"]["nodeName"] == "normal"
        assert pair["status"]["selectedDevices"] == {GPU: "0,1"}

        # Only the two huge nodes "have" 8 GPUs; neither is a device count.
        await client.create(SDG_KIND, group("wide", {GPU: 8}))
        cond = await eventually(
            lambda: scheduled_false(client, "wide"), what="wide: Scheduled=False"
        )
        assert cond["reason"] == "Unschedulable"
        assert cond["message"] == (
            f"0/3 nodes are available: 2 {CAP}, 1 have 2 free {GPU} (need 8)."
        )
        tracker = sdg.claims.tracker
        assert tracker.capacity("huge", GPU) == tracker.capacity("bytes", GPU) == 0
        assert tracker.capacity("normal", GPU) == 4

        # The manager is not busy with a billion device IDs: another group binds promptly.
        started = time.monotonic()
        await client.create(SDG_KIND, group("quick", {GPU: 1}))
        quick = await wait_bound(client, "quick", within=10)
        assert quick["status"]["nodeName"] == "normal"
        assert quick["status"]["selectedDevices"] == {GPU: "2"}
        assert time.monotonic() - started < 10
        wide = await client.get(SDG_KIND, "wide")
        assert wide["status"].get("phase", "Pending") == "Pending"

        # `sdg explain wide` on what the API server stores names the cap twice: in the
        # Pending line (the condition) and per node, now.
        groups, _ = await client.list_all(SDG_KIND)
        nodes, _ = await client.list_all(NODES)
        records, _ = await client.list_all(CONFIGMAPS, MANAGER_NS)
        pods, _ = await client.list_all(PODS)
        text = explain_group("wide", groups, nodes, records, pods)
        assert f"Pending: 0/3 nodes are available: 2 {CAP}" in text
        assert f"  bytes    no     {CAP}\n" in text
        assert f"  huge     no     {CAP}\n" in text
        assert f"  normal   no     have 1 free {GPU} (need 8)\n" in text


async def test_a_group_asking_more_than_a_node_may_offer_is_refused(
    cluster: ControlPlane, client: Client
) -> None:
    with pytest.raises(errors.Invalid) as err:
        await client.create(SDG_KIND, group("too-many", {GPU: 5000}))
    assert COUNT_TOO_LARGE in err.value.message
    assert "should be less than or equal to 1024" in err.value.message
    created = await client.create(SDG_KIND, group("most", {GPU: 1024}))
    assert created["spec"]["resources"] == {GPU: 1024}
