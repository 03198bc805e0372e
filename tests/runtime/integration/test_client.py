"""sdgruntime.client against the real local kube-apiserver."""

from __future__ import annotations

import base64
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

import anyio
import httpx
import pytest
import yaml

from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS, NAMESPACES, NODES, PODS, Kind
from sdgruntime.metrics import REST_CLIENT_REQUESTS

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def _cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}


@pytest.fixture
async def node(client: Client) -> AsyncIterator[dict[str, Any]]:
    """A fresh Node object (cluster-scoped, so it is deleted after the test)."""
    obj = await client.create(NODES, _node(f"n-{uuid.uuid4().hex[:8]}"))
    yield obj
    await client.delete(NODES, obj["metadata"]["name"])


async def test_configmap_crud(client: Client, namespace: str):
    created = await client.create(CONFIGMAPS, _cm("a", k="1"), namespace)
    assert created["metadata"]["namespace"] == namespace
    assert created["metadata"]["uid"]

    got = await client.get(CONFIGMAPS, "a", namespace)
    assert got["data"] == {"k": "1"}
    assert got["kind"] == "ConfigMap"

    got["data"]["k"] = "2"
    updated = await client.update(CONFIGMAPS, got)
    assert updated["data"] == {"k": "2"}
    assert updated["metadata"]["resourceVersion"] != got["metadata"]["resourceVersion"]

    await client.delete(CONFIGMAPS, "a", namespace)
    with pytest.raises(errors.NotFound):
        await client.get(CONFIGMAPS, "a", namespace)


async def test_namespace_is_taken_from_the_object(client: Client, namespace: str):
    obj = _cm("from-meta")
    obj["metadata"]["namespace"] = namespace
    created = await client.create(CONFIGMAPS, obj)
    assert created["metadata"]["namespace"] == namespace


async def test_dry_run_create_persists_nothing(client: Client, namespace: str):
    out = await client.create(CONFIGMAPS, _cm("dry"), namespace, dry_run=True)
    assert out["metadata"]["name"] == "dry"
    with pytest.raises(errors.NotFound):
        await client.get(CONFIGMAPS, "dry", namespace)


async def test_list_label_selector_and_pagination(client: Client, namespace: str):
    for i in range(5):
        await client.create(CONFIGMAPS, _cm(f"cm-{i}", {"app": "x"}), namespace)
    await client.create(CONFIGMAPS, _cm("other", {"app": "y"}), namespace)

    pages: list[list[str]] = []
    token: str | None = None
    while True:
        page = await client.list(
            CONFIGMAPS, namespace, label_selector="app=x", limit=2, continue_=token
        )
        pages.append([o["metadata"]["name"] for o in page["items"]])
        token = page["metadata"].get("continue")
        if not token:
            break
    assert [len(p) for p in pages] == [2, 2, 1]
    assert sorted(n for p in pages for n in p) == [f"cm-{i}" for i in range(5)]

    items, rv = await client.list_all(CONFIGMAPS, namespace, label_selector="app=x", page_size=2)
    assert sorted(o["metadata"]["name"] for o in items) == [f"cm-{i}" for i in range(5)]
    assert rv.isdigit()
    # list items carry apiVersion/kind like GET and watch objects
    assert {(o["apiVersion"], o["kind"]) for o in items} == {("v1", "ConfigMap")}

    # A transform sees each item as its page arrives, with apiVersion/kind filled in, and
    # the list holds what it returned (a cache keeps slim copies, never the whole list).
    seen: list[str] = []

    def slim(obj: dict) -> dict:
        seen.append(obj["kind"])
        return {"kind": obj["kind"], "metadata": {"name": obj["metadata"]["name"]}}

    items, _ = await client.list_all(
        CONFIGMAPS, namespace, label_selector="app=x", page_size=2, transform=slim
    )
    assert seen == ["ConfigMap"] * 5
    assert sorted(items, key=lambda o: o["metadata"]["name"]) == [
        {"kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}} for i in range(5)
    ]


async def test_list_field_selector(client: Client, namespace: str):
    for i in range(3):
        await client.create(CONFIGMAPS, _cm(f"cm-{i}"), namespace)
    page = await client.list(CONFIGMAPS, namespace, field_selector="metadata.name=cm-1")
    assert [o["metadata"]["name"] for o in page["items"]] == ["cm-1"]


async def test_list_all_namespaces(client: Client, namespace: str):
    await client.create(CONFIGMAPS, _cm("everywhere", {"probe": namespace}), namespace)
    items, _ = await client.list_all(CONFIGMAPS, label_selector=f"probe={namespace}")
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in items] == [
        (namespace, "everywhere")
    ]


async def test_watch_sees_added_modified_deleted(client: Client, namespace: str):
    _, rv = await client.list_all(CONFIGMAPS, namespace)
    seen: list[tuple[str, str]] = []

    async def consume(task_status: anyio.abc.TaskStatus[None]) -> None:
        watch = client.watch(CONFIGMAPS, namespace, resource_version=rv, timeout_seconds=60)
        async with aclosing(watch) as events:
            task_status.started()
            async for ev in events:
                if ev["type"] == "BOOKMARK":
                    continue
                seen.append((ev["type"], ev["object"]["metadata"]["name"]))
                if ev["type"] == "DELETED":
                    return

    with anyio.fail_after(60):  # a guard against hanging, not a timing assertion
        async with anyio.create_task_group() as tg:
            await tg.start(consume)
            obj = await client.create(CONFIGMAPS, _cm("w", k="1"), namespace)
            obj["data"]["k"] = "2"
            await client.update(CONFIGMAPS, obj)
            await client.delete(CONFIGMAPS, "w", namespace)
    assert seen == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]


async def test_watch_with_label_selector_filters(client: Client, namespace: str):
    _, rv = await client.list_all(CONFIGMAPS, namespace)
    await client.create(CONFIGMAPS, _cm("skip", {"w": "no"}), namespace)
    await client.create(CONFIGMAPS, _cm("take", {"w": "yes"}), namespace)
    with anyio.fail_after(60):
        watch = client.watch(CONFIGMAPS, namespace, resource_version=rv, label_selector="w=yes")
        async with aclosing(watch) as events:
            async for ev in events:
                if ev["type"] != "BOOKMARK":
                    break
    assert (ev["type"], ev["object"]["metadata"]["name"]) == ("ADDED", "take")


async def test_typed_errors(client: Client, namespace: str):
    with pytest.raises(errors.NotFound) as nf:
        await client.get(CONFIGMAPS, "missing", namespace)
    assert nf.value.code == 404 and "missing" in nf.value.message

    first = await client.create(CONFIGMAPS, _cm("dup", k="1"), namespace)
    with pytest.raises(errors.AlreadyExists):
        await client.create(CONFIGMAPS, _cm("dup"), namespace)

    fresh = await client.get(CONFIGMAPS, "dup", namespace)
    fresh["data"]["k"] = "2"
    await client.update(CONFIGMAPS, fresh)
    first["data"]["k"] = "stale"
    with pytest.raises(errors.Conflict) as conflict:
        await client.update(CONFIGMAPS, first)  # first's resourceVersion is stale
    assert not isinstance(conflict.value, errors.AlreadyExists)

    with pytest.raises(errors.Invalid) as invalid:
        await client.create(CONFIGMAPS, _cm("Not_A_Valid_Name"), namespace)
    assert invalid.value.code == 422
    assert "Not_A_Valid_Name" in invalid.value.message
    assert "RFC 1123" in invalid.value.message


async def test_delete_preconditions(client: Client, namespace: str):
    obj = await client.create(CONFIGMAPS, _cm("pre"), namespace)
    with pytest.raises(errors.Conflict):
        await client.delete(CONFIGMAPS, "pre", namespace, uid=str(uuid.uuid4()))
    await client.delete(
        CONFIGMAPS,
        "pre",
        namespace,
        uid=obj["metadata"]["uid"],
        resource_version=obj["metadata"]["resourceVersion"],
        propagation_policy="Background",
        grace_period_seconds=0,
    )
    with pytest.raises(errors.NotFound):
        await client.delete(CONFIGMAPS, "pre", namespace)


async def test_merge_json_and_strategic_patch(client: Client, namespace: str):
    await client.create(CONFIGMAPS, _cm("p", a="1", b="2"), namespace)

    out = await client.patch(CONFIGMAPS, "p", {"data": {"a": "10", "b": None}}, namespace)
    assert out["data"] == {"a": "10"}

    ops = [
        {"op": "test", "path": "/data/a", "value": "10"},
        {"op": "add", "path": "/data/c", "value": "3"},
    ]
    out = await client.patch(CONFIGMAPS, "p", ops, namespace, patch_type="json")
    assert out["data"] == {"a": "10", "c": "3"}
    with pytest.raises(errors.Invalid):  # a failed JSON-patch test op is reported as invalid
        await client.patch(
            CONFIGMAPS,
            "p",
            [{"op": "test", "path": "/data/a", "value": "nope"}],
            namespace,
            patch_type="json",
        )

    out = await client.patch(
        CONFIGMAPS, "p", {"metadata": {"labels": {"l": "v"}}}, namespace, patch_type="strategic"
    )
    assert out["metadata"]["labels"] == {"l": "v"}


async def test_a_metadata_only_patch_answers_with_the_new_metadata_alone(
    client: Client, namespace: str, node: dict[str, Any]
):
    await client.create(CONFIGMAPS, _cm("m", a="1"), namespace)
    out = await client.patch(CONFIGMAPS, "m", {"data": {"a": "2"}}, namespace, metadata_only=True)
    assert out["kind"] == "PartialObjectMetadata" and "data" not in out
    live = await client.get(CONFIGMAPS, "m", namespace)
    assert live["data"] == {"a": "2"}
    assert out["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]

    # a status subresource too (what the status controller writes)
    patch = {"status": {"capacity": {"example.com/dev": "3"}}}
    out = await client.patch(
        NODES, node["metadata"]["name"], patch, subresource="status", metadata_only=True
    )
    assert out["kind"] == "PartialObjectMetadata" and "status" not in out
    live = await client.get(NODES, node["metadata"]["name"])
    assert live["status"]["capacity"]["example.com/dev"] == "3"
    assert out["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]
    # the next plain request is answered in full again (the Accept is per call)
    full = await client.patch(CONFIGMAPS, "m", {"data": {"a": "3"}}, namespace)
    assert full["kind"] == "ConfigMap" and full["data"] == {"a": "3"}


async def test_server_side_apply_owns_fields_and_force_takes_them(client: Client, namespace: str):
    # apply creates the object if missing; apiVersion/kind are filled in from the Kind
    out = await client.patch(
        CONFIGMAPS,
        "ssa",
        {"metadata": {"name": "ssa"}, "data": {"owner": "a"}},
        namespace,
        patch_type="apply",
        field_manager="manager-a",
    )
    assert out["data"] == {"owner": "a"}
    managers = {m["manager"] for m in out["metadata"]["managedFields"]}
    assert "manager-a" in managers

    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ssa"},
        "data": {"owner": "b"},
    }
    with pytest.raises(errors.Conflict) as conflict:
        await client.patch(
            CONFIGMAPS, "ssa", body, namespace, patch_type="apply", field_manager="manager-b"
        )
    assert "manager-a" in conflict.value.message
    out = await client.patch(
        CONFIGMAPS,
        "ssa",
        body,
        namespace,
        patch_type="apply",
        field_manager="manager-b",
        force=True,
    )
    assert out["data"] == {"owner": "b"}


async def test_status_subresource(client: Client, node: dict[str, Any]):
    name = node["metadata"]["name"]
    node["status"] = {"allocatable": {"nvidia.com/gpu": "4"}, "capacity": {"nvidia.com/gpu": "4"}}
    node["spec"]["unschedulable"] = True
    out = await client.update_status(NODES, node)
    assert out["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert not out["spec"].get("unschedulable")  # the status endpoint ignores spec

    out["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    out["spec"]["unschedulable"] = True
    out = await client.update(NODES, out)
    assert out["spec"]["unschedulable"] is True
    # ... and the main resource ignores status
    assert (await client.get(NODES, name))["status"]["allocatable"]["nvidia.com/gpu"] == "4"

    out = await client.patch(
        NODES, name, {"status": {"capacity": {"nvidia.com/gpu": "8"}}}, subresource="status"
    )
    assert out["status"]["capacity"]["nvidia.com/gpu"] == "8"


async def test_bind_pod_to_node(client: Client, namespace: str, node: dict[str, Any]):
    node_name = node["metadata"]["name"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "schedulerName": "some-scheduler",
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }
    created = await client.create(PODS, pod, namespace)
    assert not created["spec"].get("nodeName")

    with pytest.raises(errors.Conflict):  # uid precondition: a different pod of that name
        await client.bind(namespace, "p", node_name, pod_uid=str(uuid.uuid4()))
    await client.bind(namespace, "p", node_name, pod_uid=created["metadata"]["uid"])
    got = await client.get(PODS, "p", namespace)
    assert got["spec"]["nodeName"] == node_name
    with pytest.raises(errors.Conflict):  # already bound
        await client.bind(namespace, "p", node_name)


async def test_request_for_non_resource_paths(client: Client):
    version = await client.request("GET", "/version")
    assert version["major"] == "1"
    assert await client.request("GET", "/readyz") == "ok"


def _count(client: Client, code: str, method: str) -> float:
    return REST_CLIENT_REQUESTS.labels(code=code, method=method, host=client.host)._value.get()


async def test_requests_are_counted_by_code_method_and_host(client: Client, namespace: str):
    assert client.host.startswith("127.0.0.1:")
    before = {k: _count(client, *k) for k in [("201", "POST"), ("200", "GET"), ("404", "GET")]}
    await client.create(CONFIGMAPS, _cm("m"), namespace)
    await client.get(CONFIGMAPS, "m", namespace)
    await client.get(CONFIGMAPS, "m", namespace)
    with pytest.raises(errors.NotFound):
        await client.get(CONFIGMAPS, "nope", namespace)
    after = {k: _count(client, *k) for k in before}
    assert after[("201", "POST")] - before[("201", "POST")] == 1
    assert after[("200", "GET")] - before[("200", "GET")] == 2
    assert after[("404", "GET")] - before[("404", "GET")] == 1


async def test_user_without_rights_gets_forbidden(control_plane: Any, namespace: str):
    path = control_plane.user_kubeconfig("nobody")
    async with Client.from_kubeconfig(path) as c:
        with pytest.raises(errors.Forbidden) as forbidden:
            await c.get(CONFIGMAPS, "x", namespace)
    assert "nobody" in forbidden.value.message


# --- 410 Gone: needs an API server without the watch cache, so old versions go to etcd ----


@pytest.fixture(scope="module")
def uncached_plane() -> Iterator[ControlPlane]:
    """A second control plane with ``--watch-cache=false``.

    With the watch cache, 1.3x API servers serve old watch versions and continue tokens from
    memory even after an etcd compaction, so a real 410 needs requests that reach etcd.
    """
    with ControlPlane(extra_apiserver_flags=["--watch-cache=false"]) as cp:
        yield cp


async def _compact_etcd(cp: ControlPlane) -> None:
    """Compact etcd's history at its current revision (what the API server does every 5m)."""
    async with httpx.AsyncClient(base_url=cp.etcd_url) as etcd:
        key = base64.b64encode(b"/").decode()
        head = (await etcd.post("/v3/kv/range", json={"key": key})).json()["header"]
        r = await etcd.post(
            "/v3/kv/compaction", json={"revision": head["revision"], "physical": True}
        )
        r.raise_for_status()


@pytest.fixture
async def uncached(uncached_plane: ControlPlane) -> AsyncIterator[tuple[Client, str]]:
    ns = f"t-{uuid.uuid4().hex[:10]}"
    async with Client.from_kubeconfig(uncached_plane.kubeconfig_path) as c:
        await c.create(NAMESPACES, {"metadata": {"name": ns}})
        for i in range(5):
            await c.create(CONFIGMAPS, _cm(f"cm-{i}"), ns)
        yield c, ns


async def test_watch_from_a_compacted_version_raises_gone(
    uncached: tuple[Client, str], uncached_plane: ControlPlane
):
    client, ns = uncached
    _, rv = await client.list_all(CONFIGMAPS, ns)
    # a watch from rv starts at rv+1: compact past that
    await client.create(CONFIGMAPS, _cm("after-1"), ns)
    await client.create(CONFIGMAPS, _cm("after-2"), ns)
    await _compact_etcd(uncached_plane)
    with anyio.fail_after(60), pytest.raises(errors.Gone) as gone:
        async with aclosing(client.watch(CONFIGMAPS, ns, resource_version=rv)) as events:
            async for _ in events:
                pass
    assert gone.value.code == 410


async def test_expired_continue_token_raises_gone_and_list_all_restarts(
    uncached: tuple[Client, str], uncached_plane: ControlPlane
):
    client, ns = uncached
    first = await client.list(CONFIGMAPS, ns, limit=2)
    await client.create(CONFIGMAPS, _cm("after"), ns)
    await _compact_etcd(uncached_plane)
    with pytest.raises(errors.Gone):
        await client.list(CONFIGMAPS, ns, limit=2, continue_=first["metadata"]["continue"])

    class CompactsAfterFirstPage(Client):
        """Compacts etcd between the first and second page of a list, once."""

        pages: list[str | None] = []

        async def list(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            token = kwargs.get("continue_")
            self.pages.append(token)
            if token and self.pages.count(None) == 1:
                await self.create(CONFIGMAPS, _cm(f"mid-{len(self.pages)}"), ns)
                await _compact_etcd(uncached_plane)
            return await super().list(*args, **kwargs)

    async with CompactsAfterFirstPage.from_kubeconfig(uncached_plane.kubeconfig_path) as c:
        items, rv = await c.list_all(CONFIGMAPS, ns, page_size=2)
    names = sorted(o["metadata"]["name"] for o in items)
    assert names == sorted([*(f"cm-{i}" for i in range(5)), "after", "mid-2"])
    assert rv.isdigit()
    # first page, expired second page, then a complete list from scratch (4 pages of 7)
    assert [t is None for t in CompactsAfterFirstPage.pages] == [
        True,
        False,
        True,
        False,
        False,
        False,
    ]


async def test_an_exec_plugin_user_is_who_the_api_server_sees(
    control_plane: ControlPlane, tmp_path: Any
) -> None:
    """A kubeconfig whose user is an exec plugin (here handing out a client certificate,
    as cloud plugins do) authenticates as that plugin's identity, with no kubernetes
    package: the API server's SelfSubjectReview names the user."""
    made = yaml.safe_load(control_plane.user_kubeconfig("exec-user", ["exec-group"]).read_text())
    creds = made["users"][0]["user"]
    status = {
        "clientCertificateData": base64.b64decode(creds["client-certificate-data"]).decode(),
        "clientKeyData": base64.b64decode(creds["client-key-data"]).decode(),
    }
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json\nprint(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
        f"'kind': 'ExecCredential', 'status': {status!r}}}))\n"
    )
    made["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin)],
            "interactiveMode": "Never",
        }
    }
    path = tmp_path / "exec.kubeconfig"
    path.write_text(yaml.safe_dump(made))
    async with Client.from_kubeconfig(path) as client:
        info = await whoami(client)
    assert info["username"] == "exec-user" and "exec-group" in info["groups"]


async def whoami(client: Client) -> dict[str, Any]:
    """Who the API server takes ``client`` for (a SelfSubjectReview's userInfo)."""
    review_kind = Kind(
        "authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews", namespaced=False
    )
    review = await client.create(
        review_kind, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return dict(review["status"]["userInfo"])


async def test_service_account_kubeconfig_authenticates_as_the_service_account(
    control_plane: ControlPlane, namespace: str
) -> None:
    """``service_account_kubeconfig`` holds a TokenRequest token: the client is the
    ServiceAccount (as a pod would be), with no rights until a binding names it."""
    path = control_plane.service_account_kubeconfig(namespace, "tokened", 600)
    assert "token" in yaml.safe_load(path.read_text())["users"][0]["user"]
    async with Client.from_kubeconfig(path) as client:
        info = await whoami(client)
        assert info["username"] == f"system:serviceaccount:{namespace}:tokened"
        assert f"system:serviceaccounts:{namespace}" in info["groups"]
        with pytest.raises(errors.Forbidden):
            await client.get(CONFIGMAPS, "x", namespace)
        control_plane.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "read-configmaps", "namespace": namespace},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
            }
        )
        control_plane.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "tokened-reads", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "read-configmaps",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "tokened", "namespace": namespace}],
            }
        )
        with anyio.fail_after(30):
            while True:  # the authorizer's RBAC cache takes the binding in shortly
                try:
                    await client.get(CONFIGMAPS, "x", namespace)
                except errors.Forbidden:
                    await anyio.sleep(0.2)
                except errors.NotFound:
                    break
