"""``sdg`` against the real API server: what it fetches is what it shows.

The exact rendering is tested in tests/unit/test_cli.py; here the I/O layer reads real
Nodes, groups (status written through the status subresource), claim-record ConfigMaps
and Pods. Other tests share this control plane, so rows are matched by this test's own
unique names, not by whole-table equality.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from api.constants import SDG_KIND
from controllers import cli
from sdgruntime.envtest.controlplane import ControlPlane
from sdgruntime.envtest.fakes import make_node

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"


def ok(r: Any, *codes: int) -> dict[str, Any]:
    assert r.status_code in (codes or (200, 201)), r.text
    return dict(r.json())


@pytest.fixture
def state(control_plane: ControlPlane, namespace: str) -> Iterator[dict[str, str]]:
    """A shared node with 2 GPUs; group G bound to it with both (record + status) and one
    Running pod; a second shared node with nothing on it."""
    api = control_plane.http
    suffix = uuid.uuid4().hex[:8]
    names = {
        "ns": namespace,
        "node": f"cli-gpu-{suffix}",
        "spare": f"cli-spare-{suffix}",
        "group": f"cli-g-{suffix}",
        "pod": "worker",
    }
    for n in (names["node"], names["spare"]):
        obj = make_node(n, labels={"deviceshare.io/mode": "shared"}, allocatable={GPU: 2})
        created = ok(api.post("/api/v1/nodes", json=obj))
        created["status"] = obj["status"]
        ok(api.put(f"/api/v1/nodes/{n}/status", json=created))
    group = ok(
        api.post(
            SDG_KIND.path(),
            json={
                "apiVersion": SDG_KIND.api_version,
                "kind": SDG_KIND.kind,
                "metadata": {"name": names["group"]},
                "spec": {"resources": {GPU: 2}},
            },
        )
    )
    key = f"{namespace}/{names['pod']}"
    group["status"] = {
        "phase": "Bound",
        "nodeName": names["node"],
        "selectedDevices": {GPU: "0,1"},
        "allocatedPods": [key],
        "podCount": 1,
    }
    ok(api.put(SDG_KIND.path(name=names["group"], subresource="status"), json=group))
    ok(
        api.post(
            f"/api/v1/namespaces/{namespace}/configmaps",
            json={
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"sdg-claims.{names['node']}",
                    "labels": {"deviceshare.io/claims": "node"},
                },
                "data": {
                    "node": names["node"],
                    "claims": f'{{"{names["group"]}":{{"{GPU}":"0,1"}}}}',
                },
            },
        )
    )
    pod = ok(
        api.post(
            f"/api/v1/namespaces/{namespace}/pods",
            json={
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": names["pod"],
                    "annotations": {"deviceshare.io/group": names["group"]},
                },
                "spec": {
                    "schedulerName": "deviceshare-scheduler",
                    "nodeName": names["node"],
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}],
                        }
                    ],
                },
            },
        )
    )
    pod["status"] = {"phase": "Running"}
    ok(api.put(f"/api/v1/namespaces/{namespace}/pods/{names['pod']}/status", json=pod))
    yield names
    api.delete(SDG_KIND.path(name=names["group"]))
    for n in (names["node"], names["spare"]):
        api.delete(f"/api/v1/nodes/{n}")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def rows(text: str, node: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.startswith(node + " ")]


def test_devices_shows_the_group_on_its_devices_and_the_free_node(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "--kubeconfig", kubeconfig, "devices", "--claims-namespace", state["ns"]
    )
    assert (code, err) == (0, "")
    assert out.splitlines()[0].split() == ["NODE", "RESOURCE", "ID", "GROUP", "STATE", "PODS"]
    key = f"{state['ns']}/{state['pod']}"
    assert rows(out, state["node"]) == [
        [state["node"], GPU, "0", state["group"], "held", key],
        [state["node"], GPU, "1", state["group"], "held", key],
    ]
    assert rows(out, state["spare"]) == [
        [state["spare"], GPU, "0", "-", "free", "-"],
        [state["spare"], GPU, "1", "-", "free", "-"],
    ]


def test_devices_without_the_records_namespace_shows_status_only(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pointed at a namespace without records, the map still shows the group (from its
    status) and says the record is missing: the cross-check is real, not assumed."""
    code, out, _ = run(
        capsys, "--kubeconfig", kubeconfig, "devices", "--claims-namespace", "default"
    )
    assert code == 0
    assert [r[4] for r in rows(out, state["node"])] == ["status-only", "status-only"]
    assert f"group {state['group']}: Bound on {state['node']} ({GPU} 0,1), but no claim record" in (
        out
    )


def test_explain_group_and_pod(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = ["--claims-namespace", state["ns"]]
    code, out, _ = run(capsys, "--kubeconfig", kubeconfig, *ns, "explain", state["group"])
    assert code == 0
    assert f"\nBound to node {state['node']} with {GPU} 0,1; 1 pod(s) use it.\n" in out
    assert [f"{state['ns']}/{state['pod']}", "Running", state["node"]] in [
        line.split() for line in out.splitlines()
    ]
    assert "Problems:" not in out

    code, out, _ = run(
        capsys, "--kubeconfig", kubeconfig, "explain", f"pod/{state['pod']}", "-n", state["ns"]
    )
    assert code == 0
    assert (
        f"\nRunning on {state['node']}, the node of group {state['group']}, with {GPU} 0,1.\n"
        in out
    )
    assert ["cuda", "NVIDIA_VISIBLE_DEVICES", "0,1"] in [line.split() for line in out.splitlines()]


def test_explain_what_does_not_exist_fails_clearly(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--kubeconfig", kubeconfig, "explain", "sdg/no-such-group")
    assert (code, out) == (1, "")
    assert err.startswith('error: SharedDeviceGroup "no-such-group" not found; groups: ')
    code, _, err = run(capsys, "--kubeconfig", kubeconfig, "explain", "pod/nope", "-n", state["ns"])
    assert code == 1
    assert err == f'error: pod "nope" not found in namespace {state["ns"]}\n'
