"""Several group workers at once: binds onto the same few nodes overlap, their record
writes are serialised and coalesced per node, and still no device is held twice: not in
the records, not between a record and a group's status."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from controllers.ledger.book import Ledger
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS
from sdgruntime.metrics import REGISTRY
from tests.e2e.harness import GPU, MANAGER_NS, add_node, eventually, group, run_sdg

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

WORKERS = 8


def _conflicts() -> float:
    """Claim-record writes that lost to another writer (409) or to an overlap, so far."""
    labels = {"kind": "group", "result": "conflict"}
    return REGISTRY.get_sample_value("sdg_scheduling_attempts_total", labels) or 0.0


async def _decided(client: Client, names: set[str]) -> list[dict[str, Any]]:
    """Every group of ``names`` once each is Bound or says why it is not (else [])."""
    groups, _ = await client.list_all(SDG_KIND)
    mine = [g for g in groups if g["metadata"]["name"] in names]
    done = [
        g
        for g in mine
        if (g.get("status") or {}).get("phase") == "Bound"
        or any(c["type"] == "Scheduled" for c in (g.get("status") or {}).get("conditions") or [])
    ]
    return mine if len(done) == len(names) else []


Held = dict[str, tuple[str, dict[str, list[int]]]]


def _bound(groups: list[dict[str, Any]]) -> Held:
    out: Held = {}
    for g in groups:
        st = g.get("status") or {}
        if st.get("phase") == "Bound" and not g["metadata"].get("deletionTimestamp"):
            devices = {r: [int(i) for i in v.split(",")] for r, v in st["selectedDevices"].items()}
            out[g["metadata"]["name"]] = (st["nodeName"], devices)
    return out


async def _holdings(client: Client) -> tuple[dict[str, list[tuple[str, Any]]], Held]:
    """(group -> its claims in the records, group -> node and devices of its Bound status),
    asserting what holds at every moment, even while binds and deletes are in flight: no
    device is in two claims, and a Bound group's status is its claim in its node's record
    (the record is written before the status, and released only once the group is being
    deleted). Groups are read before and after the records: a group Bound before and
    not being deleted after must have had its claim in between."""
    groups, _ = await client.list_all(SDG_KIND)
    records, _ = await client.list_all(CONFIGMAPS, MANAGER_NS)
    after, _ = await client.list_all(SDG_KIND)
    held: Counter[tuple[str, str, int]] = Counter()
    claims: dict[str, list[tuple[str, Any]]] = {}
    ledger = Ledger.from_objects(configmaps=records, namespace=MANAGER_NS)
    assert not ledger.broken, ledger.broken
    for node, record in ledger.records.items():
        for name, devices in record.claims.items():
            claims.setdefault(name, []).append((node, devices))
            held.update((node, res, i) for res, ids in devices.items() for i in ids)
    twice = [k for k, n in held.items() if n > 1]
    assert not twice, twice
    still = {g["metadata"]["uid"] for g in after if not g["metadata"].get("deletionTimestamp")}
    uids = {g["metadata"]["name"]: g["metadata"]["uid"] for g in groups}
    statuses = _bound(after)
    for name, bound in _bound(groups).items():
        if uids[name] in still:
            assert bound in claims.get(name, []), (name, bound, claims.get(name))
    return claims, statuses


async def _settled(client: Client) -> Held:
    """The Bound groups once the records claim exactly what their statuses say, and
    nothing else (else {}: a bind or a release is still in flight)."""
    claims, statuses = await _holdings(client)
    exact = {name: held[0] for name, held in claims.items() if len(held) == 1}
    return statuses if exact == statuses and len(exact) == len(claims) else {}


async def test_many_groups_at_once_binpack_onto_few_nodes(
    cluster: ControlPlane, client: Client
) -> None:
    sizes = {"n0": 8, "n1": 8, "n2": 4}
    for node, gpus in sizes.items():
        await add_node(client, node, gpus)
    names = {f"bp-{i:02d}" for i in range(40)}
    before = _conflicts()
    async with run_sdg(cluster, group_workers=WORKERS) as sdg:
        assert sdg.settings.group_workers == WORKERS
        async with anyio.create_task_group() as tg:
            for name in sorted(names):
                tg.start_soon(client.create, SDG_KIND, group(name, {GPU: 1}))
        groups = await eventually(lambda: _decided(client, names), within=60, what="decided")
        await anyio.sleep(0.5)  # late retries must not change the outcome
        claims = await eventually(lambda: _settled(client), what="records match statuses")
    # 20 GPUs for 40 one-GPU groups: every GPU is given out, each once.
    assert len(claims) == 20
    assert Counter(node for node, _ in claims.values()) == Counter(sizes)
    pending = [g for g in groups if g["metadata"]["name"] not in claims]
    assert len(pending) == 20 and all(g["status"]["phase"] == "Pending" for g in pending)
    # One writer per record: its writes never lose to each other (no 409, no overlap).
    assert _conflicts() == before


async def test_mixed_sizes_leave_no_pending_group_that_would_fit(
    cluster: ControlPlane, client: Client
) -> None:
    sizes = {"n0": 8, "n1": 6, "n2": 3}
    for node, gpus in sizes.items():
        await add_node(client, node, gpus)
    want = {f"mx-{i:02d}": 1 + i % 3 for i in range(24)}  # 48 GPUs asked, 17 offered
    async with run_sdg(cluster, group_workers=WORKERS):
        async with anyio.create_task_group() as tg:
            for name, gpus in want.items():
                tg.start_soon(client.create, SDG_KIND, group(name, {GPU: gpus}))
        groups = await eventually(lambda: _decided(client, set(want)), within=60, what="decided")
        await anyio.sleep(0.5)
        claims = await eventually(lambda: _settled(client), what="records match statuses")
    free = dict(sizes)
    for name, (node, devices) in claims.items():
        assert len(devices[GPU]) == want[name]
        free[node] -= want[name]
    assert min(free.values()) >= 0
    for g in groups:
        if g["metadata"]["name"] not in claims:
            assert want[g["metadata"]["name"]] > max(free.values()), (g["metadata"]["name"], free)


async def test_deletes_and_creates_at_once_reuse_freed_devices(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "n0", 8)
    await add_node(client, "n1", 8)
    first = {f"old-{i:02d}" for i in range(16)}
    second = {f"new-{i:02d}" for i in range(8)}
    async with run_sdg(cluster, group_workers=WORKERS):
        async with anyio.create_task_group() as tg:
            for name in sorted(first):
                tg.start_soon(client.create, SDG_KIND, group(name, {GPU: 1}))
        await eventually(lambda: _decided(client, first), within=60, what="first decided")
        full = await eventually(lambda: _settled(client), what="records match statuses")
        assert len(full) == 16
        gone = sorted(first)[:8]
        async with anyio.create_task_group() as tg:
            for name in gone:
                tg.start_soon(client.delete, SDG_KIND, name)
            for name in sorted(second):
                tg.start_soon(client.create, SDG_KIND, group(name, {GPU: 1}))

        async def all_bound() -> Held:
            claims = await _settled(client)
            return claims if set(claims) == (first - set(gone)) | second else {}

        await eventually(all_bound, within=60, what="the new groups bound on freed devices")
    # And a restart (recovery from the records) agrees with what was written.
    async with run_sdg(cluster, group_workers=WORKERS):
        await anyio.sleep(1.0)
        assert set(await _settled(client)) == (first - set(gone)) | second


async def test_two_managers_with_several_workers_each_never_share(
    cluster: ControlPlane, client: Client
) -> None:
    for i in range(3):
        await add_node(client, f"n{i}", 8)
    names = {f"race-{i:02d}": 1 + i % 2 for i in range(40)}
    async with (
        run_sdg(cluster, group_workers=WORKERS),
        run_sdg(cluster, webhooks=False, group_workers=WORKERS),
    ):
        async with anyio.create_task_group() as tg:
            for name, gpus in names.items():
                tg.start_soon(client.create, SDG_KIND, group(name, {GPU: gpus}))
        await eventually(lambda: _decided(client, set(names)), within=120, what="decided")
        await anyio.sleep(1.0)
        claims = await eventually(lambda: _settled(client), within=30, what="records match")
    assert sum(names[n] for n in claims) <= 24
