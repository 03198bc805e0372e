"""sdgruntime.envtest.node: a real kubelet v1.37.2 and containerd v2.4.2 register a Ready
node with the local API server; a pod's container really runs and its output is read
through the API server (``kubectl logs``); the controller-manager's Deployment controller
makes a Deployment's pods and kube-scheduler binds them. (test_node_crash.py: a killed
harness leaves nothing behind.)

Where a real node cannot run (not root, no runc, no CNI plugins) these are skipped with
the reason; with ``SDG_REAL_NODE=require`` (CI) that is a failure instead."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.adminhttp import AdminHTTP
from sdgruntime.envtest.images import BUSYBOX_IMAGE
from sdgruntime.envtest.node import Node, preflight

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def require_real_node() -> None:
    problems = preflight()
    if not problems:
        return
    reason = "a real node cannot run here: " + "; ".join(problems)
    if os.environ.get("SDG_REAL_NODE") == "require":
        pytest.fail(f"SDG_REAL_NODE=require, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def worker() -> Iterator[tuple[ControlPlane, Node]]:
    require_real_node()
    with (
        ControlPlane(components=("kube-controller-manager", "kube-scheduler")) as cp,
        Node(cp, name="worker-1") as node,
    ):
        yield cp, node


def busybox_pod(name: str, script: str, **meta: Any) -> dict[str, Any]:
    container = {
        "name": "c",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
    }


def wait_for(cond: Any, what: str, within: float = 90.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out after {within}s waiting for {what}")


def printed(http: AdminHTTP, name: str, until: str = "=== end") -> str:
    """Pod ``name``'s log once it holds ``until``: read through the API server from the
    kubelet, as kubectl logs does."""

    def log() -> str | None:
        r = http.get(f"/api/v1/namespaces/default/pods/{name}/log")
        return r.text if r.status_code == 200 and until in r.text else None

    return str(wait_for(log, f"{name}'s output"))


def test_the_node_is_a_real_kubelet_on_containerd(worker: tuple[ControlPlane, Node]) -> None:
    _, node = worker
    status = node.node()["status"]
    assert status["nodeInfo"]["kubeletVersion"] == "v1.37.2"
    assert status["nodeInfo"]["containerRuntimeVersion"] == "containerd://2.4.2"
    addresses = {a["type"]: a["address"] for a in status["addresses"]}
    assert addresses.get("InternalIP") and addresses["InternalIP"] != "127.0.0.1"


def test_a_pod_runs_and_its_output_is_read_through_the_api_server(
    worker: tuple[ControlPlane, Node],
) -> None:
    cp, node = worker
    pod = busybox_pod(
        "hello", 'echo "GREETING=$GREETING HOST=$(hostname)"; ls /dev; echo "=== end"'
    )
    pod["spec"]["containers"][0]["env"] = [{"name": "GREETING", "value": "hi"}]
    assert cp.http.post("/api/v1/namespaces/default/pods", json=pod).status_code == 201
    out = printed(cp.http, "hello")
    assert "GREETING=hi HOST=hello" in out  # its env, and its own UTS namespace
    assert "null" in out.split()
    got = cp.http.get("/api/v1/namespaces/default/pods/hello").json()
    assert got["spec"]["nodeName"] == node.name  # bound by kube-scheduler

    def pod_ip() -> str | None:  # the kubelet's status update may land after the log
        status = cp.http.get("/api/v1/namespaces/default/pods/hello").json()["status"]
        return status.get("podIP")

    assert str(wait_for(pod_ip, "hello's podIP")).startswith("10.244.0.")


def test_a_deployment_makes_its_pods_on_the_node(worker: tuple[ControlPlane, Node]) -> None:
    cp, node = worker
    spec = busybox_pod("unused", 'echo "I am $(hostname)"; exec sleep 3600')["spec"]
    cp.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec},
            },
        }
    )

    def running() -> list[str] | None:
        pods = cp.http.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dweb").json()
        names = [
            p["metadata"]["name"]
            for p in pods["items"]
            if p["status"].get("phase") == "Running" and p["spec"]["nodeName"] == node.name
        ]
        return names if len(names) == 2 else None

    for name in wait_for(running, "2 Running pods of Deployment web"):
        assert name.startswith("web-")  # named by its ReplicaSet
        assert f"I am {name}" in printed(cp.http, name, until="I am")
