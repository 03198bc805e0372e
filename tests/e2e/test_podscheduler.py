"""The pod scheduler owes a node's own checks: CPU/memory/pods, taints, ports, cordon."""

from __future__ import annotations

import anyio
import pytest

from api.constants import SDG_KIND
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import EVENTS, NODES, PODS
from tests.e2e.harness import (
    add_node,
    eventually,
    group,
    lease_held_elsewhere,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def _requests(p: dict, cpu: str) -> dict:
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": "64Mi"}}
    return p


async def _scheduled_condition(client: Client, name: str, ns: str) -> dict | None:
    p = await client.get(PODS, name, ns)
    for c in (p.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return c
    return None


async def test_full_cpu_keeps_a_pod_pending_until_space_frees(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 1, extra={"cpu": "2"})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {"nvidia.com/gpu": 1}))
        await wait_bound(client, "g")
        await client.create(PODS, _requests(pod("big", "g"), "1500m"), namespace)
        await eventually(lambda: _bound(client, "big", namespace), what="first pod bound")
        await client.create(PODS, _requests(pod("second", "g"), "1"), namespace)
        cond = await eventually(
            lambda: _scheduled_condition(client, "second", namespace), what="PodScheduled=False"
        )
        assert cond["reason"] == "Unschedulable"
        assert "Insufficient cpu" in cond["message"]
        assert "n1" in cond["message"]

        async def failed_event() -> list:
            evs, _ = await client.list_all(EVENTS, namespace)
            return [
                e
                for e in evs
                if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "second"
            ]

        await eventually(failed_event, what="FailedScheduling event")
        assert not (await client.get(PODS, "second", namespace))["spec"].get("nodeName")

        await client.delete(PODS, "big", namespace, grace_period_seconds=0)
        await eventually(lambda: _bound(client, "second", namespace), what="second bound")


async def test_untolerated_taint_blocks_and_toleration_allows(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "tainted", 2)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {"nvidia.com/gpu": 1}))
        await wait_bound(client, "g")
        node = await client.get(NODES, "tainted")
        node["spec"]["taints"] = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
        await client.update(NODES, node)
        await client.create(PODS, pod("intolerant", "g"), namespace)
        cond = await eventually(
            lambda: _scheduled_condition(client, "intolerant", namespace),
            what="PodScheduled=False",
        )
        assert "untolerated taint {dedicated: ml}" in cond["message"]
        tolerant = pod("tolerant", "g")
        tolerant["spec"]["tolerations"] = [
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
        ]
        await client.create(PODS, tolerant, namespace)
        await eventually(lambda: _bound(client, "tolerant", namespace), what="tolerant bound")
        assert not (await client.get(PODS, "intolerant", namespace))["spec"].get("nodeName")


async def test_many_pods_of_one_group_bind_to_its_node(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "other", 8)
    await add_node(client, "home", 2, extra={"pods": "110"})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("team", {"nvidia.com/gpu": 2}))
        g = await wait_bound(client, "team")
        home = g["status"]["nodeName"]
        for i in range(20):
            await client.create(PODS, pod(f"w{i}", "team"), namespace)

        async def all_bound() -> list:
            pods, _ = await client.list_all(PODS, namespace)
            nodes = [p["spec"].get("nodeName") for p in pods]
            return nodes if len(nodes) == 20 and all(nodes) else []

        nodes = await eventually(all_bound, what="20 pods bound")
        assert set(nodes) == {home}


async def _bound(client: Client, name: str, ns: str) -> bool:
    return bool((await client.get(PODS, name, ns))["spec"].get("nodeName"))


async def test_a_burst_of_binds_has_one_scheduled_event_and_the_group_names_them_all(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4)
    names = [f"burst-{i}" for i in range(4)]
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("burst", {"nvidia.com/gpu": 1}))
        uid = (await wait_bound(client, "burst"))["metadata"]["uid"]
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(client.create, PODS, pod(name, "burst"), namespace)
        for name in names:
            await eventually(lambda n=name: _bound(client, n, namespace), what=f"{name} bound")

        async def events(ns: str, reason: str, uids: set[str]) -> list[dict]:
            evs, _ = await client.list_all(EVENTS, ns)
            return [
                e for e in evs if e["reason"] == reason and e["involvedObject"].get("uid") in uids
            ]

        async def all_joined() -> bool:
            told = " ".join(e["message"] for e in await events("default", "PodsJoined", {uid}))
            return all(f"{namespace}/{name}" in told for name in names)

        # The group's PodsJoined (told once the group is quiet for 5 s) names every pod.
        await eventually(all_joined, what="PodsJoined naming the four pods")
        uids = {(await client.get(PODS, n, namespace))["metadata"]["uid"] for n in names}
        scheduled = await events(namespace, "Scheduled", uids)
        # Four binds within seconds of each other are one burst: its first bind has its
        # Event, the others none (a second burst only if binds came 5 s apart).
        assert 1 <= len(scheduled) < len(names)


async def test_a_backlog_is_bound_before_its_group_status_is_written(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    """After a failover the binds go first: the group's status, held while pods wait in
    the pod scheduler's queue, is written once they are taken, naming them all.
    (resourceVersions are etcd revisions here, one order for pods and groups.)"""
    await add_node(client, "n1", 2)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("drain", {"nvidia.com/gpu": 1}))
        await wait_bound(client, "drain")
    # A standby serves the webhook while the lease is held elsewhere: the backlog.
    await lease_held_elsewhere(client, f"held-{namespace}")
    names = [f"b{i:02d}" for i in range(30)]
    async with run_sdg(cluster, leader_elect=True, leader_election_id=f"held-{namespace}"):
        for name in names:
            await client.create(PODS, pod(name, "drain"), namespace)
    start = (await client.get(SDG_KIND, "drain"))["metadata"]["resourceVersion"]
    counts: list[tuple[int, int]] = []  # (resourceVersion, podCount) of each group write

    async def watch_group() -> None:
        async for ev in client.watch(
            SDG_KIND, resource_version=start, field_selector="metadata.name=drain"
        ):
            obj = ev["object"]
            if ev["type"] == "MODIFIED":
                rv = int(obj["metadata"]["resourceVersion"])
                counts.append((rv, (obj.get("status") or {}).get("podCount", 0)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_group)
        # One pod worker: the queue holds the backlog for as long as it takes.
        async with run_sdg(cluster, pod_workers=1):

            async def bound() -> list[int]:
                pods, _ = await client.list_all(PODS, namespace)
                rvs = [int(p["metadata"]["resourceVersion"]) for p in pods]
                return sorted(rvs) if all(p["spec"].get("nodeName") for p in pods) else []

            binds = await eventually(bound, what="the backlog bound")
            await eventually(lambda: any(n == 30 for _, n in counts), what="podCount 30")
        tg.cancel_scope.cancel()
    assert len(binds) == 30
    first_write = min(rv for rv, n in counts if n > 0)
    # Written after the last pod was taken from the queue: after all binds but at most
    # the one still in flight.
    assert first_write > binds[-2], (first_write, binds)
    assert next(n for _, n in counts if n > 0) == 30
