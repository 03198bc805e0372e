"""Nothing is ever given to two groups: under concurrency, across restarts, and with two
managers racing (a forced split brain, leader election off)."""

from __future__ import annotations

import anyio
import pytest

from api.constants import SDG_KIND
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS, PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    add_node,
    assert_no_device_shared,
    bound_group_with_a_rogue_pod,
    devices_conflict,
    env_of,
    eventually,
    group,
    kubelet,
    lease_held_elsewhere,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def _all_decided(client: Client, n: int) -> list[dict]:
    groups, _ = await client.list_all(SDG_KIND)
    decided = [
        g
        for g in groups
        if (g.get("status") or {}).get("phase") == "Bound"
        or any(c["type"] == "Scheduled" for c in (g.get("status") or {}).get("conditions") or [])
    ]
    return groups if len(groups) == n and len(decided) == n else []


async def test_fifty_groups_created_concurrently_never_share(
    cluster: ControlPlane, client: Client
) -> None:
    for i, gpus in enumerate((8, 8, 4, 4, 2)):
        await add_node(client, f"n{i}", gpus)
    async with run_sdg(cluster):
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(client.create, SDG_KIND, group(f"g{i:02d}", {GPU: 1 + i % 2}))
        groups = await eventually(lambda: _all_decided(client, 50), within=60, what="50 decided")
    bound = [g for g in groups if g["status"]["phase"] == "Bound"]
    assert sum(int(g["spec"]["resources"][GPU]) for g in bound) <= 26
    # 25 groups of 1 and 25 of 2 (75 GPUs) into 26: the cluster ends full, not fragmented.
    # How many bind depends on the order the groups arrive in (all the 2s first: 13); what
    # never depends on it is that no Pending group would fit on any node's free devices.
    free = dict(zip([f"n{i}" for i in range(5)], (8, 8, 4, 4, 2), strict=True))
    for g in bound:
        free[g["status"]["nodeName"]] -= int(g["spec"]["resources"][GPU])
    pending = [g for g in groups if g["status"]["phase"] != "Bound"]
    assert pending and len(bound) >= 13
    for g in pending:
        assert int(g["spec"]["resources"][GPU]) > max(free.values()), (g, free)
    await assert_no_device_shared(client)


async def test_split_brain_two_managers_race_over_a_hundred_groups(
    cluster: ControlPlane, client: Client
) -> None:
    for i in range(4):
        await add_node(client, f"n{i}", 16)
    async with run_sdg(cluster), run_sdg(cluster, webhooks=False):
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(client.create, SDG_KIND, group(f"race-{i:03d}", {GPU: 1 + i % 3}))
        groups = await eventually(lambda: _all_decided(client, 100), within=120, what="100 decided")
        # Let both managers settle: late retries must not change the outcome.
        await anyio.sleep(1.0)
        groups, _ = await client.list_all(SDG_KIND)
    bound = [g for g in groups if g["status"]["phase"] == "Bound"]
    assert sum(int(g["spec"]["resources"][GPU]) for g in bound) <= 64
    await assert_no_device_shared(client)


async def test_restart_recovers_without_double_allocation(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 5)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("before", {GPU: 2}))
        before = await wait_bound(client, "before")
        await client.create(PODS, pod("b-pod", "before"), namespace)
        await eventually(lambda: _has_node(client, "b-pod", namespace), what="b-pod bound")
    # The leader is down; a standby replica (the lease is held elsewhere) still serves
    # the webhooks, so groups and pods can be created, but nothing is placed or bound.
    await lease_held_elsewhere(client, "held-elsewhere")
    async with run_sdg(cluster, leader_elect=True, leader_election_id="held-elsewhere"):
        await client.create(SDG_KIND, group("during-1", {GPU: 1}))
        await client.create(SDG_KIND, group("during-2", {GPU: 2}))
        late = await client.create(PODS, pod("late-pod", "before"), namespace)
        assert env_of(late)["NVIDIA_VISIBLE_DEVICES"] == "0,1"
        await anyio.sleep(1.0)
        assert not (await client.get(PODS, "late-pod", namespace))["spec"].get("nodeName")
        assert not (await client.get(SDG_KIND, "during-1")).get("status")
    async with run_sdg(cluster), kubelet(client):
        d1 = await wait_bound(client, "during-1")
        d2 = await wait_bound(client, "during-2")
        await client.create(PODS, pod("d-pod", "during-2"), namespace)
        await eventually(lambda: _has_node(client, "d-pod", namespace), what="d-pod bound")
        await eventually(lambda: _has_node(client, "late-pod", namespace), what="late-pod bound")
        await assert_no_device_shared(client)
        after = await client.get(SDG_KIND, "before")
        # The bound group kept its node and devices; the newcomers got the other IDs.
        assert after["status"]["nodeName"] == before["status"]["nodeName"]
        assert after["status"]["selectedDevices"] == {GPU: "0,1"}
        got = d1["status"]["selectedDevices"][GPU] + "," + d2["status"]["selectedDevices"][GPU]
        assert sorted(got.split(",")) == ["2", "3", "4"]


async def test_lost_status_and_lost_record_are_restored_from_pods(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("keeper", {GPU: 1}))
        await client.create(SDG_KIND, group("victim", {GPU: 2}))
        await wait_bound(client, "keeper")
        victim = await wait_bound(client, "victim")
        await client.create(PODS, pod("v-pod", "victim"), namespace)
        await eventually(lambda: _has_node(client, "v-pod", namespace), what="v-pod bound")
    want = victim["status"]["selectedDevices"]
    # Disaster while the manager is down: the victim's status and the node's record vanish.
    fresh = await client.get(SDG_KIND, "victim")
    fresh["status"] = {}
    await client.update_status(SDG_KIND, fresh)
    await client.delete(CONFIGMAPS, "sdg-claims.n1", MANAGER_NS)
    await client.create(SDG_KIND, group("newcomer", {GPU: 1}))
    async with run_sdg(cluster):
        restored = await wait_bound(client, "victim")
        newcomer = await wait_bound(client, "newcomer")
        keeper = await wait_bound(client, "keeper")
    assert restored["status"]["nodeName"] == "n1"
    assert restored["status"]["selectedDevices"] == want  # from the pod's injected env
    pod_env = env_of(await client.get(PODS, "v-pod", namespace))
    assert pod_env["NVIDIA_VISIBLE_DEVICES"] == want[GPU]
    taken = {
        keeper["status"]["selectedDevices"][GPU],
        newcomer["status"]["selectedDevices"][GPU],
    }
    assert not set(",".join(taken).split(",")) & set(want[GPU].split(","))
    await assert_no_device_shared(client)


async def _has_node(client: Client, name: str, ns: str) -> bool:
    return bool((await client.get(PODS, name, ns))["spec"].get("nodeName"))


async def test_recovery_reports_pods_running_with_other_devices(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    held = await bound_group_with_a_rogue_pod(cluster, client, namespace)
    async with run_sdg(cluster):
        ready = await eventually(
            lambda: devices_conflict(client, "checked"), what="DevicesConflict"
        )
        assert ready["status"] == "False"
        assert f"{namespace}/rogue on n1" in ready["message"]
        assert "delete those pods" in ready["message"]
        g = await client.get(SDG_KIND, "checked")
        assert g["status"]["selectedDevices"] == {GPU: held}  # reported, never reallocated
        await client.delete(PODS, "rogue", namespace, grace_period_seconds=0)

        async def resolved() -> bool:
            g = await client.get(SDG_KIND, "checked")
            conds = {c["type"]: c for c in g["status"].get("conditions") or []}
            return conds["Ready"]["status"] == "True"

        await eventually(resolved, what="Ready again once the rogue pod is gone")
