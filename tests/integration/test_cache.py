"""The shared informer cache against the real local API server (and its etcd).

Covers what controllers rely on: handlers see every change with the right objects, scoped
caches see only their objects, indexes, and recovery: an API server restart, a 410 after
etcd compaction, a silently stalled watch, and a clear early error when a kind cannot sync.
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
import yaml

from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.cache import (
    Cache,
    CacheNotSynced,
    CacheSyncError,
    KindOptions,
    ReflectorOptions,
    field_indexer,
)
from sdgruntime.client import Client, RetryPolicy
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port
from sdgruntime.kinds import CONFIGMAPS, NAMESPACES, PODS, Kind

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GROUP_ANNOTATION = "deviceshare.io/group"
# Recovery tests should not wait out production backoffs (0.8 s doubling to 30 s).
FAST = ReflectorOptions(backoff_initial=0.1, backoff_max=0.5)


# --- helpers -------------------------------------------------------------------------


def cm(name: str, data: dict[str, str] | None = None, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data or {}}


def pod(name: str, node: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {GROUP_ANNOTATION: group}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }


def name_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


class Recorder:
    """Event handlers that record ``(type, name, objects)`` in arrival order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    def add(self, obj: dict[str, Any]) -> None:
        self.events.append(("add", name_of(obj), obj))

    def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self.events.append(("update", name_of(new), (old, new)))

    def delete(self, obj: dict[str, Any]) -> None:
        self.events.append(("delete", name_of(obj), obj))

    def of(self, name: str) -> list[tuple[str, Any]]:
        return [(t, o) for t, n, o in self.events if n == name]

    def types(self, name: str) -> list[str]:
        return [t for t, _ in self.of(name)]

    def has(self, typ: str, name: str) -> bool:
        return typ in self.types(name)


async def eventually(cond: Callable[[], bool], what: str, within: float = 20.0) -> None:
    """Wait for a condition the cache reaches asynchronously (the timeout is a failsafe)."""
    try:
        with anyio.fail_after(within):
            while not cond():  # noqa: ASYNC110 - conditions are plain state, not events
                await anyio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def running(cache: Cache, sync_timeout: float | None = 30.0) -> AsyncIterator[Cache]:
    """Run the cache in a task group (cancelled on exit), optionally waiting for sync."""
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        if sync_timeout is not None:
            await cache.wait_for_sync(sync_timeout)
        yield cache
        tg.cancel_scope.cancel()


def in_cache(cache: Cache, kind: Kind, name: str, namespace: str | None = None) -> bool:
    try:
        cache.get(kind, name, namespace, copy=False)
    except errors.NotFound:
        return False
    return True


# --- events, scopes, indexes ---------------------------------------------------------


async def test_handlers_see_creates_updates_and_deletes(client: Client, namespace: str) -> None:
    cache = Cache(client, by_kind={CONFIGMAPS: KindOptions(namespace=namespace)})
    early = Recorder()
    cache.informer(CONFIGMAPS).add_handler(early.add, early.update, early.delete)
    await client.create(CONFIGMAPS, cm("before", {"v": "0"}), namespace)

    async with running(cache):
        assert early.types("before") == ["add"]  # the initial list is delivered as adds
        await client.create(CONFIGMAPS, cm("a", {"v": "1"}), namespace)
        await eventually(lambda: early.has("add", "a"), "add of a")
        assert cache.get(CONFIGMAPS, "a", namespace)["data"] == {"v": "1"}

        await client.patch(CONFIGMAPS, "a", {"data": {"v": "2"}}, namespace)
        await eventually(lambda: early.has("update", "a"), "update of a")
        await client.delete(CONFIGMAPS, "a", namespace)
        await eventually(lambda: early.has("delete", "a"), "delete of a")

        (_, added), (_, (old, new)), (_, deleted) = early.of("a")
        assert added["data"] == {"v": "1"}
        assert (old["data"], new["data"]) == ({"v": "1"}, {"v": "2"})
        assert deleted["data"] == {"v": "2"}  # the final state
        assert "managedFields" not in added["metadata"]  # the default transform
        with pytest.raises(errors.NotFound):
            cache.get(CONFIGMAPS, "a", namespace)

        # A handler added late gets synthetic adds for what is already there, then live events.
        late = Recorder()
        cache.informer(CONFIGMAPS).add_handler(late.add, late.update, late.delete)
        assert [(t, n) for t, n, _ in late.events] == [("add", "before")]
        await client.delete(CONFIGMAPS, "before", namespace)
        await eventually(lambda: late.has("delete", "before"), "late handler's delete")


async def test_cluster_scoped_custom_kind(client: Client) -> None:
    name = f"g-{uuid.uuid4().hex[:8]}"
    cache = Cache(client)
    cache.add_index(SDG_KIND, "strategy", field_indexer("spec.schedulingStrategy"))
    async with running(cache):
        obj = {"metadata": {"name": name}, "spec": {"resources": {"nvidia.com/gpu": 1}}}
        await client.create(
            SDG_KIND, {"apiVersion": SDG_KIND.api_version, "kind": "SharedDeviceGroup", **obj}
        )
        try:
            await eventually(lambda: in_cache(cache, SDG_KIND, name), "the group in the cache")
            assert cache.get(SDG_KIND, name)["spec"]["resources"] == {"nvidia.com/gpu": 1}
            spread = cache.list(SDG_KIND, index="strategy", value="spread")
            assert name not in [name_of(o) for o in spread]
        finally:
            await client.delete(SDG_KIND, name)


@pytest.fixture
def other_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    r = control_plane.http.post(
        NAMESPACES.path(),
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    assert r.status_code == 201, r.text
    yield name
    control_plane.http.delete(NAMESPACES.path(name=name))


async def test_namespace_and_label_selector_scope_what_is_cached(
    client: Client, namespace: str, other_namespace: str
) -> None:
    scoped = KindOptions(namespace=namespace, label_selector={"app": "mine"})
    cache = Cache(client, by_kind={CONFIGMAPS: scoped})
    rec = Recorder()
    cache.informer(CONFIGMAPS).add_handler(rec.add, rec.update, rec.delete)
    await client.create(CONFIGMAPS, cm("mine", app="mine", tier="a"), namespace)
    await client.create(CONFIGMAPS, cm("theirs", app="other"), namespace)
    await client.create(CONFIGMAPS, cm("elsewhere", app="mine"), other_namespace)

    async with running(cache):
        assert [name_of(o) for o in cache.list(CONFIGMAPS)] == ["mine"]
        assert cache.list(CONFIGMAPS, other_namespace) == []
        with pytest.raises(errors.NotFound):
            cache.get(CONFIGMAPS, "elsewhere", other_namespace)

        # An object that starts matching arrives as an add, one that stops as a delete; one
        # in another namespace (written first, so it would come first) never arrives.
        await client.create(CONFIGMAPS, cm("late-elsewhere", app="mine"), other_namespace)
        joins = {"metadata": {"labels": {"app": "mine"}}}
        await client.patch(CONFIGMAPS, "theirs", joins, namespace)
        await client.patch(CONFIGMAPS, "mine", {"metadata": {"labels": {"app": "gone"}}}, namespace)
        await eventually(lambda: rec.has("delete", "mine"), "mine leaving the selector")
        assert rec.has("add", "theirs")
        assert [name_of(o) for o in cache.list(CONFIGMAPS, namespace)] == ["theirs"]
        assert {n for _, n, _ in rec.events} == {"mine", "theirs"}
        # list's own label filter narrows further within the cache
        assert cache.list(CONFIGMAPS, label_selector={"tier": "a"}) == []


async def test_field_selector_and_indexed_list(client: Client, namespace: str) -> None:
    by_node = KindOptions(namespace=namespace, field_selector="spec.nodeName=node-a")
    cache = Cache(client, by_kind={PODS: by_node})
    cache.add_index(PODS, "group", field_indexer(f"metadata.annotations['{GROUP_ANNOTATION}']"))
    for name, node, group in [
        ("p1", "node-a", "g1"),
        ("p2", "node-a", "g2"),
        ("p3", "node-b", "g1"),
    ]:
        await client.create(PODS, pod(name, node, group), namespace)

    async with running(cache):
        assert sorted(name_of(o) for o in cache.list(PODS, namespace)) == ["p1", "p2"]
        assert [name_of(o) for o in cache.list(PODS, index="group", value="g1")] == ["p1"]
        assert [name_of(o) for o in cache.list(PODS, namespace, index="group", value="g2")] == [
            "p2"
        ]
        assert cache.list(PODS, "elsewhere", index="group", value="g2") == []
        with pytest.raises(errors.NotFound):
            cache.get(PODS, "p3", namespace)

        await client.create(PODS, pod("p5", "node-b", "g1"), namespace)  # never arrives
        await client.create(PODS, pod("p4", "node-a", "g1"), namespace)
        await eventually(
            lambda: len(cache.list(PODS, index="group", value="g1", copy=False)) == 2,
            "p4 in the group index",
        )
        assert sorted(name_of(o) for o in cache.list(PODS)) == ["p1", "p2", "p4"]
        # Reads are copies: changing one does not change the cache.
        got = cache.get(PODS, "p4", namespace)
        got["metadata"]["annotations"][GROUP_ANNOTATION] = "stolen"
        assert len(cache.list(PODS, index="group", value="g1")) == 2


async def test_reading_a_kind_not_yet_synced_is_not_synced_not_not_found(
    client: Client, namespace: str
) -> None:
    cache = Cache(client, by_kind={CONFIGMAPS: KindOptions(namespace=namespace)})
    with pytest.raises(CacheNotSynced, match="has not synced") as info:
        cache.get(CONFIGMAPS, "x", namespace)
    assert not isinstance(info.value, errors.NotFound)  # "deleted" would be a lie
    async with running(cache, sync_timeout=None):
        # The read above created the informer; running the cache starts and syncs it.
        await cache.wait_for_sync(30)
        assert cache.list(CONFIGMAPS) == []
        # An informer added while the cache runs is started too.
        inf = cache.informer(PODS)
        await inf.wait_for_sync(30)
        assert inf.has_synced


# --- wait_for_sync fails fast, and says why ------------------------------------------


async def test_wait_for_sync_fails_fast_when_forbidden(control_plane: ControlPlane) -> None:
    async with Client.from_kubeconfig(control_plane.user_kubeconfig("nobody")) as nobody:
        cache = Cache(nobody)
        cache.informer(PODS)
        async with running(cache, sync_timeout=None):
            with pytest.raises(CacheSyncError) as caught:
                await cache.wait_for_sync(120)
    err = caught.value
    assert not err.timed_out  # it did not wait for the timeout
    assert err.kind == PODS and isinstance(err.cause, errors.Forbidden)
    assert str(err).startswith('pods: forbidden: User "nobody" cannot list resource "pods"')


async def test_wait_for_sync_names_a_kind_whose_crd_is_missing(
    client: Client, namespace: str
) -> None:
    ghost = Kind("nothere.example.com", "v1", "Ghost", "ghosts", namespaced=False)
    cache = Cache(client, by_kind={CONFIGMAPS: KindOptions(namespace=namespace)})
    cache.informer(CONFIGMAPS)
    cache.informer(ghost)
    async with running(cache, sync_timeout=None):
        with pytest.raises(CacheSyncError) as caught:
            await cache.wait_for_sync(120)
    assert not caught.value.timed_out
    assert str(caught.value) == (
        "ghosts.nothere.example.com: the server could not find the resource: the API server "
        "serves no API group 'nothere.example.com': is its CustomResourceDefinition installed? "
        "(kubectl get crds; the envtest pytest plugin installs config/crd)"
    )


async def test_wait_for_sync_times_out_with_the_last_error(kubeconfig: str, tmp_path: Path) -> None:
    cfg = yaml.safe_load(await anyio.Path(kubeconfig).read_text())
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"  # nobody there
    dead = tmp_path / "dead.kubeconfig"
    await anyio.Path(dead).write_text(yaml.safe_dump(cfg))
    async with Client.from_kubeconfig(dead, retry=RetryPolicy(attempts=1)) as client:
        cache = Cache(client)
        cache.informer(NAMESPACES)
        async with running(cache, sync_timeout=None):
            with pytest.raises(CacheSyncError) as caught:
                await cache.wait_for_sync(2)
    assert caught.value.timed_out
    assert isinstance(caught.value.cause, errors.TransportError)
    assert str(caught.value).startswith("namespaces: not synced within 2s; last error: GET ")


# --- recovery ------------------------------------------------------------------------


async def test_watchdog_restarts_a_silent_watch_and_the_cache_converges(
    client: Client, namespace: str
) -> None:
    jumpy = ReflectorOptions(inactivity_timeout=0.3)
    cache = Cache(client, by_kind={CONFIGMAPS: KindOptions(namespace=namespace, reflector=jumpy)})
    stats = cache.informer(CONFIGMAPS).reflector.stats
    async with running(cache):
        await eventually(lambda: stats.inactivity_restarts >= 3, "three watchdog restarts")
        await client.create(CONFIGMAPS, cm("after-restarts"), namespace)
        await eventually(
            lambda: in_cache(cache, CONFIGMAPS, "after-restarts", namespace), "the new object"
        )
    assert stats.lists == 1  # restarts resumed the watch, no relist
    assert stats.watch_errors == 0 and stats.list_errors == 0


@pytest.fixture(scope="module")
def own_cp() -> Iterator[ControlPlane]:
    """A private control plane whose API server these tests stop and restart."""
    with ControlPlane() as cp:
        yield cp


@pytest.fixture
async def own_client(own_cp: ControlPlane) -> AsyncIterator[Client]:
    async with Client.from_kubeconfig(own_cp.kubeconfig_path) as c:
        yield c


@pytest.fixture
def own_namespace(own_cp: ControlPlane) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    assert own_cp.http.post(NAMESPACES.path(), json=body).status_code == 201
    return name


def stop_apiserver(cp: ControlPlane) -> list[str]:
    """Kill only kube-apiserver (etcd keeps running); returns its command line.

    Killed, not terminated: a graceful shutdown waits for open watches (ours) to end.
    """
    proc = cp._procs.pop("kube-apiserver")
    proc.kill()
    proc.wait(timeout=30)
    return [str(a) for a in proc.args]  # type: ignore[union-attr]


async def start_apiserver(cp: ControlPlane, argv: list[str]) -> None:
    """Start kube-apiserver again with the same flags (same port, same etcd).

    Spawned from the event loop's thread: the child dies with the thread that started it
    (PR_SET_PDEATHSIG), and worker threads come and go.
    """
    cp._spawn("kube-apiserver", argv[1:])
    await anyio.to_thread.run_sync(cp._wait_ready)


@contextlib.contextmanager
def second_apiserver(cp: ControlPlane, argv: list[str]) -> Iterator[httpx.Client]:
    """Another kube-apiserver on the same etcd, on another port; an admin HTTP client to it."""
    port = free_port()
    args = [f"--secure-port={port}" if a.startswith("--secure-port=") else a for a in argv]
    with open(cp.work_dir / "kube-apiserver-2.log", "wb") as logf:
        proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT)
    pki = cp.work_dir / "pki"  # the admin pair is there: cp.http wrote it
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    http = httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=ctx, timeout=10)
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                if http.get("/readyz").status_code == 200:
                    break
            assert proc.poll() is None, (cp.work_dir / "kube-apiserver-2.log").read_text()[-2000:]
            time.sleep(0.1)
        yield http
    finally:
        http.close()
        proc.terminate()
        proc.wait(timeout=30)


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


async def etcd_delete(cp: ControlPlane, key: str) -> None:
    async with httpx.AsyncClient(base_url=cp.etcd_url) as etcd:
        r = await etcd.post("/v3/kv/deleterange", json={"key": _b64(key)})
    assert r.json().get("deleted") == "1", r.text


async def etcd_compact(cp: ControlPlane) -> int:
    """Compact etcd up to its current revision: every older resourceVersion is gone."""
    async with httpx.AsyncClient(base_url=cp.etcd_url) as etcd:
        r = await etcd.post("/v3/kv/range", json={"key": _b64("/")})
        revision = int(r.json()["header"]["revision"])
        r = await etcd.post("/v3/kv/compaction", json={"revision": revision, "physical": True})
    assert r.status_code == 200, r.text
    return revision


async def test_recovers_from_an_apiserver_restart_and_delivers_a_missed_delete(
    own_cp: ControlPlane, own_client: Client, own_namespace: str
) -> None:
    ns = own_namespace
    cache = Cache(own_client, by_kind={CONFIGMAPS: KindOptions(namespace=ns, reflector=FAST)})
    rec = Recorder()
    inf = cache.informer(CONFIGMAPS)
    inf.add_handler(rec.add, rec.update, rec.delete)
    await own_client.create(CONFIGMAPS, cm("keep", {"k": "1"}), ns)
    await own_client.create(CONFIGMAPS, cm("doomed", {"d": "1"}), ns)
    async with running(cache):
        argv = await anyio.to_thread.run_sync(stop_apiserver, own_cp)
        # Deleted while the informer cannot hear about it.
        await etcd_delete(own_cp, f"/registry/configmaps/{ns}/doomed")
        await start_apiserver(own_cp, argv)
        await own_client.create(CONFIGMAPS, cm("after", {"a": "1"}), ns)

        await eventually(lambda: rec.has("delete", "doomed"), "the missed delete")
        await eventually(lambda: rec.has("add", "after"), "an add after the restart")
        assert rec.types("doomed") == ["add", "delete"]
        assert rec.of("doomed")[1][1]["data"] == {"d": "1"}  # the last known object
        assert rec.types("keep") == ["add"]
        assert sorted(name_of(o) for o in cache.list(CONFIGMAPS)) == ["after", "keep"]
    assert inf.reflector.stats.watch_errors >= 1  # the outage was seen, and survived


async def test_watch_gone_relists_and_reports_what_changed_meanwhile(
    own_cp: ControlPlane, own_client: Client, own_namespace: str
) -> None:
    ns = own_namespace
    cache = Cache(own_client, by_kind={CONFIGMAPS: KindOptions(namespace=ns, reflector=FAST)})
    rec = Recorder()
    inf = cache.informer(CONFIGMAPS)
    inf.add_handler(rec.add, rec.update, rec.delete)
    for name in ("deleted", "changed", "same"):
        await own_client.create(CONFIGMAPS, cm(name, {"v": "1"}), ns)
    async with running(cache):
        argv = await anyio.to_thread.run_sync(stop_apiserver, own_cp)

        def meanwhile() -> None:
            with second_apiserver(own_cp, argv) as other:
                base = CONFIGMAPS.path(ns)
                assert other.delete(f"{base}/deleted").status_code == 200
                patch = {"Content-Type": "application/merge-patch+json"}
                r = other.patch(f"{base}/changed", json={"data": {"v": "2"}}, headers=patch)
                assert r.status_code == 200, r.text
                assert other.post(base, json=cm("created")).status_code == 201

        await anyio.to_thread.run_sync(meanwhile)
        await etcd_compact(own_cp)  # the informer's resourceVersion is now history: 410
        await start_apiserver(own_cp, argv)

        await eventually(lambda: inf.reflector.stats.gone >= 1, "a 410 Gone")
        await eventually(lambda: rec.has("add", "created"), "the relist's add")
        assert inf.reflector.stats.lists == 2  # the first sync and the relist
        assert rec.types("deleted") == ["add", "delete"]
        assert rec.of("deleted")[1][1]["data"] == {"v": "1"}  # the last known object
        assert rec.types("changed") == ["add", "update"]
        old, new = rec.of("changed")[1][1]
        assert (old["data"], new["data"]) == ({"v": "1"}, {"v": "2"})
        assert rec.types("same") == ["add"]  # unchanged: no event
        assert cache.get(CONFIGMAPS, "changed", ns)["data"] == {"v": "2"}
