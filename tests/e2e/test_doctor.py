"""``sdg doctor`` on the real local control plane: a healthy installation passes, and a
broken one fails naming exactly what was broken.

SDG runs in-process (``run_sdg``) with leader election, its webhooks registered as a
loopback URL and config/policy installed, so there is no manager Deployment: doctor's
``manager`` check then passes on the live leader Lease alone (shown in its detail).
cert-manager does not run here; its CRD may be installed by another test of the session
(tests/integration/test_kustomize_apply.py), so the cert-manager check is a warning (no
CRD) or passes (CRD, no Certificate, webhook answers): never a failure while the webhook
answers. doctor runs through the CLI's ``main`` in a worker thread (it starts its own
event loop) with the admin kubeconfig.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from cli import main as cli
from controllers.inventory import RESOURCESLICES
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port, load_manifests
from sdgruntime.kinds import NODES, PODS, RUNTIMECLASSES
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    ROOT,
    add_node,
    eventually,
    group,
    pod,
    remove_webhooks,
    run_sdg,
    wait_bound,
    wait_rbac,
)
from tests.integration import thirdparty

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TAINT = {"key": "deviceshare.io/mode", "value": "shared", "effect": "NoSchedule"}
DOCTOR_ROLES = ROOT / "config" / "rbac" / "doctor_role.yaml"


async def doctor(
    capsys: pytest.CaptureFixture[str], kubeconfig: str, *args: str
) -> tuple[int, str, str]:
    argv = ["--kubeconfig", kubeconfig, "doctor", *args]
    code = await anyio.to_thread.run_sync(cli.main, argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def marks(text: str) -> dict[str, str]:
    """Check name -> its mark, from the text table (names end two spaces before the
    detail; fix lines are indented)."""
    out = {}
    for line in text.splitlines():
        if line[:1] in ("✓", "✗", "!"):
            out[line[2:].split("  ", 1)[0].strip()] = line[0]
    return out


def line_of(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line[2:].startswith(name + " "))


@contextlib.asynccontextmanager
async def resource_slice(client: Client, node: str, uuids: list[str]) -> AsyncIterator[None]:
    """A DRA driver's ResourceSlice for ``node`` (deleted afterwards: nothing here
    garbage-collects slices of deleted nodes)."""
    name = f"{node}-gpu.nvidia.com"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"index": {"int": i}, "uuid": {"string": u}},
                }
                for i, u in enumerate(uuids)
            ],
        },
    }
    await client.create(RESOURCESLICES, body)
    try:
        yield
    finally:
        with contextlib.suppress(errors.NotFound):
            await client.delete(RESOURCESLICES, name)


@contextlib.asynccontextmanager
async def runtime_class(client: Client, name: str) -> AsyncIterator[None]:
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": "nvidia",
    }
    await client.create(RUNTIMECLASSES, body)
    try:
        yield
    finally:
        with contextlib.suppress(errors.NotFound):
            await client.delete(RUNTIMECLASSES, name)


def foreign_pod(name: str, node: str) -> dict[str, Any]:
    """A pod outside any group, placed on ``node`` directly, that sees every GPU."""
    p = pod(name, None, nodeName=node)
    p["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return p


def binding(kind: str, user: str, role: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": user, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


@contextlib.contextmanager
def doctor_user(
    cluster: ControlPlane, probe_namespace: str, *, pods: bool = False
) -> Iterator[tuple[str, str]]:
    """(name, kubeconfig) of a user with only config/rbac's doctor roles, bound as their
    comment says: deviceshare-doctor cluster-wide, the probe role in ``probe_namespace``,
    the records role in the manager's namespace; with ``pods``, the optional
    deviceshare-doctor-pods cluster-wide too."""
    user = f"doctor-{uuid.uuid4().hex[:8]}"
    objs = [
        binding("ClusterRoleBinding", user, "deviceshare-doctor"),
        binding("RoleBinding", user, "deviceshare-doctor-probe", probe_namespace),
        binding("RoleBinding", user, "deviceshare-doctor-records", MANAGER_NS),
    ]
    if pods:
        objs.append(binding("ClusterRoleBinding", f"{user}-pods", "deviceshare-doctor-pods"))
        objs[-1]["subjects"][0]["name"] = user
    for obj in objs:
        cluster.apply(obj)
    try:
        yield user, str(cluster.user_kubeconfig(user))
    finally:
        cluster.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", user)
        if pods:
            cluster.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", f"{user}-pods")
        cluster.delete("rbac.authorization.k8s.io/v1", "RoleBinding", user, probe_namespace)
        cluster.delete("rbac.authorization.k8s.io/v1", "RoleBinding", user, MANAGER_NS)


@pytest.fixture(params=["admin", "the doctor roles", "the doctor roles and pods"])
def doctor_kubeconfig(
    request: pytest.FixtureRequest, cluster: ControlPlane, kubeconfig: str
) -> Iterator[tuple[str, str]]:
    """(which, kubeconfig): the admin's, or a user's with only config/rbac's doctor roles
    (their pod reads: the manager's namespace only, or every pod with the optional role)."""
    if request.param == "admin":
        yield request.param, kubeconfig
        return
    pods = request.param.endswith("pods")
    with doctor_user(cluster, "default", pods=pods) as (_, user_kubeconfig):
        yield request.param, user_kubeconfig


async def test_healthy_cluster_passes(
    cluster: ControlPlane,
    client: Client,
    doctor_kubeconfig: tuple[str, str],
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every ✗-able check passes: exit 0. gpu-2's IDs come from a count, a warning that
    does not fail the run; a group's pod on gpu-1 (it carries NVIDIA_VISIBLE_DEVICES) is not
    a foreign device pod; delivery runtimeclass (doctor's flag) finds its RuntimeClass. The
    same for a user who has only config/rbac's doctor roles with the optional pods role:
    nothing it reads is refused. Without it, doctor reads no pod outside the manager's
    namespace: gpu-1's check rests on its group's Ready condition, gpu-2 (no group) is
    left undecided, a warning."""
    reader, doctor_kubeconfig_path = doctor_kubeconfig
    narrow = reader == "the doctor roles"
    rc = f"doctor-rc-{uuid.uuid4().hex[:6]}"
    await add_node(client, "doc-gpu-1", 2, taints=[TAINT])
    await add_node(client, "doc-gpu-2", 1, taints=[TAINT])
    async with (
        resource_slice(client, "doc-gpu-1", ["GPU-aaa", "GPU-bbb"]),
        runtime_class(client, rc),
        run_sdg(cluster, leader_elect=True) as sdg,
    ):
        with anyio.fail_after(30):
            await sdg.manager.wait_for_leadership()
        await client.create(SDG_KIND, group("doc-g", {GPU: 2}))
        g = await wait_bound(client, "doc-g")
        assert g["status"]["nodeName"] == "doc-gpu-1"
        await client.create(PODS, pod("member", "doc-g"), namespace)
        await eventually(
            lambda: client.get(PODS, "member", namespace),
            what="member pod",
        )

        async def bound() -> bool:
            p = await client.get(PODS, "member", namespace)
            return p["spec"].get("nodeName") == "doc-gpu-1"

        await eventually(bound, what="member bound to doc-gpu-1")

        code, out, err = await doctor(
            capsys,
            doctor_kubeconfig_path,
            "--delivery",
            "runtimeclass",
            "--runtime-class-name",
            rc,
        )
    print(out)
    assert (code, err) == (0, ""), out
    got = marks(out)
    assert got.pop("cert-manager") in ("!", "✓")
    assert got == {
        "CRD": "✓",
        "webhook configurations": "✓",
        "pod webhook": "✓",
        "admission policies": "✓",
        "manager": "✓",
        "leader Lease": "✓",
        "shared nodes": "✓",
        "ResourceSlices": "✓",
        "node doc-gpu-1: taint": "✓",
        "node doc-gpu-1: devices": "✓",
        "node doc-gpu-1: foreign device pods": "✓",
        "node doc-gpu-1: delivery": "✓",
        "node doc-gpu-2: taint": "✓",
        "node doc-gpu-2: devices": "!",
        "node doc-gpu-2: foreign device pods": "!" if narrow else "✓",
        "node doc-gpu-2: delivery": "✓",
        "RuntimeClass": "✓",
        "holder pods": "✓",
        "claim records": "✓",
    }
    if narrow:
        assert "none reported by the manager for group(s) doc-g bound here" in line_of(
            out, "node doc-gpu-1: foreign device pods"
        )
        assert "not checked: no group is bound here" in line_of(
            out, "node doc-gpu-2: foreign device pods"
        )
        assert "(pods of the manager's namespace only)" in line_of(out, "claim records")
    else:
        assert "forbidden" not in out.lower()
    assert "(1 group(s))" in line_of(out, "CRD")
    assert "denied by SDG" in line_of(out, "pod webhook")
    assert "a manager runs elsewhere (it holds the leader Lease)" in line_of(out, "manager")
    assert "nvidia.com/gpu: 2 from ResourceSlice (0-1)" in line_of(out, "node doc-gpu-1: devices")
    assert "nvidia.com/gpu: 1 from count (0), IDs are guessed from a count" in line_of(
        out, "node doc-gpu-2: devices"
    )
    assert f"RuntimeClass {rc} (handler nvidia) exists" in line_of(out, "RuntimeClass")
    assert "runtimeclass (the manager's --delivery runtimeclass)" in line_of(
        out, "node doc-gpu-1: delivery"
    )
    warnings = 1 + narrow + (marks(out)["cert-manager"] == "!")
    assert out.endswith(f"0 problem(s), {warnings} warning(s) in 20 checks\n")
    # the probe was a dry run: no pod of it exists
    pods, _ = await client.list_all(PODS, "default")
    assert not [p for p in pods if p["metadata"]["name"].startswith("sdg-doctor-probe-")]


async def test_broken_cluster_names_exactly_what_is_wrong(
    cluster: ControlPlane,
    client: Client,
    kubeconfig: str,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Webhooks unregistered, doc-gpu-2 untainted (optional with holder pods, the default:
    said, not failed), a pod outside any group with NVIDIA_VISIBLE_DEVICES=all on
    doc-gpu-1: exit 1, those problems and no other, each with its fix; ``-o json`` says the
    same."""
    await add_node(client, "doc-gpu-1", 2, taints=[TAINT])
    await add_node(client, "doc-gpu-2", 2)
    async with (
        resource_slice(client, "doc-gpu-1", ["GPU-aaa", "GPU-bbb"]),
        resource_slice(client, "doc-gpu-2", ["GPU-ccc", "GPU-ddd"]),
        run_sdg(cluster, leader_elect=True) as sdg,
    ):
        with anyio.fail_after(30):
            await sdg.manager.wait_for_leadership()
        remove_webhooks(cluster)
        await client.create(PODS, foreign_pod("thief", "doc-gpu-1"), namespace)
        code, out, err = await doctor(capsys, kubeconfig, "-n", namespace)
        jcode, jout, _ = await doctor(capsys, kubeconfig, "-n", namespace, "-o", "json")
    print(out)
    assert (code, err) == (1, ""), out
    failed = {name for name, mark in marks(out).items() if mark == "✗"}
    assert failed == {
        "webhook configurations",
        "pod webhook",
        "node doc-gpu-1: foreign device pods",
    }
    lines = out.splitlines()

    def fix_of(name: str) -> list[str]:
        i = lines.index(line_of(out, name))
        fixes = []
        for line in lines[i + 1 :]:
            if not line.startswith("    "):
                break
            fixes.append(line.strip().removeprefix("fix: ").strip())
        return fixes

    assert "not registered: MutatingWebhookConfiguration deviceshare-mutating-webhook-" in (
        line_of(out, "webhook configurations")
    )
    assert fix_of("webhook configurations") == ["kubectl apply -k config/default"]
    assert "was admitted" in line_of(out, "pod webhook")
    assert fix_of("pod webhook") == ["kubectl apply -k config/default"]
    assert "not tainted (optional with holder pods" in line_of(out, "node doc-gpu-2: taint")
    assert marks(out)["node doc-gpu-2: taint"] == "✓"
    assert f"1 pod(s) outside any group use devices here: {namespace}/thief (sets " in (
        line_of(out, "node doc-gpu-1: foreign device pods")
    )
    assert fix_of("node doc-gpu-1: foreign device pods") == [
        f"kubectl delete pod -n {namespace} thief   (or run them on a node that is not shared)"
    ]
    assert marks(out)["cert-manager"] == "!"  # no CRD, or no Certificate: not the cause here
    # Nothing says how either node's runtime takes devices (delivery auto): warned.
    assert marks(out)["node doc-gpu-1: delivery"] == "!"
    assert marks(out)["node doc-gpu-2: delivery"] == "!"
    assert out.endswith("3 problem(s), 3 warning(s) in 20 checks\n")

    assert jcode == 1
    by_name = {c["name"]: c for c in json.loads(jout)}
    assert {n for n, c in by_name.items() if c["status"] == "fail"} == failed
    assert by_name["cert-manager"]["status"] == "warning"
    assert by_name["node doc-gpu-2: taint"]["status"] == "ok"


async def test_manager_down_webhook_unreachable(
    cluster: ControlPlane,
    client: Client,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Webhooks registered but nothing serves them, no manager, no node: the API server's
    own "failed calling webhook" error is quoted, and without cert-manager that is a
    failure too (it would issue the serving certificate)."""
    cluster.install_webhooks([ROOT / "config" / "webhook"], free_port())
    code, out, _ = await doctor(capsys, kubeconfig)
    print(out)
    assert code == 1
    assert {n for n, m in marks(out).items() if m == "✗"} == {
        "cert-manager",
        "pod webhook",
        "manager",
        "leader Lease",
        "shared nodes",
    }
    assert "registered, but the API server cannot call it: " in line_of(out, "pod webhook")
    assert 'failed calling webhook "mpod.deviceshare.io"' in line_of(out, "pod webhook")
    assert "connection refused" in line_of(out, "pod webhook")
    assert "no live leader Lease: no manager runs" in line_of(out, "manager")


async def test_runtime_class_needed_by_a_node_label(
    cluster: ControlPlane,
    client: Client,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A shared node labelled deviceshare.io/delivery=runtimeclass needs the RuntimeClass
    even when the manager delivers by env: ✗ while it is missing, ✓ once it exists."""
    rc = f"doctor-rc-{uuid.uuid4().hex[:6]}"
    await add_node(
        client, "doc-rc", 1, taints=[TAINT], labels={"deviceshare.io/delivery": "runtimeclass"}
    )

    async def verdict() -> dict[str, Any]:
        _, out, _ = await doctor(capsys, kubeconfig, "--runtime-class-name", rc, "-o", "json")
        return next(c for c in json.loads(out) if c["name"] == "RuntimeClass")

    missing = await verdict()
    assert missing["status"] == "fail"
    assert missing["detail"].startswith(f"RuntimeClass {rc} does not exist, but node(s) doc-rc")
    assert f'"metadata":{{"name":"{rc}"}}' in missing["fix"]
    async with runtime_class(client, rc):
        present = await verdict()
    assert present["status"] == "ok", present
    await client.delete(NODES, "doc-rc")


def _doctor_rules() -> list[tuple[str, int]]:
    return [
        (role["metadata"]["name"], i)
        for role in load_manifests([DOCTOR_ROLES])
        for i in range(len(role["rules"]))
    ]


@pytest.mark.parametrize("dropped", _doctor_rules(), ids=lambda d: f"{d[0]}[{d[1]}]")
async def test_every_doctor_rule_is_needed(
    cluster: ControlPlane,
    client: Client,
    capsys: pytest.CaptureFixture[str],
    dropped: tuple[str, int],
) -> None:
    """Without any one rule of the doctor roles, doctor reports a read it was refused
    (403) instead of a verdict: no rule is there for nothing. cert-manager's CRDs, a
    shared node and --delivery runtimeclass make doctor read everything it can."""
    roles = {r["metadata"]["name"]: r for r in load_manifests([DOCTOR_ROLES])}
    role, index = dropped
    rule = roles[role]["rules"][index]
    thirdparty.install(cluster, thirdparty.CERT_MANAGER)
    await add_node(client, "doc-gpu-1", 1, taints=[TAINT])
    # The optional pods role only when it is the one tested: with it, the records role's
    # pod read (the manager's namespace) is never needed.
    every_pod = role == "deviceshare-doctor-pods"
    with doctor_user(cluster, "default", pods=every_pod) as (user, kubeconfig):
        check = {
            "user": user,
            "resourceAttributes": {
                "group": rule["apiGroups"][0],
                "resource": rule["resources"][0],
                "verb": rule["verbs"][0],
                "name": (rule.get("resourceNames") or [""])[0],
                "namespace": "default" if role.endswith(("-probe", "-pods")) else MANAGER_NS,
            },
        }
        wait_rbac(cluster, check, True)
        cluster.apply(
            {**roles[role], "rules": [r for i, r in enumerate(roles[role]["rules"]) if i != index]}
        )
        try:
            wait_rbac(cluster, check, False)
            _, out, _ = await doctor(
                capsys, kubeconfig, "--delivery", "runtimeclass", "--runtime-class-name", "nv"
            )
        finally:
            cluster.apply(roles[role])
            wait_rbac(cluster, check, True)
    assert "forbidden" in out.lower(), (rule, out)  # a 403 shown, never a verdict on it
