"""DRA's books against a real control plane with kube-scheduler and kube-controller-manager:
a group entered as an allocated ResourceClaim (``controllers.draclaims``) keeps
kube-scheduler's DRA allocator off its devices, kube-controller-manager leaves the claim
allocated, and the mirror of every claim names each device's holder.

One fake Node (no kubelet: kube-scheduler binds to it, nothing runs) with a ResourceSlice
of 8 GPUs in the shape NVIDIA's DRA driver publishes today (``gpu-<minor>``, ``uuid``,
``type``, PCI bus ID, no ``index``), and the DeviceClass its chart installs. SDG's side runs
as the manager's ServiceAccount under exactly ``config/rbac``, and every rule (verb by verb)
that these books need is shown to be needed.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from controllers.draclaims import (
    CLAIM_FINALIZER,
    RESOURCECLAIMS,
    DeviceRef,
    DevicesHeldElsewhere,
    DraAllocations,
    DraPublisher,
    GroupClaimConflict,
    allocated_devices,
    consumer,
    group_claim_name,
)
from controllers.inventory import PCI_BUS_ID_ATTRIBUTE, RESOURCESLICES
from hack.node.simulators import DRA_DRIVER, pci_bus_id_for, sim_uuid
from sdgruntime import errors
from sdgruntime.cache import CacheSyncError, Informer
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import load_manifests
from sdgruntime.envtest.fakes import make_node
from sdgruntime.kinds import PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    ROOT,
    SA_GROUPS,
    SA_USER,
    eventually,
    group,
    install_rbac,
    manager_kubeconfig,
    wait_rbac,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

NODE = "dra-node"
GPUS = 8


def nvidia_gpu(minor: int) -> dict[str, Any]:
    """One full GPU as NVIDIA's DRA driver (v25.12) publishes it (hack/node/gpusim/dra.go)."""

    def s(value: str) -> dict[str, str]:
        return {"string": value}

    def v(value: str) -> dict[str, str]:
        return {"version": value}

    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": s("gpu"),
            "uuid": s(sim_uuid("dra-books", minor)),
            "productName": s("NVIDIA A100-SXM4-40GB"),
            "brand": s("Nvidia"),
            "architecture": s("Ampere"),
            "cudaComputeCapability": v("8.0.0"),
            "driverVersion": v("550.54.15"),
            "cudaDriverVersion": v("12.4.0"),
            PCI_BUS_ID_ATTRIBUTE: s(pci_bus_id_for(minor)),
        },
        "capacity": {"memory": {"value": "40Gi"}},
    }


@contextlib.contextmanager
def dra_cluster(
    labels: dict[str, str] | None = None, kcm_flags: tuple[str, ...] = ()
) -> Iterator[ControlPlane]:
    """kube-apiserver, kube-controller-manager and kube-scheduler; SDG's CRD and RBAC; one
    node ``NODE`` (``labels``) with 8 GPUs in a ResourceSlice, and the DeviceClass
    ``gpu.nvidia.com``."""
    with ControlPlane(
        crd_paths=[ROOT / "config" / "crd"],
        components=("kube-controller-manager", "kube-scheduler"),
        component_flags={"kube-controller-manager": list(kcm_flags)} if kcm_flags else None,
    ) as cp:
        install_rbac(cp)
        node = make_node(NODE, labels=labels)
        r = cp.http.post("/api/v1/nodes", json=node)
        assert r.status_code == 201, r.text
        r = cp.http.patch(
            f"/api/v1/nodes/{NODE}/status",
            json={"status": node["status"]},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text
        cp.apply(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DRA_DRIVER},
                "spec": {
                    "selectors": [{"cel": {"expression": f"device.driver == '{DRA_DRIVER}'"}}]
                },
            }
        )
        cp.apply(
            {
                "apiVersion": RESOURCESLICES.api_version,
                "kind": RESOURCESLICES.kind,
                "metadata": {"name": f"{NODE}-{DRA_DRIVER}"},
                "spec": {
                    "driver": DRA_DRIVER,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                    "devices": [nvidia_gpu(i) for i in range(GPUS)],
                },
            }
        )
        yield cp


@pytest.fixture(scope="module")
def books_cp() -> Iterator[ControlPlane]:
    with dra_cluster() as cp:
        yield cp


@pytest.fixture
async def admin(books_cp: ControlPlane) -> AsyncIterator[Client]:
    async with Client.from_kubeconfig(str(books_cp.kubeconfig_path)) as c:
        yield c


@pytest.fixture
async def manager(books_cp: ControlPlane) -> AsyncIterator[Client]:
    """A client with the manager's identity: its ServiceAccount, under config/rbac."""
    async with Client.from_kubeconfig(manager_kubeconfig(books_cp)) as c:
        yield c


@pytest.fixture
def ns(books_cp: ControlPlane) -> Iterator[str]:
    name = f"dra-{uuid.uuid4().hex[:10]}"
    books_cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    books_cp.http.delete(f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": 0})
    books_cp.http.delete(f"/api/v1/namespaces/{name}")


def refs(*minors: int) -> list[DeviceRef]:
    return [DeviceRef(DRA_DRIVER, NODE, f"gpu-{i}") for i in minors]


def names(devices: list[DeviceRef]) -> set[str]:
    return {d.device for d in devices}


async def new_group(admin: Client, name: str, count: int = 4) -> dict[str, Any]:
    return await admin.create(SDG_KIND, group(name, {GPU: count}))


async def plain_claim(admin: Client, ns: str, name: str, count: int) -> None:
    """A user's ResourceClaim for ``count`` GPUs and a pod that uses it."""
    spec = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER, "count": count}}]
    }
    await admin.create(
        RESOURCECLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": spec},
        },
        ns,
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"wants-{name}"},
        "spec": {
            # No kubelet heartbeats this node: kube-controller-manager taints it unreachable.
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    await admin.create(PODS, pod, ns)


async def allocation(client: Client, ns: str, name: str) -> set[str] | None:
    """The device names claim ``ns/name`` is allocated (None while unallocated)."""
    claim = await client.get(RESOURCECLAIMS, name, ns)
    if not (claim.get("status") or {}).get("allocation"):
        return None
    return names(allocated_devices(claim))


async def deallocated(client: Client, ns: str, name: str) -> bool:
    return await allocation(client, ns, name) is None


async def unschedulable(client: Client, ns: str, pod: str) -> bool:
    p = await client.get(PODS, pod, ns)
    conds = (p.get("status") or {}).get("conditions") or []
    return not p["spec"].get("nodeName") and any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in conds
    )


async def bound(client: Client, ns: str, pod: str) -> bool:
    return (await client.get(PODS, pod, ns))["spec"].get("nodeName") == NODE


async def gone(client: Client, ns: str, name: str) -> bool:
    try:
        await client.get(RESOURCECLAIMS, name, ns)
    except errors.NotFound:
        return True
    return False


@contextlib.asynccontextmanager
async def mirrored(client: Client) -> AsyncIterator[tuple[DraAllocations, Informer]]:
    """The mirror, fed by a ResourceClaim informer over all namespaces, synced."""
    mirror = DraAllocations(MANAGER_NS)
    informer = Informer(client, RESOURCECLAIMS)
    informer.add_handler(
        on_add=mirror.observe,
        on_update=lambda _old, claim: mirror.observe(claim),
        on_delete=mirror.forget,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(informer.run)
        try:
            await informer.wait_for_sync(10)
            yield mirror, informer
        finally:
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def cleaned(admin: Client, publisher: DraPublisher, *groups: str) -> AsyncIterator[None]:
    """Afterwards: the groups' claims released, the groups gone (the node's GPUs free)."""
    try:
        yield
    finally:
        for name in groups:
            with contextlib.suppress(errors.NotFound):
                claim = await admin.get(RESOURCECLAIMS, group_claim_name(name), MANAGER_NS)
                await admin.patch(
                    RESOURCECLAIMS,
                    claim["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                    MANAGER_NS,
                )
                await admin.delete(RESOURCECLAIMS, claim["metadata"]["name"], MANAGER_NS)
            with contextlib.suppress(errors.NotFound):
                await admin.delete(SDG_KIND, name)
        await eventually(
            lambda: all_gone(admin, [group_claim_name(n) for n in groups]), what="claims gone"
        )


async def all_gone(admin: Client, claims: list[str]) -> bool:
    for name in claims:
        if not await gone(admin, MANAGER_NS, name):
            return False
    return True


async def test_a_group_claim_keeps_kube_scheduler_off_the_groups_devices(
    admin: Client, manager: Client, ns: str
) -> None:
    publisher = DraPublisher(manager, MANAGER_NS)
    g = await new_group(admin, "books")
    held = refs(1, 3, 5, 7)
    async with cleaned(admin, publisher, "books"):
        claim = await publisher.ensure(g, NODE, held)
        assert names(allocated_devices(claim)) == names(held)
        assert claim["status"]["reservedFor"] == [consumer(g)]

        await plain_claim(admin, ns, "six", 6)
        await eventually(lambda: unschedulable(admin, ns, "wants-six"), what="six refused")
        assert await allocation(admin, ns, "six") is None

        await plain_claim(admin, ns, "four", 4)
        await eventually(lambda: bound(admin, ns, "wants-four"), what="four bound")
        assert await allocation(admin, ns, "four") == {"gpu-0", "gpu-2", "gpu-4", "gpu-6"}
        assert await allocation(admin, ns, "six") is None
        assert await unschedulable(admin, ns, "wants-six")

        # The pod goes: kube-controller-manager drops its reservation and deallocates its
        # claim; the group's claim, reserved for the group, stays allocated throughout.
        await admin.delete(PODS, "wants-four", ns, grace_period_seconds=0)
        await eventually(lambda: deallocated(admin, ns, "four"), what="four deallocated by kcm")

        async def ours_unchanged() -> None:
            c = await admin.get(RESOURCECLAIMS, group_claim_name("books"), MANAGER_NS)
            assert names(allocated_devices(c)) == names(held)
            assert c["status"]["reservedFor"] == [consumer(g)]
            assert CLAIM_FINALIZER in c["metadata"]["finalizers"]
            assert "deletionTimestamp" not in c["metadata"]

        for _ in range(6):  # a few seconds of the controller-manager's company
            await ours_unchanged()
            await anyio.sleep(0.5)
        assert await allocation(admin, ns, "six") is None  # 4 free: still not enough

        assert await publisher.remove("books", g["metadata"]["uid"]) is True
        assert await gone(admin, MANAGER_NS, group_claim_name("books"))
        await eventually(lambda: bound(admin, ns, "wants-six"), what="six bound")
        got = await allocation(admin, ns, "six")
        assert got is not None and len(got) == 6 and got & names(held)


async def test_the_mirror_fed_by_real_claims_names_each_devices_holder(
    admin: Client, manager: Client, ns: str
) -> None:
    publisher = DraPublisher(manager, MANAGER_NS)
    g = await new_group(admin, "mirrored", 2)
    async with mirrored(manager) as (mirror, _), cleaned(admin, publisher, "mirrored"):
        await publisher.ensure(g, NODE, refs(0, 1))
        await plain_claim(admin, ns, "two", 2)
        plain = await eventually(lambda: allocation(admin, ns, "two"), what="two allocated")
        assert not plain & {"gpu-0", "gpu-1"}
        want = {
            "gpu-0": ("mirrored",),
            "gpu-1": ("mirrored",),
            **{d: (f"ResourceClaim {ns}/two",) for d in plain},
        }
        await eventually(lambda: dict(mirror.holders(DRA_DRIVER, NODE)) == want, what="mirror")
        checked = DraPublisher(manager, MANAGER_NS, allocations=mirror)
        with pytest.raises(DevicesHeldElsewhere, match=f"by ResourceClaim {ns}/two"):
            await checked.ensure(g, NODE, [DeviceRef(DRA_DRIVER, NODE, d) for d in plain])

        await admin.delete(PODS, "wants-two", ns, grace_period_seconds=0)
        await eventually(
            lambda: set(mirror.holders(DRA_DRIVER, NODE)) == {"gpu-0", "gpu-1"},
            what="the deallocated claim's devices leave the mirror",
        )
        assert await publisher.remove("mirrored", g["metadata"]["uid"])
        await eventually(lambda: len(mirror) == 0, what="mirror empty")
        assert mirror.pools() == frozenset()


async def test_ensure_is_idempotent_and_never_repoints_a_claim(
    admin: Client, manager: Client
) -> None:
    publisher = DraPublisher(manager, MANAGER_NS)
    g = await new_group(admin, "steady", 2)
    uid = g["metadata"]["uid"]
    async with cleaned(admin, publisher, "steady"):
        first = await publisher.ensure(g, NODE, refs(2, 3))
        again = await publisher.ensure(g, NODE, refs(3, 2))
        assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

        with pytest.raises(GroupClaimConflict, match="never re-points"):
            await publisher.ensure(g, NODE, refs(2, 4))
        with pytest.raises(GroupClaimConflict, match="never re-points"):
            await publisher.ensure(g, "elsewhere", refs(2, 3))
        with pytest.raises(GroupClaimConflict, match="asks for"):
            await publisher.ensure(g, NODE, refs(2, 3, 4))
        claim = await admin.get(RESOURCECLAIMS, group_claim_name("steady"), MANAGER_NS)
        assert claim["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

        # The group is deleted and made again under its name: the old claim is not its.
        await admin.delete(SDG_KIND, "steady")
        g2 = await new_group(admin, "steady", 2)
        with pytest.raises(GroupClaimConflict, match=f"uid {uid}"):
            await publisher.ensure(g2, NODE, refs(2, 3))
        assert await publisher.remove("steady", g2["metadata"]["uid"]) is False  # left alone
        assert not await gone(admin, MANAGER_NS, group_claim_name("steady"))
        assert await publisher.remove("steady", uid) is True
        assert await gone(admin, MANAGER_NS, group_claim_name("steady"))
        assert await publisher.remove("steady", uid) is False  # already gone: fine
        claim = await publisher.ensure(g2, NODE, refs(2, 3))
        assert claim["status"]["reservedFor"] == [consumer(g2)]


async def test_a_claim_of_that_name_that_is_not_sdgs_is_neither_used_nor_removed(
    admin: Client, manager: Client
) -> None:
    publisher = DraPublisher(manager, MANAGER_NS)
    g = await new_group(admin, "squatted", 1)
    name = group_claim_name("squatted")
    spec = {"requests": [{"name": "devices-0", "exactly": {"deviceClassName": DRA_DRIVER}}]}
    await admin.create(
        RESOURCECLAIMS,
        {"metadata": {"name": name}, "spec": {"devices": spec}},
        MANAGER_NS,
    )
    async with cleaned(admin, publisher, "squatted"):
        with pytest.raises(GroupClaimConflict, match="not SDG's group claim"):
            await publisher.ensure(g, NODE, refs(4))
        assert await publisher.remove("squatted", g["metadata"]["uid"]) is False
        assert await allocation(admin, MANAGER_NS, name) is None


async def test_the_longest_group_name_gets_a_claim_the_api_server_accepts(
    admin: Client, manager: Client
) -> None:
    publisher = DraPublisher(manager, MANAGER_NS)
    long_name = "g" * 200 + "." + "h" * 52  # 253: the longest group name
    g = await new_group(admin, long_name, 1)
    async with cleaned(admin, publisher, long_name):
        claim = await publisher.ensure(g, NODE, refs(6))
        assert len(claim["metadata"]["name"]) <= 253
        assert names(allocated_devices(claim)) == {"gpu-6"}
        assert await publisher.remove(long_name, g["metadata"]["uid"]) is True


async def test_a_deleted_group_claim_stays_allocated_until_sdg_lets_it_go(
    admin: Client, manager: Client, ns: str
) -> None:
    """Deleted by hand, or by the garbage collector once its group is gone: Terminating,
    still allocated, so kube-scheduler still counts its devices, until remove()."""
    publisher = DraPublisher(manager, MANAGER_NS)
    g = await new_group(admin, "kept", 8)
    name = group_claim_name("kept")
    async with cleaned(admin, publisher, "kept"):
        await publisher.ensure(g, NODE, refs(*range(GPUS)))
        await admin.delete(SDG_KIND, "kept")  # the garbage collector deletes its claim

        async def terminating() -> bool:
            c = await admin.get(RESOURCECLAIMS, name, MANAGER_NS)
            return "deletionTimestamp" in c["metadata"]

        await eventually(terminating, within=90, what="the claim deleted by the collector")
        await plain_claim(admin, ns, "one", 1)
        await eventually(lambda: unschedulable(admin, ns, "wants-one"), what="one refused")
        again = await publisher.ensure(g, NODE, refs(*range(GPUS)))  # still the book entry
        assert names(allocated_devices(again)) == {f"gpu-{i}" for i in range(GPUS)}
        assert await publisher.remove("kept", g["metadata"]["uid"]) is True
        await eventually(lambda: bound(admin, ns, "wants-one"), what="one bound")


# --- RBAC: every rule these books need, verb by verb ---------------------------------


def _claim_rules() -> list[tuple[str, str, str]]:
    """(Role kind, resource, verb) of every resourceclaims rule in config/rbac/role.yaml."""
    out: list[tuple[str, str, str]] = []
    for obj in load_manifests([ROOT / "config" / "rbac" / "role.yaml"]):
        for rule in obj["rules"]:
            for resource in rule["resources"]:
                if resource.startswith("resourceclaims"):
                    out.extend((obj["kind"], resource, verb) for verb in rule["verbs"])
    return out


def _without(cp: ControlPlane, kind: str, resource: str, verb: str) -> None:
    for obj in load_manifests([ROOT / "config" / "rbac" / "role.yaml"]):
        if obj["kind"] != kind:
            continue
        rules = []
        for rule in obj["rules"]:
            if resource in rule["resources"]:
                rule = {**rule, "verbs": [v for v in rule["verbs"] if v != verb]}
            if rule["verbs"]:
                rules.append(rule)
        cp.apply({**obj, "rules": rules})


def _access(kind: str, resource: str, verb: str) -> dict[str, Any]:
    plural, _, sub = resource.partition("/")
    attrs = {"group": "resource.k8s.io", "resource": plural, "verb": verb}
    if sub:
        attrs["subresource"] = sub
    if kind == "Role":
        attrs["namespace"] = MANAGER_NS
    return {"user": SA_USER, "groups": SA_GROUPS, "resourceAttributes": attrs}


#: How a flow fails for want of a right (anything else is a bug, raised).
_REFUSALS = (AssertionError, errors.ApiError, CacheSyncError, GroupClaimConflict, TimeoutError)


def _refused(err: BaseException) -> bool:
    if isinstance(err, BaseExceptionGroup):  # from the mirror's task group
        return all(_refused(e) for e in err.exceptions)
    return isinstance(err, _REFUSALS)


def _describe(err: BaseException) -> str:
    if isinstance(err, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in err.exceptions)
    return f"{type(err).__name__}: {err}"


async def _books_flow(admin: Client, manager: Client, name: str) -> None:
    """Everything the books do: mirror every claim, enter a group, let it go."""
    publisher = DraPublisher(manager, MANAGER_NS)
    g = await new_group(admin, name, 1)
    async with mirrored(manager) as (mirror, informer), cleaned(admin, publisher, name):
        await publisher.ensure(g, NODE, refs(7))
        await eventually(
            lambda: mirror.holders(DRA_DRIVER, NODE).get("gpu-7") == (name,),
            within=10,
            what="the mirror sees the group's claim",
        )
        assert await publisher.remove(name, g["metadata"]["uid"]) is True
        await eventually(lambda: len(mirror) == 0, within=10, what="the mirror sees it go")
        # Followed by watching: a reflector that cannot watch would relist instead.
        stats = informer.reflector.stats
        assert (stats.lists, stats.watch_errors) == (1, 0), stats


async def test_the_books_work_under_exactly_config_rbac(admin: Client, manager: Client) -> None:
    await _books_flow(admin, manager, "rbac-all")


@pytest.mark.parametrize(
    "dropped", _claim_rules(), ids=lambda d: f"{d[0]}:{d[1]}:{d[2]}".replace("/", "_")
)
async def test_every_resourceclaims_verb_is_needed(
    books_cp: ControlPlane, admin: Client, manager: Client, dropped: tuple[str, str, str]
) -> None:
    kind, resource, verb = dropped
    _without(books_cp, kind, resource, verb)
    wait_rbac(books_cp, _access(kind, resource, verb), False)
    failed = False
    try:
        with anyio.fail_after(40):
            await _books_flow(admin, manager, f"rbac-{verb}-{resource.replace('/', '-')}")
    except Exception as err:
        if not _refused(err):
            raise
        failed = True
        print(f"without {kind} {resource} {verb}: {_describe(err)[:400]}")
    finally:
        install_rbac(books_cp)
        wait_rbac(books_cp, _access(kind, resource, verb), True)
    assert failed, f"the books still work without {kind} {resource} {verb}: too broad"
