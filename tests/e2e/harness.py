"""Runs SDG in-process against the real local API server, as a cluster would run it:
under the ServiceAccount identity and RBAC of ``config/rbac``, with the API server calling
our webhooks over TLS (``config/webhook`` rewritten to a loopback URL) and enforcing the
admission policies of ``config/policy`` itself."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
from opentelemetry import trace

from api.constants import SDG_KIND
from controllers.app import SDG
from controllers.inventory import node_offers
from controllers.ledger.book import Ledger
from controllers.ledger.records import RECORD_LABEL, RECORD_LABEL_VALUE
from controllers.settings import Settings
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port, load_manifests
from sdgruntime.envtest.fakes import DeviceNames, Kubelet, create_node, make_node
from sdgruntime.kinds import CONFIGMAPS, LEASES, NODES, PODS

ROOT = Path(__file__).resolve().parents[2]
MANAGER_NS = "deviceshare-system"
SA_USER = f"system:serviceaccount:{MANAGER_NS}:deviceshare-manager"
SA_GROUPS = [
    "system:serviceaccounts",
    f"system:serviceaccounts:{MANAGER_NS}",
    "system:authenticated",
]
GPU = "nvidia.com/gpu"
SHARED = {"deviceshare.io/mode": "shared"}
MEMBERSHIP_POLICY = "deviceshare-group-membership"


def install_rbac(
    cp: ControlPlane, drop_rule: Callable[[dict[str, Any]], bool] | None = None
) -> None:
    """Namespace + config/rbac (and config/holders' PriorityClass); ``drop_rule`` removes
    matching ClusterRole rules (tests that prove the role is exact)."""
    cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MANAGER_NS}})
    for obj in load_manifests([ROOT / "config" / "holders"]):
        cp.apply(obj)
    for obj in load_manifests([ROOT / "config" / "rbac"]):
        if drop_rule and obj["kind"] in ("ClusterRole", "Role"):
            obj = {**obj, "rules": [r for r in obj["rules"] if not drop_rule(r)]}
            # apply replaces the rules list the field manager owns
        cp.apply(obj)


def rbac_allows(cp: ControlPlane, spec: dict[str, Any]) -> bool:
    """The API server's answer to a SubjectAccessReview of ``spec``."""
    r = cp.http.post(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        json={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        },
    )
    assert r.status_code == 201, r.text
    return bool(r.json()["status"].get("allowed"))


def wait_rbac(cp: ControlPlane, spec: dict[str, Any], want: bool, timeout: float = 10.0) -> None:
    """Until the API server's authorizer answers ``want``: RBAC changes reach it through an
    informer, and the manager caches decisions, so a test must not act before."""
    deadline = time.monotonic() + timeout
    while rbac_allows(cp, spec) != want:
        assert time.monotonic() < deadline, f"RBAC never answered {want} for {spec}"
        time.sleep(0.05)


def install_policies(cp: ControlPlane, timeout: float = 30.0) -> None:
    """config/policy, applied as stored and waited for: the API server starts enforcing a
    policy a moment after storing it. The membership policy goes last and a dry-run
    annotation of a probe pod waits for it; the API server watches policies and bindings
    in order, so the earlier ones are in force by then too."""
    docs = load_manifests([ROOT / "config" / "policy"])
    for obj in sorted(docs, key=lambda d: d["metadata"]["name"] == MEMBERSHIP_POLICY):
        cp.apply(obj)
    pods = "/api/v1/namespaces/default/pods"
    probe = pod("policy-probe", None)
    r = cp.http.post(pods, json=probe)
    assert r.status_code in (201, 409), r.text
    try:
        deadline = time.monotonic() + timeout
        while True:
            r = cp.http.patch(
                f"{pods}/policy-probe",
                params={"dryRun": "All"},
                json={"metadata": {"annotations": {"deviceshare.io/group": "probe"}}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            if r.status_code == 403 and MEMBERSHIP_POLICY in r.text:
                return
            assert r.status_code == 200, r.text
            assert time.monotonic() < deadline, f"{MEMBERSHIP_POLICY} not enforced"
            time.sleep(0.1)
    finally:
        cp.http.delete(f"{pods}/policy-probe", params={"gracePeriodSeconds": 0})


def manager_kubeconfig(cp: ControlPlane) -> str:
    return str(cp.user_kubeconfig(SA_USER, SA_GROUPS))


@contextlib.asynccontextmanager
async def run_sdg(
    cp: ControlPlane,
    *,
    webhooks: bool = True,
    tracer_provider: trace.TracerProvider | None = None,
    **settings: Any,
) -> AsyncIterator[SDG]:
    """A running SDG manager (leader election off unless asked); stopped on exit.

    Holder pods are off unless asked (``holders="auto"``): most tests run no kubelet that
    could give a holder its devices (``kubelet(client, devices=...)`` does)."""
    port = free_port()
    values: dict[str, Any] = {
        "kubeconfig": manager_kubeconfig(cp),
        "metrics_bind_address": "127.0.0.1:0",
        "health_probe_bind_address": "127.0.0.1:0",
        "webhook_host": "127.0.0.1",
        "webhook_port": port,
        "webhook_cert_dir": str(cp.webhook_cert_dir()),
        "claims_namespace": MANAGER_NS,
        "holders": "off",
        **settings,
    }
    sdg = SDG(Settings(**values), tracer_provider=tracer_provider, graceful_shutdown_timeout=5)
    async with anyio.create_task_group() as tg:
        await tg.start(sdg.manager.run_until_cancelled)
        if webhooks:
            cp.install_webhooks([ROOT / "config" / "webhook"], port)
        try:
            yield sdg
        finally:
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def kubelet(client: Client, devices: DeviceNames | None = None) -> AsyncIterator[Kubelet]:
    """The fake kubelet, running; with ``devices`` also the kubelet's device manager."""
    k = Kubelet(client, devices=devices)
    async with anyio.create_task_group() as tg:
        await tg.start(k.run)
        try:
            yield k
        finally:
            tg.cancel_scope.cancel()


def remove_webhooks(cp: ControlPlane) -> None:
    for obj in load_manifests([ROOT / "config" / "webhook"]):
        if obj["kind"].endswith("WebhookConfiguration"):
            cp.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


async def reset_cluster(client: Client, cp: ControlPlane) -> None:
    """Remove every group (finalizers first), node and claim record: tests share the
    session's API server, and placement looks at every node."""
    remove_webhooks(cp)
    groups, _ = await client.list_all(SDG_KIND)
    for g in groups:
        name = g["metadata"]["name"]
        with contextlib.suppress(errors.NotFound):
            await client.patch(SDG_KIND, name, {"metadata": {"finalizers": None}})
        with contextlib.suppress(errors.NotFound):
            await client.delete(SDG_KIND, name)
    pods, _ = await client.list_all(PODS)
    for p in pods:
        with contextlib.suppress(errors.NotFound):
            await client.delete(
                PODS, p["metadata"]["name"], p["metadata"]["namespace"], grace_period_seconds=0
            )
    nodes, _ = await client.list_all(NODES)
    for n in nodes:
        with contextlib.suppress(errors.NotFound):
            await client.delete(NODES, n["metadata"]["name"])
    with contextlib.suppress(errors.NotFound):
        cms, _ = await client.list_all(CONFIGMAPS, MANAGER_NS)
        for cm in cms:
            if cm["metadata"]["name"].startswith("sdg-claims."):
                with contextlib.suppress(errors.NotFound):
                    await client.delete(CONFIGMAPS, cm["metadata"]["name"], MANAGER_NS)


async def add_node(
    client: Client,
    name: str,
    gpus: int = 0,
    *,
    labels: Mapping[str, str] | None = None,
    shared: bool = True,
    extra: Mapping[str, str | int] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    alloc: dict[str, str | int] = {**({GPU: gpus} if gpus else {}), **(extra or {})}
    node_labels = {**(SHARED if shared else {}), **(labels or {})}
    return await create_node(
        client, make_node(name, labels=node_labels, allocatable=alloc, **kwargs)
    )


def group(name: str, resources: Mapping[str, int] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": SDG_KIND.api_version,
        "kind": SDG_KIND.kind,
        "metadata": {"name": name},
        "spec": {"resources": dict(resources or {GPU: 1}), **spec},
    }


def pod(name: str, group_name: str | None, *, containers: int = 1, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if group_name is not None:
        meta["annotations"] = {"deviceshare.io/group": group_name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [
                {"name": f"c{i}", "image": "busybox", "command": ["sleep", "3600"]}
                for i in range(containers)
            ],
            **spec,
        },
    }


async def eventually(
    fn: Callable[[], Any], *, within: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``fn`` (sync or async) until it returns a truthy value; fail with ``what``."""
    last: Any = None
    with anyio.move_on_after(within):
        while True:
            try:
                last = fn()
                if hasattr(last, "__await__"):
                    last = await last
            except errors.NotFound:
                last = None
            if last:
                return last
            await anyio.sleep(interval)
    raise AssertionError(f"timed out after {within}s waiting for {what or fn}: last={last!r}")


async def wait_bound(client: Client, name: str, within: float = 20.0) -> dict[str, Any]:
    async def bound() -> dict[str, Any] | None:
        g = await client.get(SDG_KIND, name)
        return g if (g.get("status") or {}).get("phase") == "Bound" else None

    return await eventually(bound, within=within, what=f"group {name} Bound")


async def lease_held_elsewhere(client: Client, name: str) -> None:
    """Lease ``name`` held by another replica for an hour: a manager started with
    ``leader_election_id=name`` is a standby (it serves the webhooks, leads nothing)."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": MANAGER_NS},
        "spec": {"holderIdentity": "other-replica", "leaseDurationSeconds": 3600, "renewTime": now},
    }
    await client.create(LEASES, lease, MANAGER_NS)


async def bound_group_with_a_rogue_pod(
    cp: ControlPlane, client: Client, namespace: str, name: str = "checked"
) -> str:
    """Group ``name`` (1 GPU) bound on n1 by a manager that then stops, and, created while
    no webhook runs, a pod of that group on n1 with other devices (GPU 3) than the group
    holds: what the group's devices conflict is made of. Returns the group's devices."""
    await add_node(client, "n1", 4)
    async with run_sdg(cp):
        await client.create(SDG_KIND, group(name, {GPU: 1}))
        held = str((await wait_bound(client, name))["status"]["selectedDevices"][GPU])
    remove_webhooks(cp)
    rogue = pod("rogue", name, nodeName="n1")
    rogue["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "3"}]
    await client.create(PODS, rogue, namespace)
    return held


async def devices_conflict(client: Client, name: str) -> dict[str, Any] | None:
    """The group's Ready condition when it says DevicesConflict (else None)."""
    g = await client.get(SDG_KIND, name)
    ready = {c["type"]: c for c in (g.get("status") or {}).get("conditions") or []}.get("Ready")
    return ready if ready and ready.get("reason") == "DevicesConflict" else None


def env_of(
    pod_obj: Mapping[str, Any], container: int = 0, kind: str = "containers"
) -> dict[str, str]:
    c = pod_obj["spec"][kind][container]
    return {e["name"]: e.get("value", "") for e in c.get("env") or []}


async def ledger_of(client: Client) -> tuple[Ledger, list[dict[str, Any]]]:
    """The ledger as the manager would build it from what the API server holds now (the
    claim records and every group), and the groups it was built from."""
    groups, _ = await client.list_all(SDG_KIND)
    records, _ = await client.list_all(
        CONFIGMAPS, MANAGER_NS, label_selector=f"{RECORD_LABEL}={RECORD_LABEL_VALUE}"
    )
    nodes, _ = await client.list_all(NODES)
    offers = {n["metadata"]["name"]: node_offers(n) for n in nodes}
    ledger = Ledger.from_objects(
        configmaps=records, groups=groups, offers=offers, namespace=MANAGER_NS
    )
    return ledger, groups


async def assert_no_device_shared(client: Client) -> None:
    """The safety promise, read through the ledger: no record is unreadable, no device
    is claimed by two holders, each group is claimed on one node at most, and every Bound
    group's status is exactly its claim in its node's record (and there is one)."""
    ledger, groups = await ledger_of(client)
    assert any((g.get("status") or {}).get("phase") == "Bound" for g in groups), "none Bound"
    assert not ledger.broken, ledger.broken
    twice = {n: c for n in ledger.records if (c := ledger.view(n).conflicts())}
    assert not twice, twice
    assert not ledger.conflicts, ledger.conflicts
    for g in groups:
        name = g["metadata"]["name"]
        assert len(ledger.nodes_claiming(name)) <= 1, (name, ledger.nodes_claiming(name))
        status = g.get("status") or {}
        if status.get("phase") == "Bound":
            held = ledger.claim_of(name)
            assert held is not None and held == ledger.statuses.get(name), (name, held, status)
            assert ledger.view(status["nodeName"]).held_by(name) == held[1], name
