"""``sdg doctor --pre`` and ``--probe``'s bounds on the real local control plane.

--pre reads only what the API server has before SDG is installed: its version, nodes
(their runtime and ``status.runtimeHandlers``, as a kubelet reports them), ResourceSlices
and the RuntimeClass; it runs here as admin and as a user with only the
``deviceshare-doctor`` ClusterRole. The probe's waits are shown bounded and its cleanup
total on nodes no kubelet runs (its pod never starts): on timeout, and on Ctrl-C of a
real ``sdg`` process. What a container really sees is in tests/realnode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from cli import main as cli
from cli.doctor.probe import PROBE_GROUP_PREFIX
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import NODES, PODS
from tests.e2e.harness import ROOT, add_node, eventually, run_sdg
from tests.e2e.test_doctor import binding, resource_slice, runtime_class

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TAINT = {"key": "deviceshare.io/mode", "value": "shared", "effect": "NoSchedule"}


async def doctor(
    capsys: pytest.CaptureFixture[str], kubeconfig: str, *args: str
) -> tuple[int, list[dict[str, Any]], str]:
    argv = ["--kubeconfig", kubeconfig, "doctor", *args, "-o", "json"]
    code = await anyio.to_thread.run_sync(cli.main, argv)
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out else [], out.err


async def kubelet_status(client: Client, name: str, runtime: str, handlers: list[str]) -> None:
    """What a kubelet reports of its runtime (nodeInfo, runtimeHandlers)."""
    status = {
        "nodeInfo": {
            "kubeletVersion": "v1.37.2",
            "containerRuntimeVersion": runtime,
            **{
                k: ""
                for k in (
                    "machineID",
                    "systemUUID",
                    "bootID",
                    "kernelVersion",
                    "osImage",
                    "kubeProxyVersion",
                    "operatingSystem",
                    "architecture",
                )
            },
        },
        "runtimeHandlers": [{"name": h, "features": {}} for h in handlers],
    }
    await client.patch(NODES, name, {"status": status}, subresource="status")


@pytest.fixture
def reader(cluster: ControlPlane, kubeconfig: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A kubeconfig of the admin, or of a user bound only to deviceshare-doctor."""
    if request.param == "admin":
        yield kubeconfig
        return
    user = f"pre-{uuid.uuid4().hex[:8]}"
    cluster.apply(binding("ClusterRoleBinding", user, "deviceshare-doctor"))
    try:
        yield str(cluster.user_kubeconfig(user))
    finally:
        cluster.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", user)


@pytest.mark.parametrize("reader", ["admin", "deviceshare-doctor only"], indirect=True)
async def test_pre_reads_what_the_cluster_offers(
    cluster: ControlPlane,
    client: Client,
    reader: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before install: the server's real version; pre-a (containerd 2, handler nvidia, a
    DRA driver's slice) gets runtimeclass; pre-b (containerd 1.7, no handlers, labelled
    cdi) gets cdi by its label, with "CDI/NRI off by default in 1.7" warned; exit 0."""
    rc = f"pre-rc-{uuid.uuid4().hex[:6]}"
    await add_node(client, "pre-a", 2, taints=[TAINT])
    await add_node(client, "pre-b", 1, labels={"deviceshare.io/delivery": "cdi"})
    await add_node(client, "pre-plain", 0, shared=False)
    await kubelet_status(client, "pre-a", "containerd://2.4.2", ["", "runc", "nvidia"])
    await kubelet_status(client, "pre-b", "containerd://1.7.20", [])
    async with resource_slice(client, "pre-a", ["GPU-aaa", "GPU-bbb"]), runtime_class(client, rc):
        code, checks, err = await doctor(capsys, reader, "--pre", "--runtime-class-name", rc)
    by_name = {c["name"]: c for c in checks}
    print(json.dumps(checks, indent=1))
    assert (code, err) == (0, "")
    assert list(by_name) == [
        "Kubernetes version",
        "shared nodes",
        "DRA drivers",
        *(
            f"node {n}: {c}"
            for n in ("pre-a", "pre-b")
            for c in ("runtime", "CDI/NRI", "devices", "delivery")
        ),
        "RuntimeClass",
    ]
    assert by_name["Kubernetes version"]["detail"].startswith("v1.37.2 (SDG needs 1.30+")
    assert by_name["DRA drivers"]["detail"] == (
        "devices per node: gpu.nvidia.com -> nvidia.com/gpu: pre-a 2"
    )
    a_runtime = by_name["node pre-a: runtime"]
    assert a_runtime["status"] == "ok"
    assert 'status.runtimeHandlers: "" (default), runc, nvidia' in a_runtime["detail"]
    assert by_name["node pre-b: runtime"]["status"] == "warning"
    assert "a DRA driver publishes devices here" in by_name["node pre-a: CDI/NRI"]["detail"]
    b_cdi = by_name["node pre-b: CDI/NRI"]
    assert b_cdi["status"] == "warning" and "containerd 1.7" in b_cdi["detail"]
    assert "not visible from the API" in b_cdi["detail"]
    a = by_name["node pre-a: delivery"]
    assert a["status"] == "ok" and a["detail"].startswith("runtimeclass ("), a
    b = by_name["node pre-b: delivery"]
    assert b["status"] == "ok" and b["detail"].startswith("cdi ("), b
    assert "nvidia.com/gpu: 2 from ResourceSlice" in by_name["node pre-a: devices"]["detail"]
    assert f"RuntimeClass {rc} (handler nvidia) exists" in by_name["RuntimeClass"]["detail"]
    assert "pre-a" in by_name["RuntimeClass"]["detail"]


@pytest.mark.parametrize("reader", ["admin"], indirect=True)
async def test_pre_without_shared_nodes_warns_and_names_nodes_with_devices(
    cluster: ControlPlane, client: Client, reader: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await add_node(client, "pre-gpu", 1, shared=False)
    await add_node(client, "pre-cpu", 0, shared=False)
    code, checks, _ = await doctor(capsys, reader, "--pre")
    by_name = {c["name"]: c for c in checks}
    assert code == 0
    assert by_name["shared nodes"]["status"] == "warning"
    assert by_name["shared nodes"]["fix"] == (
        "kubectl label node pre-gpu deviceshare.io/mode=shared"
    )
    assert "node pre-gpu: delivery" in by_name and "node pre-cpu: runtime" not in by_name


def leftovers(cp: ControlPlane, namespace: str) -> list[str]:
    groups = cp.http.get(f"/apis/{SDG_KIND.group}/{SDG_KIND.version}/{SDG_KIND.plural}").json()
    pods = cp.http.get(f"/api/v1/namespaces/{namespace}/pods").json()
    names = [g["metadata"]["name"] for g in groups["items"]]
    names += [f"pod/{p['metadata']['name']}" for p in pods["items"]]
    return [n for n in names if PROBE_GROUP_PREFIX in n]


async def test_probe_timeout_is_bounded_and_cleans_up(
    cluster: ControlPlane,
    client: Client,
    kubeconfig: str,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No kubelet runs the pod: the probe stops at --probe-timeout saying what it waited
    for, exits 1, and neither its group nor its pod is left."""
    await add_node(client, "probe-fake", 2, taints=[TAINT])
    async with run_sdg(cluster):
        with anyio.fail_after(60):
            code, checks, _ = await doctor(
                capsys, kubeconfig, "--probe", "-n", namespace, "--probe-timeout", "4"
            )
        assert code == 1
        (check,) = checks
        assert check["name"] == "node probe-fake: probe"
        assert check["status"] == "fail"
        assert check["detail"].startswith("timed out after 4s (--probe-timeout 4) waiting for pod ")
        assert "to run (phase Pending" in check["detail"]
        assert leftovers(cluster, namespace) == []


async def test_probe_names_a_node_that_is_not_shared(
    cluster: ControlPlane, client: Client, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await add_node(client, "probe-shared", 1)
    code, checks, _ = await doctor(capsys, kubeconfig, "--probe", "--probe-node", "nope")
    assert code == 1
    assert checks[0]["detail"] == (
        "nope is not a node labelled deviceshare.io/mode=shared; shared nodes: probe-shared"
    )


async def test_ctrl_c_cleans_up(
    cluster: ControlPlane, client: Client, kubeconfig: str, namespace: str
) -> None:
    """Ctrl-C (SIGINT) of a real ``sdg doctor --probe`` while its pod waits: exit 130,
    and the pod and group are deleted before it exits."""
    await add_node(client, "probe-int", 1, taints=[TAINT])
    async with run_sdg(cluster):
        argv = [sys.executable, "-m", "cli.main", "--kubeconfig", kubeconfig, "doctor"]
        argv += ["--probe", "-n", namespace, "--probe-timeout", "120"]
        proc = await anyio.to_thread.run_sync(
            lambda: subprocess.Popen(
                argv,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
        try:

            async def pod_made() -> bool:
                pods, _ = await client.list_all(PODS, namespace)
                return any(p["metadata"]["name"].startswith(PROBE_GROUP_PREFIX) for p in pods)

            await eventually(pod_made, within=60, interval=0.2, what="the probe's pod")
            assert leftovers(cluster, namespace)
            proc.send_signal(signal.SIGINT)
            out, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, (out, err)
        assert "probing node probe-int" in err
        assert "interrupted: deleting the probe's pod and group sdg-doctor-probe-" in err
        assert leftovers(cluster, namespace) == [], err
