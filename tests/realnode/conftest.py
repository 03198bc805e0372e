"""The real-node tier: a kubelet + containerd + runc node (``sdgruntime.envtest.node``) with
simulated GPUs behind the kubelet's own interfaces (``hack/node``), on a control plane of
its own with kube-scheduler and kube-controller-manager beside the API server.

Where a real node cannot run (not root, no runc, no CNI plugins) every test here is
skipped with the reason; with ``SDG_REAL_NODE=require`` (CI) that is a failure instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.node import Node, preflight
from tests.e2e.harness import ROOT, SHARED, install_policies, install_rbac

NODE = "gpu-node"


def cannot_run(reason: str) -> None:
    if os.environ.get("SDG_REAL_NODE") == "require":
        pytest.fail(f"SDG_REAL_NODE=require, but {reason}")
    pytest.skip(reason)


def require_real_node() -> None:
    """Skip (or, with SDG_REAL_NODE=require, fail) where a real node cannot run."""
    problems = preflight()
    if problems:
        cannot_run("a real node cannot run here: " + "; ".join(problems))


@pytest.fixture(scope="session")
def real_cp() -> Iterator[ControlPlane]:
    """A control plane with kube-scheduler and kube-controller-manager, SDG's CRD, RBAC and
    admission policies: the real node's cluster (apart from the fake-node tests' one)."""
    require_real_node()
    with ControlPlane(
        crd_paths=[ROOT / "config" / "crd"],
        components=("kube-controller-manager", "kube-scheduler"),
    ) as cp:
        install_rbac(cp)
        install_policies(cp)
        yield cp


@pytest.fixture(scope="module")
def node(real_cp: ControlPlane) -> Iterator[Node]:
    """The real node ``gpu-node``, labelled shared; stopped and cleaned after the module."""
    with Node(real_cp, name=NODE, labels=SHARED) as n:
        yield n


@pytest.fixture
async def rclient(real_cp: ControlPlane) -> AsyncIterator[Client]:
    async with Client.from_kubeconfig(str(real_cp.kubeconfig_path)) as c:
        yield c


@pytest.fixture
def rns(real_cp: ControlPlane) -> Iterator[str]:
    """A fresh namespace on the real node's cluster; deleted (for real) afterwards."""
    name = f"r-{uuid.uuid4().hex[:8]}"
    real_cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    real_cp.http.delete(f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": 0})
    real_cp.http.delete(f"/api/v1/namespaces/{name}")


def report_pod(name: str, *, group: str | None = None, **spec: Any) -> dict[str, Any]:
    """A busybox pod whose container prints what it sees (env, then /dev), then waits."""
    meta: dict[str, Any] = {"name": name}
    if group is not None:
        meta["annotations"] = {"deviceshare.io/group": group}
    script = "env | sort; echo '--- /dev'; ls /dev; echo '=== end'; exec sleep 3600"
    container = {
        "name": "c",
        "image": "localhost/envtest/busybox:1",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0, **spec},
    }


class Report:
    """What a ``report_pod`` container printed: its environment and its /dev entries."""

    def __init__(self, log: str) -> None:
        head, _, rest = log.partition("--- /dev\n")
        self.env = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
        self.dev = rest.partition("=== end")[0].split()


async def container_report(
    cp: ControlPlane, client: Client, namespace: str, name: str, within: float = 60.0
) -> Report:
    """Wait until pod ``name`` runs and its container has printed its report (read
    through the API server from the kubelet, as ``kubectl logs`` does)."""
    from sdgruntime.kinds import PODS
    from tests.e2e.harness import eventually

    async def printed() -> str | None:
        p = await client.get(PODS, name, namespace)
        if (p.get("status") or {}).get("phase") != "Running":
            return None
        r = cp.http.get(f"/api/v1/namespaces/{namespace}/pods/{name}/log")
        return r.text if r.status_code == 200 and "=== end" in r.text else None

    return Report(await eventually(printed, within=within, interval=0.3, what=f"{name}'s report"))
